// The run report (cli/report.h): the step log parser's bounds, torn writes and restarts, and the
// HTML renderer's plots, escaping and markers. The fixture tests/data/steps.jsonl is written by
// tests/data/make_steps_jsonl.py, whose docstring tells its story; expected values here come from
// that story or from reading the fixture with nlohmann directly, not from the parser.
#include "cli/report.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "api/error.h"

namespace kt::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fixture_path() {
  return std::string(KT_SOURCE_DIR) + "/tests/data/steps.jsonl";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A start record as the worker writes it; `extra` overrides fields.
std::string start_line(const json& extra = json::object()) {
  json j = {{"kind", "start"},
            {"time", 1000.0},
            {"resumed_from", 0},
            {"total_steps", 10},
            {"plan_hash", "0123456789abcdef"},
            {"tp", 2},
            {"dp", 1},
            {"recompute", "none"},
            {"offload", "none"},
            {"precision", "fp32"},
            {"device", "cpu"},
            {"predicted_step_seconds", 0.5},
            {"predicted_tokens_per_second", 1000.0},
            {"predicted_phase_seconds", {{"compute", 0.4}, {"tp_comm_total", 0.1}}},
            {"loss_floor", 2.5}};
  j.update(extra);
  return j.dump() + "\n";
}

std::string step_line(int64_t step, double loss, const json& extra = json::object()) {
  json j = {{"kind", "step"}, {"time", 1000.0 + static_cast<double>(step)},
            {"step", step},   {"loss", loss},
            {"seconds", 0.5}, {"tokens_per_second", 900.0},
            {"mfu", 0.1},     {"phase_seconds", {{"compute", 0.45}, {"tp_comm_total", 0.05}}}};
  j.update(extra);
  return j.dump() + "\n";
}

std::string error_of(const std::string& text) {
  try {
    parse_steps_log(text, "run/steps.jsonl");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- the parser ------------------------------------------------------------------------------

TEST(StepsLog, Fixture_HasBothStarts_EveryStep_TheCheckpoints_AndTheEnd) {
  const RunRecords r = load_steps_log(fixture_path());
  ASSERT_EQ(r.starts.size(), 2u);
  EXPECT_EQ(r.starts[0].resumed_from, 0);
  EXPECT_EQ(r.starts[1].resumed_from, 50);
  EXPECT_EQ(r.starts[1].line, 120u);  // after the torn step 117 on the same line
  EXPECT_EQ(r.starts[0].plan_hash, "9f3c2a71d04be5c8");
  EXPECT_EQ(r.starts[0].tp, 1);
  EXPECT_EQ(r.starts[0].dp, 2);
  EXPECT_DOUBLE_EQ(*r.starts[0].loss_floor, 3.1416);
  EXPECT_EQ(r.steps.size(), 116u + 150u);  // steps 1-116, then 51-200 again
  ASSERT_EQ(r.checkpoints.size(), 5u);     // 50, 100 (ENOSPC), then 100, 150, 200
  EXPECT_FALSE(r.checkpoints[1].ok);
  EXPECT_EQ(r.checkpoints[1].reason, "ENOSPC");
  EXPECT_EQ(r.checkpoints[1].step, 100);
  ASSERT_EQ(r.ends.size(), 1u);
  EXPECT_EQ(r.ends[0].how, "finished");
  EXPECT_EQ(r.ends[0].attempt, 1u);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("steps.jsonl:120: a torn write followed by a complete record"),
            std::string::npos)
      << r.warnings[0];
  // The plan's phase order, whatever order the JSON keys came in.
  ASSERT_GE(r.phases.size(), 3u);
  EXPECT_EQ(r.phases[0], "compute");
  EXPECT_EQ(r.phases[1], "tp_comm_total");
}

TEST(StepsLog, TornLastLine_IsSkippedWithAWarning) {
  const std::string torn = step_line(2, 4.0).substr(0, 30);  // no newline
  const RunRecords r = parse_steps_log(start_line() + step_line(1, 5.0) + torn, "s.jsonl");
  EXPECT_EQ(r.steps.size(), 1u);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("s.jsonl:3: the last line is cut short"), std::string::npos)
      << r.warnings[0];
}

TEST(StepsLog, LastLineWithoutNewline_ThatIsWhole_IsKept) {
  std::string last = step_line(2, 4.0);
  last.pop_back();
  const RunRecords r = parse_steps_log(start_line() + last, "s.jsonl");
  EXPECT_EQ(r.steps.size(), 1u);
  EXPECT_TRUE(r.warnings.empty());
}

TEST(StepsLog, MalformedLine_InTheMiddle_OrEndedByANewline_IsRejectedNamingFileAndLine) {
  EXPECT_NE(error_of(start_line() + "{\"kind\": \"step\", oops}\n" + step_line(1, 5))
                .find("run/steps.jsonl:2: malformed JSON"),
            std::string::npos);
  // A newline after it: the write completed, so this is not a torn write.
  EXPECT_NE(error_of(start_line() + "{\"kind\":\"st\n").find("run/steps.jsonl:2: malformed JSON"),
            std::string::npos);
  EXPECT_NE(error_of(start_line() + "[1, 2]\n")
                .find("run/steps.jsonl:2: a record must be a JSON "
                      "object"),
            std::string::npos);
  EXPECT_NE(error_of(start_line() + "{\"time\": 1}\n")
                .find("run/steps.jsonl:2: a record without "
                      "\"kind\""),
            std::string::npos);
}

TEST(StepsLog, BadFields_NameTheLineTheKindAndTheField) {
  json no_loss = json::parse(step_line(1, 5));
  no_loss.erase("loss");
  EXPECT_EQ(error_of(start_line() + no_loss.dump() + "\n"),
            "run/steps.jsonl:2: a \"step\" record without \"loss\"");
  EXPECT_EQ(error_of(start_line() + step_line(1, 5, {{"loss", "low"}})),
            "run/steps.jsonl:2: \"step\" record's loss is \"low\", not a number");
  EXPECT_EQ(error_of(start_line() + step_line(1, 5, {{"step", 1.5}})),
            "run/steps.jsonl:2: \"step\" record's step is 1.5, not an integer");
  EXPECT_EQ(error_of(start_line() + step_line(-3, 5)),
            "run/steps.jsonl:2: \"step\" record's step -3 is out of range [0, 1000000000000]");
  EXPECT_EQ(error_of(start_line({{"tp", 0}})),
            "run/steps.jsonl:1: \"start\" record's tp 0 is out of range [1, 1048576]");
  EXPECT_EQ(error_of(start_line() + step_line(1, 1e16)),
            "run/steps.jsonl:2: \"step\" record's loss 1e+16 is out of range (at most ±1e15)");
  EXPECT_EQ(error_of(start_line({{"time", nullptr}})),
            "run/steps.jsonl:1: \"start\" record's time is null, not a number");
  EXPECT_EQ(error_of(start_line({{"predicted_phase_seconds", {{"compute", "fast"}}}})),
            "run/steps.jsonl:1: \"start\" record's predicted_phase_seconds.compute is \"fast\", "
            "not a number");
  EXPECT_EQ(
      error_of(start_line({{"device", std::string(300, 'x')}})),
      "run/steps.jsonl:1: \"start\" record's device is 300 bytes long, over the bound of 256");
}

TEST(StepsLog, ARecordBeforeTheFirstStart_IsRejected) {
  EXPECT_EQ(error_of(step_line(1, 5) + start_line()),
            "run/steps.jsonl:1: a \"step\" record before the first \"start\" record");
}

TEST(StepsLog, Nulls_AreValuesTheWriterDidNotHave) {
  const RunRecords r = parse_steps_log(
      start_line({{"loss_floor", nullptr}, {"predicted_step_seconds", nullptr}}) +
          step_line(1, 0, {{"loss", nullptr}, {"phase_seconds", {{"compute", nullptr}}}}),
      "s");
  EXPECT_FALSE(r.starts[0].loss_floor);
  EXPECT_FALSE(r.starts[0].predicted_step_seconds);
  EXPECT_FALSE(r.steps[0].loss);
  EXPECT_TRUE(std::isnan(r.steps[0].phase_seconds[0]));
  EXPECT_DOUBLE_EQ(*r.steps[0].seconds, 0.5);
}

TEST(StepsLog, UnknownKinds_AreSkippedWithAWarning_EmptyLinesAndCRLF_Ignored) {
  const RunRecords r = parse_steps_log(
      start_line() + "\n  \n{\"kind\":\"profile\",\"x\":1}\r\n" + step_line(1, 5), "s");
  EXPECT_EQ(r.steps.size(), 1u);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.warnings[0], "s:4: a record of unknown kind \"profile\"; skipped");
}

TEST(StepsLog, Bounds_LineLength_LineCount_PhaseNames_FileSize) {
  // A line over 16 KiB.
  const std::string long_line =
      step_line(1, 5, {{"phase_seconds", {{std::string(kMaxStepsTextBytes, 'p'), 1.0}}}});
  std::string over(long_line);
  over.insert(over.size() - 2, std::string(kMaxStepsLineBytes, ' '));
  EXPECT_EQ(error_of(start_line() + over), "run/steps.jsonl:2: a line of " +
                                               std::to_string(over.size() - 1) +
                                               " bytes, over the bound of 16384");
  // One line more than the bound (empty lines count: they are lines of the file).
  EXPECT_EQ(error_of(start_line() + std::string(kMaxStepsLines, '\n')),
            "run/steps.jsonl: more than 1000000 lines, the bound of a step log");
  EXPECT_NO_THROW(parse_steps_log(start_line() + std::string(kMaxStepsLines - 1, '\n'), "s"));
  // 33 phase names.
  json phases = json::object();
  for (int i = 0; i < 33; ++i) phases["phase" + std::to_string(i)] = 0.1;
  EXPECT_NE(error_of(start_line({{"predicted_phase_seconds", phases}}))
                .find("more than 32 phase names in the file"),
            std::string::npos);
  // A file over 256 MiB is refused before it is read (a sparse file: nothing is written).
  const fs::path big = fs::temp_directory_path() / ("kt-report-big-" + std::to_string(::getpid()));
  {
    const int fd = ::open(big.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(kMaxStepsFileBytes) + 1), 0);
    ::close(fd);
  }
  try {
    load_steps_log(big.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              big.string() + ": 268435457 bytes, over the bound of " + "268435456 for a step log");
  }
  fs::remove(big);
  EXPECT_THROW(load_steps_log("/nonexistent/steps.jsonl"), Error);
}

TEST(StepsLog, LatestSteps_ARestartReplacesEverythingAfterWhereItResumed) {
  // The first process reached step 10; the restart resumed from 5 and got to 7.
  std::string text = start_line();
  for (int s = 1; s <= 10; ++s) text += step_line(s, 10.0 - s);
  text += start_line({{"resumed_from", 5}, {"time", 2000.0}});
  for (int s = 6; s <= 7; ++s) text += step_line(s, 100.0 + s);
  const RunRecords r = parse_steps_log(text, "s");
  const std::vector<const StepRecord*> latest = latest_steps(r);
  ASSERT_EQ(latest.size(), 7u);  // 8-10 of the first process were rolled back
  for (int s = 1; s <= 5; ++s) {
    EXPECT_EQ(latest[s - 1]->step, s);
    EXPECT_EQ(latest[s - 1]->attempt, 0u);
  }
  EXPECT_EQ(latest[5]->attempt, 1u);
  EXPECT_DOUBLE_EQ(*latest[5]->loss, 106.0);
  EXPECT_DOUBLE_EQ(*latest[6]->loss, 107.0);
}

TEST(StepsLog, LatestSteps_OfTheFixture_AreSteps1To200_TheRestartsFrom51) {
  const RunRecords r = load_steps_log(fixture_path());
  const std::vector<const StepRecord*> latest = latest_steps(r);
  ASSERT_EQ(latest.size(), 200u);
  for (size_t i = 0; i < latest.size(); ++i) {
    EXPECT_EQ(latest[i]->step, static_cast<int64_t>(i + 1));
    EXPECT_EQ(latest[i]->attempt, i < 50 ? 0u : 1u) << "step " << i + 1;
  }
}

// ---- the renderer ----------------------------------------------------------------------------

// The fixture's step records read with nlohmann, line by line (the torn line skipped by hand),
// the restart's replacing the first process's from step 51 on.
std::vector<json> fixture_latest_steps() {
  std::ifstream in(fixture_path());
  std::string line;
  std::vector<json> by_step(201);
  while (std::getline(in, line)) {
    const size_t at = line.rfind("{\"kind\":\"start\"");  // the restart after the torn bytes
    const json j = json::parse(at != std::string::npos ? line.substr(at) : line);
    if (j["kind"] == "step") by_step[j["step"].get<size_t>()] = j;
  }
  return {by_step.begin() + 1, by_step.end()};
}

std::string ms(double seconds) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.4g ms", seconds * 1e3);
  return buf;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

TEST(RunReport, Fixture_HasFourPlots_TheHeaderTable_AndNoScriptOrExternalReference) {
  const std::string html = render_report(load_steps_log(fixture_path()), {"default/tiny"});
  EXPECT_EQ(count(html, "<svg"), 4u);
  for (const char* id : {"loss-plot", "tokens-plot", "phases-plot", "timeline-plot"})
    EXPECT_EQ(count(html, std::string("<svg id=\"") + id + "\""), 1u) << id;
  for (const char* external : {"<script", "<link", "<img", "src=", "href=", "url(", "@import"})
    EXPECT_EQ(html.find(external), std::string::npos) << external;
  EXPECT_NE(html.find("<th scope=\"row\">job</th><td>default/tiny</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>9f3c2a71d04be5c8</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>TP 1 × DP 2</td>"), std::string::npos);
  EXPECT_NE(html.find("<th scope=\"row\">steps</th><td>200 of 200</td>"), std::string::npos);
  EXPECT_NE(html.find("<th scope=\"row\">restarts</th><td>1</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>4 saved, 1 failed</td>"), std::string::npos);
  char final_loss[64];
  std::snprintf(final_loss, sizeof(final_loss), "<th scope=\"row\">final loss</th><td>%.4f</td>",
                fixture_latest_steps().back()["loss"].get<double>());
  EXPECT_NE(html.find(final_loss), std::string::npos) << final_loss;
  EXPECT_NE(html.find("a torn write followed by a complete record"), std::string::npos);
  // Axis titles with units.
  for (const char* label : {">loss (nats)<", ">tokens/s<", ">milliseconds per step<", ">step<",
                            ">wall time since the first start (s)<"})
    EXPECT_NE(html.find(label), std::string::npos) << label;
}

TEST(RunReport, PhaseBreakdown_IsTheMedianOfTheLatestSteps_NextToThePrediction) {
  const std::string html = render_report(load_steps_log(fixture_path()), {"tiny"});
  std::vector<double> compute, dp_total;
  for (const json& s : fixture_latest_steps()) {
    compute.push_back(s["phase_seconds"]["compute"].get<double>());
    dp_total.push_back(s["phase_seconds"]["dp_comm_total"].get<double>());
  }
  EXPECT_NE(html.find("<th scope=\"row\">compute</th><td>" + ms(median_of(compute)) + "</td><td>" +
                      ms(0.0171) + "</td>"),
            std::string::npos)
      << ms(median_of(compute));
  EXPECT_NE(html.find("<th scope=\"row\">dp_comm_total</th><td>" + ms(median_of(dp_total)) +
                      "</td><td>" + ms(0.0052) + "</td>"),
            std::string::npos);
  // Zero both measured and predicted: named in the note, not drawn.
  EXPECT_NE(html.find("not drawn: tp_comm_total tp_comm_exposed transfer_total transfer_exposed "
                      "optimizer_cpu_total optimizer_cpu_exposed."),
            std::string::npos);
  EXPECT_EQ(html.find("<th scope=\"row\">tp_comm_total</th>"), std::string::npos);
}

TEST(RunReport, FloorLine_DrawnWhenTheLossFloorIsKnown_AbsentWhenNull) {
  const std::string text = start_line() + step_line(1, 5) + step_line(2, 4);
  const std::string with = render_report(parse_steps_log(text, "s"), {});
  EXPECT_EQ(count(with, "<g class=\"floor\">"), 1u);
  EXPECT_NE(with.find("<title>entropy floor 2.5000 nats</title>"), std::string::npos);
  const std::string without = render_report(
      parse_steps_log(start_line({{"loss_floor", nullptr}}) + step_line(1, 5), "s"), {});
  EXPECT_EQ(without.find("class=\"floor\""), std::string::npos);
  EXPECT_NE(without.find("<td>not known</td>"), std::string::npos);
}

TEST(RunReport, RestartsAndCheckpoints_AreMarkedOnTheStepAndTimeAxes) {
  const std::string html = render_report(load_steps_log(fixture_path()), {});
  // One restart: a marker on the loss and tokens/s plots' step axes and one on the timeline.
  EXPECT_EQ(count(html, "<g class=\"restart\">"), 3u);
  EXPECT_NE(html.find("<title>restart 1: resumed from step 50</title>"), std::string::npos);
  // Five checkpoint events, drawn on the loss plot and the timeline.
  EXPECT_EQ(count(html, "<g class=\"checkpoint\">"), 2u * 4u);
  EXPECT_EQ(count(html, "<g class=\"checkpoint-failed\">"), 2u);
  EXPECT_NE(html.find("<title>checkpoint at step 100 failed: ENOSPC</title>"), std::string::npos);
  EXPECT_EQ(count(html, "<g class=\"end\">"), 1u);
  EXPECT_NE(html.find("<td>written in 310 ms</td>"), std::string::npos);  // checkpoint 50
  // The prediction, 8 × 64 tokens in 21.4 ms.
  EXPECT_NE(html.find("<title>predicted 23.9k tokens/s</title>"), std::string::npos);
}

TEST(RunReport, AllTextFromTheLog_IsEscaped) {
  const std::string evil = "<script>alert('x')</script>&\"";
  const std::string html = render_report(
      parse_steps_log(
          start_line({{"plan_hash", evil}, {"device", evil}}) + step_line(1, 5) +
              json({{"kind", "checkpoint_failed"}, {"time", 1002.0}, {"step", 1}, {"reason", evil}})
                  .dump() +
              "\n" + "{\"kind\":\"<b>new</b>\"}\n",
          "dir/<evil>.jsonl"),
      {evil});
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<b>"), std::string::npos);
  EXPECT_EQ(html.find("<evil>"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"),
            std::string::npos);
  EXPECT_NE(html.find("dir/&lt;evil&gt;.jsonl"), std::string::npos);
  EXPECT_NE(html.find("&lt;b&gt;new&lt;/b&gt;"), std::string::npos);  // the warning
  // Control characters (a JSON \u0001) do not reach the page.
  const std::string ctl =
      render_report(parse_steps_log(start_line({{"device", "a\u0001b"}}), "s"), {});
  EXPECT_EQ(ctl.find('\x01'), std::string::npos);
  EXPECT_NE(ctl.find("a\xEF\xBF\xBD"
                     "b"),
            std::string::npos);
}

TEST(RunReport, NoSteps_FourPlotsThatSaySo_NoStart_AnError) {
  const std::string html = render_report(parse_steps_log(start_line(), "s"), {});
  EXPECT_EQ(count(html, "<svg"), 4u);
  EXPECT_NE(html.find(">no loss recorded<"), std::string::npos);
  // The prediction is known without steps: its line is drawn.
  EXPECT_NE(html.find("<title>predicted 1000 tokens/s</title>"), std::string::npos);
  // So is the predicted step time by phase, beside "not measured".
  EXPECT_NE(html.find(">not measured<"), std::string::npos);
  EXPECT_THROW(render_report(parse_steps_log("", "s"), {}), Error);
}

TEST(RunReport, ExtremeValues_GiveFiniteCoordinates) {
  std::string text = start_line({{"predicted_tokens_per_second", 1e15}, {"loss_floor", -1e15}});
  text += step_line(0, 1e15, {{"tokens_per_second", 0.0}, {"time", -1e15}});
  text += step_line(kMaxStepNumber, -1e15, {{"seconds", 1e15}, {"time", 1e15}});
  text += step_line(3, 7, {{"seconds", nullptr}, {"tokens_per_second", nullptr}});
  const std::string html = render_report(parse_steps_log(text, "s"), {});
  for (const char* bad : {"=\"nan", "=\"-nan", "=\"inf", "=\"-inf", "nan,", "inf,"})
    EXPECT_EQ(html.find(bad), std::string::npos) << bad;
  EXPECT_EQ(count(html, "<svg"), 4u);
}

TEST(RunReport, WriteReport_FindsTheLogOfAWorkDirectory_AndWritesTheFile) {
  const fs::path dir = fs::temp_directory_path() / ("kt-report-" + std::to_string(::getpid()));
  fs::create_directories(dir / "checkpoints");
  fs::copy_file(fixture_path(), dir / "checkpoints" / "steps.jsonl",
                fs::copy_options::overwrite_existing);
  EXPECT_EQ(find_steps_log(dir.string()), (dir / "checkpoints" / "steps.jsonl").string());
  EXPECT_EQ(find_steps_log((dir / "checkpoints").string()),
            (dir / "checkpoints" / "steps.jsonl").string());
  const std::vector<std::string> warnings = write_report(
      find_steps_log(dir.string()), (dir / "report.html").string(), ReportOptions{"tiny"});
  EXPECT_EQ(warnings.size(), 1u);
  EXPECT_EQ(count(read_text((dir / "report.html").string()), "<svg"), 4u);
  EXPECT_FALSE(fs::exists(dir / "report.html.tmp"));
  try {
    find_steps_log((dir / "pods").string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), (dir / "pods").string() + ": no such file or directory");
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kt::cli

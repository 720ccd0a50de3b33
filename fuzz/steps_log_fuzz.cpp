// libFuzzer harness: the rank-0 worker's step log, steps.jsonl (cli/report.h), which the run
// report reads from a checkpoint volume any process of the job can write. Any input must parse
// or be refused with kt::Error; a parsed log must render to one HTML page with the four plots,
// finite SVG numbers and nothing of the input unescaped; what `plan --refit` takes from it must
// be finite medians of the log's phases, or a refusal naming the file.
//   fuzz/run.sh steps_log 60
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/error.h"
#include "cli/report.h"
#include "fuzz/fuzz_check.h"

namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = kt::fuzz::as_text(data, size);
  kt::cli::RunRecords records;
  try {
    records = kt::cli::parse_steps_log(text, "steps.jsonl");
  } catch (const kt::Error& e) {
    const std::string what = e.what();
    FUZZ_CHECK(what.rfind("steps.jsonl", 0) == 0, "an error that does not name the file: " + what);
    return 0;
  }
  FUZZ_CHECK(records.phases.size() <= kt::cli::kMaxPhases, std::to_string(records.phases.size()));
  for (const auto& s : records.steps)
    FUZZ_CHECK(s.attempt < records.starts.size(), "a step of no start");
  const auto latest = kt::cli::latest_steps(records);
  for (size_t i = 1; i < latest.size(); ++i)
    FUZZ_CHECK(latest[i - 1]->step < latest[i]->step, "latest_steps not strictly by step");
  // What `kubetrain plan --refit` reads from it: refused naming the file, or finite medians of
  // phases the log has.
  try {
    const kt::cli::RunPhases phases = kt::cli::run_phases(records);
    FUZZ_CHECK(phases.steps >= 1, "phases of no step");
    for (const auto& [name, seconds] : phases.measured) {
      FUZZ_CHECK(std::isfinite(seconds), "a non-finite median of " + name);
      FUZZ_CHECK(std::find(records.phases.begin(), records.phases.end(), name) !=
                     records.phases.end(),
                 "a phase the log does not have: " + name);
    }
  } catch (const kt::Error& e) {
    const std::string what = e.what();
    FUZZ_CHECK(what.rfind("steps.jsonl", 0) == 0, "a refit error that does not name the file: " + what);
  }
  if (records.starts.empty()) return 0;

  const std::string html = kt::cli::render_report(records, {"job <&>\"'"});
  FUZZ_CHECK(count(html, "<svg") == 4, html.substr(0, 2000));
  FUZZ_CHECK(count(html, "</svg>") == 4, html.substr(0, 2000));
  FUZZ_CHECK(html.find("<script") == std::string::npos, "a script element");
  FUZZ_CHECK(html.find("job <&>") == std::string::npos, "the job's name unescaped");
  for (const char* bad : {"=\"nan", "=\"-nan", "=\"inf", "=\"-inf"})
    FUZZ_CHECK(html.find(bad) == std::string::npos, std::string("a non-finite number: ") + bad);
  // Every '<' of the page opens one of the renderer's own elements: the input's are escaped.
  for (size_t at = html.find('<'); at != std::string::npos; at = html.find('<', at + 1)) {
    const char next = at + 1 < html.size() ? html[at + 1] : '\0';
    FUZZ_CHECK((next >= 'a' && next <= 'z') || next == '/' || next == '!',
               "a stray '<' at " + std::to_string(at) + ": " + html.substr(at, 80));
  }
  return 0;
}

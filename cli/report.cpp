#include "cli/report.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>

#include "api/error.h"
#include "api/plan.h"
#include "api/yaml_json.h"

namespace kt::cli {

namespace fs = std::filesystem;
using api::Json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();


std::string format(const char* pattern, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* pattern, ...) {
  char buf[256];
  va_list args;
  va_start(args, pattern);
  const int n = std::vsnprintf(buf, sizeof(buf), pattern, args);
  va_end(args);
  return n < 0 ? std::string() : std::string(buf, std::min<size_t>(n, sizeof(buf) - 1));
}

// ---- parsing ---------------------------------------------------------------------------------

// One line's record: field access with messages that name the file, the line, the record's kind
// and the field.
class LineReader {
 public:
  LineReader(RunRecords& out, size_t line, const Json& record)
      : out_(out), line_(line), record_(record) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(out_.source + ":" + std::to_string(line_) + ": " + what);
  }

  std::string kind() const {
    const auto it = record_.find("kind");
    if (it == record_.end()) fail("a record without \"kind\"");
    if (!it->is_string()) fail("\"kind\" is " + show(*it) + ", not a string");
    return it->get<std::string>();
  }

  void set_kind(std::string kind) { kind_ = std::move(kind); }

  // A number that must be there.
  double number(const char* name) const {
    const std::optional<double> v = optional_number(name);
    if (!v) fail(where(name) + " is null, not a number");
    return *v;
  }

  // A number, or null where the writer had no finite value. Absent only when `may_be_absent`.
  std::optional<double> optional_number(const char* name, bool may_be_absent = false) const {
    const Json* v = find(name, may_be_absent);
    if (!v || v->is_null()) return std::nullopt;
    return checked_number(*v, where(name));
  }

  int64_t integer(const char* name, int64_t min, int64_t max) const {
    const Json& v = *find(name, false);
    if (!v.is_number_integer()) fail(where(name) + " is " + show(v) + ", not an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max))
      fail(where(name) + " " + show(v) + " is out of range");
    const int64_t i = v.get<int64_t>();
    if (i < min || i > max)
      fail(where(name) + " " + show(v) + " is out of range [" + std::to_string(min) + ", " +
           std::to_string(max) + "]");
    return i;
  }

  // An integer that writers before it existed left out: `absent` then.
  int64_t integer_or(const char* name, int64_t min, int64_t max, int64_t absent) const {
    return find(name, true) ? integer(name, min, max) : absent;
  }

  bool flag_or(const char* name, bool absent) const {
    const Json* v = find(name, true);
    if (!v) return absent;
    if (!v->is_boolean()) fail(where(name) + " is " + show(*v) + ", not true or false");
    return v->get<bool>();
  }

  std::string text(const char* name) const {
    const Json& v = *find(name, false);
    if (!v.is_string()) fail(where(name) + " is " + show(v) + ", not a string");
    std::string s = v.get<std::string>();
    if (s.size() > kMaxStepsTextBytes)
      fail(where(name) + " is " + std::to_string(s.size()) + " bytes long, over the bound of " +
           std::to_string(kMaxStepsTextBytes));
    return s;
  }

  // An object of phase name -> seconds (or null); absent: none.
  PhaseSeconds phases(const char* name) const {
    PhaseSeconds out;
    const Json* v = find(name, true);
    if (!v || v->is_null()) return out;
    if (!v->is_object()) fail(where(name) + " is " + show(*v) + ", not an object");
    for (const auto& [phase, seconds] : v->items()) {
      const std::string path = where(name) + "." + phase;
      if (phase.empty() || phase.size() > kMaxStepsTextBytes) fail(path + ": a bad phase name");
      const size_t index = phase_index(phase, path);
      if (out.size() <= index) out.resize(index + 1, kNaN);
      if (!seconds.is_null()) out[index] = checked_number(seconds, path);
    }
    return out;
  }

 private:
  const Json* find(const char* name, bool may_be_absent) const {
    const auto it = record_.find(name);
    if (it != record_.end()) return &*it;
    if (!may_be_absent) fail("a \"" + kind_ + "\" record without \"" + name + "\"");
    return nullptr;
  }

  double checked_number(const Json& v, const std::string& path) const {
    if (!v.is_number()) fail(path + " is " + show(v) + ", not a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || std::fabs(x) > kMaxStepsNumber)
      fail(path + " " + show(v) + " is out of range (at most ±1e15)");
    return x;
  }

  size_t phase_index(const std::string& phase, const std::string& path) const {
    const auto it = std::find(out_.phases.begin(), out_.phases.end(), phase);
    if (it != out_.phases.end()) return static_cast<size_t>(it - out_.phases.begin());
    if (out_.phases.size() >= kMaxPhases)
      fail(path + ": more than " + std::to_string(kMaxPhases) + " phase names in the file");
    out_.phases.push_back(phase);
    return out_.phases.size() - 1;
  }

  std::string where(const char* name) const { return "\"" + kind_ + "\" record's " + name; }

  static std::string show(const Json& v) {
    std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
  }

  RunRecords& out_;
  const size_t line_;
  const Json& record_;
  std::string kind_;
};

// Puts the phases in the plan's order (known names first, then the others as they came) and
// renumbers every record's seconds.
void order_phases(RunRecords& r) {
  auto rank = [](const std::string& name) {  // api::kTimePhases' order; other names follow
    const auto it = std::find_if(api::kTimePhases.begin(), api::kTimePhases.end(),
                                 [&](const api::TimePhase& p) { return name == p.name; });
    return static_cast<size_t>(it - api::kTimePhases.begin());
  };
  std::vector<size_t> order(r.phases.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rank(r.phases[a]) < rank(r.phases[b]); });
  auto renumber = [&](PhaseSeconds& seconds) {
    PhaseSeconds out(order.size(), kNaN);
    for (size_t i = 0; i < order.size(); ++i)
      if (order[i] < seconds.size()) out[i] = seconds[order[i]];
    seconds = std::move(out);
  };
  std::vector<std::string> names;
  for (size_t i : order) names.push_back(r.phases[i]);
  r.phases = std::move(names);
  for (auto& s : r.starts) renumber(s.predicted_phase_seconds);
  for (auto& s : r.steps) renumber(s.phase_seconds);
}

// A line that is the start of a record whose write was cut short, then a whole record (the next
// process appended to the file): the whole record, found at one of the first few `{"` of the line.
std::optional<Json> record_after_torn_write(std::string_view line) {
  constexpr int kMaxTries = 64;  // bounds the work on a hostile line
  size_t at = 0;
  for (int tries = 0; tries < kMaxTries; ++tries) {
    at = line.find("{\"", at + 1);
    if (at == std::string_view::npos) return std::nullopt;
    try {
      Json record = api::parse_json(std::string(line.substr(at)));
      if (record.is_object() && record.contains("kind")) return record;
    } catch (const Error&) {
    }
  }
  return std::nullopt;
}

}  // namespace

RunRecords parse_steps_log(std::string_view text, const std::string& source) {
  RunRecords out;
  out.source = source;
  if (text.size() > kMaxStepsFileBytes)
    throw Error(source + ": " + std::to_string(text.size()) + " bytes, over the bound of " +
                std::to_string(kMaxStepsFileBytes) + " for a step log");
  size_t pos = 0, line = 0, unknown = 0;
  while (pos < text.size()) {
    const size_t newline = text.find('\n', pos);
    const bool terminated = newline != std::string_view::npos;
    std::string_view body = text.substr(pos, terminated ? newline - pos : std::string_view::npos);
    pos = terminated ? newline + 1 : text.size();
    ++line;
    const std::string at = source + ":" + std::to_string(line);
    if (line > kMaxStepsLines)
      throw Error(source + ": more than " + std::to_string(kMaxStepsLines) +
                  " lines, the bound of a step log");
    if (body.size() > kMaxStepsLineBytes)
      throw Error(at + ": a line of " + std::to_string(body.size()) + " bytes, over the bound of " +
                  std::to_string(kMaxStepsLineBytes));
    if (!body.empty() && body.back() == '\r') body.remove_suffix(1);
    if (body.find_first_not_of(" \t") == std::string_view::npos) continue;

    Json record;
    try {
      record = api::parse_json(std::string(body), at);
    } catch (const Error&) {
      // Only a write cut short (a crash, a full disk) leaves a line without its newline: at the
      // end of the file, or in the middle when a restarted worker appended after it.
      if (!terminated) {
        out.warnings.push_back(at + ": the last line is cut short (a torn write); skipped");
        break;
      }
      std::optional<Json> rest = record_after_torn_write(body);
      if (!rest) throw;
      out.warnings.push_back(at + ": a torn write followed by a complete record; the torn " +
                             "part skipped");
      record = std::move(*rest);
    }
    if (!record.is_object()) throw Error(at + ": a record must be a JSON object");
    LineReader r(out, line, record);
    const std::string kind = r.kind();
    r.set_kind(kind);
    const bool known = kind == "start" || kind == "step" || kind == "checkpoint" ||
                       kind == "checkpoint_failed" || kind == "end";
    if (!known) {
      if (++unknown <= 5)
        out.warnings.push_back(at + ": a record of unknown kind \"" +
                               kind.substr(0, kMaxStepsTextBytes) + "\"; skipped");
      continue;
    }
    if (kind != "start" && out.starts.empty())
      r.fail("a \"" + kind + "\" record before the first \"start\" record");
    const size_t attempt = out.starts.empty() ? 0 : out.starts.size() - 1;

    if (kind == "start") {
      StartRecord s;
      s.line = line;
      s.time = r.number("time");
      s.resumed_from = r.integer("resumed_from", 0, kMaxStepNumber);
      s.total_steps = r.integer("total_steps", 0, kMaxStepNumber);
      s.plan_hash = r.text("plan_hash");
      s.tp = r.integer("tp", 1, 1 << 20);
      s.dp = r.integer("dp", 1, 1 << 20);
      s.pp = r.integer_or("pp", 1, 1 << 16, 1);
      s.virtual_stages = r.integer_or("virtual_stages", 1, 1 << 16, 1);
      s.distributed_optimizer = r.flag_or("distributed_optimizer", false);
      s.cut_layer = r.integer_or("cut_layer", 0, 1 << 16, 0);
      s.cut_tp = r.integer_or("cut_tp", 0, 1 << 20, 0);
      s.recompute = r.text("recompute");
      s.offload = r.text("offload");
      s.precision = r.text("precision");
      s.device = r.text("device");
      s.predicted_step_seconds = r.optional_number("predicted_step_seconds");
      s.predicted_tokens_per_second = r.optional_number("predicted_tokens_per_second");
      s.predicted_phase_seconds = r.phases("predicted_phase_seconds");
      s.loss_floor = r.optional_number("loss_floor", true);
      out.starts.push_back(std::move(s));
    } else if (kind == "step") {
      StepRecord s;
      s.line = line;
      s.attempt = attempt;
      s.time = r.number("time");
      s.step = r.integer("step", 0, kMaxStepNumber);
      s.loss = r.optional_number("loss");
      s.seconds = r.optional_number("seconds");
      s.tokens_per_second = r.optional_number("tokens_per_second");
      s.mfu = r.optional_number("mfu", true);
      s.phase_seconds = r.phases("phase_seconds");
      out.steps.push_back(std::move(s));
    } else if (kind == "checkpoint" || kind == "checkpoint_failed") {
      CheckpointRecord c;
      c.line = line;
      c.attempt = attempt;
      c.time = r.number("time");
      c.step = r.integer("step", 0, kMaxStepNumber);
      c.ok = kind == "checkpoint";
      if (c.ok)
        c.seconds = r.optional_number("seconds", true);
      else
        c.reason = r.text("reason");
      out.checkpoints.push_back(std::move(c));
    } else {
      EndRecord e;
      e.line = line;
      e.attempt = attempt;
      e.time = r.number("time");
      e.step = r.integer("step", 0, kMaxStepNumber);
      e.how = r.text("how");
      out.ends.push_back(std::move(e));
    }
  }
  if (unknown > 5)
    out.warnings.push_back(source + ": " + std::to_string(unknown - 5) +
                           " more record(s) of unknown kinds skipped");
  order_phases(out);
  return out;
}

RunRecords load_steps_log(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw Error("cannot read " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Error("cannot read " + path + ": not a regular file");
  if (static_cast<uint64_t>(st.st_size) > kMaxStepsFileBytes)
    throw Error(path + ": " + std::to_string(st.st_size) + " bytes, over the bound of " +
                std::to_string(kMaxStepsFileBytes) + " for a step log");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path + ": " + std::strerror(errno));
  // The worker may still be appending: read no more than the bound (one byte over is refused).
  std::string text(std::min(kMaxStepsFileBytes + 1, static_cast<size_t>(st.st_size) + 65536), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (in.bad()) throw Error("cannot read " + path + ": read failed");
  return parse_steps_log(text, path);
}

std::vector<const StepRecord*> latest_steps(const RunRecords& records) {
  // A restart that resumed from step R rolled training back to R: an earlier process's steps
  // after R are history that was redone (or not yet redone), not the run's result.
  std::vector<int64_t> cutoff(records.starts.size() + 1, std::numeric_limits<int64_t>::max());
  for (size_t a = records.starts.size(); a-- > 0;)
    cutoff[a] = a + 1 < records.starts.size()
                    ? std::min(cutoff[a + 1], records.starts[a + 1].resumed_from)
                    : std::numeric_limits<int64_t>::max();
  std::vector<const StepRecord*> kept;
  for (const auto& s : records.steps)
    if (s.step <= cutoff[s.attempt]) kept.push_back(&s);
  std::stable_sort(kept.begin(), kept.end(),
                   [](const StepRecord* a, const StepRecord* b) { return a->step < b->step; });
  std::vector<const StepRecord*> out;
  for (const StepRecord* s : kept) {
    if (!out.empty() && out.back()->step == s->step)
      out.back() = s;  // the later line wins
    else
      out.push_back(s);
  }
  return out;
}

// ---- rendering -------------------------------------------------------------------------------

namespace {

// Text for HTML and inline SVG (both parse &, <, >, " and ' the same way); control characters
// other than tab and newline become U+FFFD.
std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        if ((static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') || c == 0x7f)
          out += "\xEF\xBF\xBD";
        else
          out += c;
    }
  }
  return out;
}

// An SVG coordinate or length: always finite.
std::string coord(double v) {
  if (!std::isfinite(v)) v = 0;
  return format("%.1f", std::clamp(v, -1e6, 1e6));
}

// A human number: 3 significant digits, k/M/G above 10^4.
std::string human(double v) {
  if (!std::isfinite(v)) return "–";
  const double a = std::fabs(v);
  if (a >= 1e12) return format("%.3gT", v / 1e12);
  if (a >= 1e9) return format("%.3gG", v / 1e9);
  if (a >= 1e6) return format("%.3gM", v / 1e6);
  if (a >= 1e4) return format("%.3gk", v / 1e3);
  return format("%.4g", v);
}

std::string milliseconds(double seconds) {
  return std::isfinite(seconds) ? human(seconds * 1e3) + " ms" : "–";
}

std::string duration_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "–";
  if (seconds < 60) return format("%.1f s", seconds);
  const long long s = std::llround(seconds);
  if (s < 3600) return format("%lldm%02llds", s / 60, s % 60);
  return format("%lldh%02lldm", s / 3600, (s / 60) % 60);
}

// A checkpoint's write takes milliseconds on a small model, minutes on a large one.
std::string checkpoint_seconds(double seconds) {
  return seconds < 1 ? milliseconds(seconds) : duration_text(seconds);
}

std::string utc_text(double unix_seconds) {
  if (!(unix_seconds >= 0 && unix_seconds < 253402300800.0)) return human(unix_seconds);
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  if (!::gmtime_r(&t, &tm)) return human(unix_seconds);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return kNaN;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  if (v.size() % 2) return v[mid];
  const double upper = v[mid];
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)) + upper) / 2;
}

double phase(const PhaseSeconds& p, size_t i) {
  return i < p.size() ? p[i] : kNaN;
}

// An axis over [lo, hi] with "nice" ticks (1, 2 or 5 × 10^k apart), widened to whole ticks.
struct Axis {
  double lo = 0, hi = 1, step = 0.2;
  std::vector<double> ticks;

  double fraction(double v) const { return hi > lo ? (v - lo) / (hi - lo) : 0.5; }
  std::string label(double v) const {
    // Enough decimals to tell ticks apart, k/M/G for large values.
    const double a = std::max(std::fabs(lo), std::fabs(hi));
    double scale = 1;
    const char* suffix = "";
    if (a >= 1e12)
      scale = 1e12, suffix = "T";
    else if (a >= 1e9)
      scale = 1e9, suffix = "G";
    else if (a >= 1e6)
      scale = 1e6, suffix = "M";
    else if (a >= 1e4)
      scale = 1e3, suffix = "k";
    const int decimals =
        std::clamp(static_cast<int>(-std::floor(std::log10(step / scale) + 1e-9)), 0, 12);
    std::string s = format("%.*f%s", decimals, v / scale, suffix);
    if (s.rfind("-0", 0) == 0 && s.find_first_not_of("-0.") == std::string::npos) s.erase(0, 1);
    return s;
  }
};

Axis nice_axis(double lo, double hi, bool from_zero = false, int target_ticks = 6) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (lo > hi) std::swap(lo, hi);
  if (from_zero) lo = std::min(lo, 0.0), hi = std::max(hi, 0.0);
  const double magnitude = std::max(std::fabs(lo), std::fabs(hi));
  if (hi - lo <= magnitude * 1e-9 || hi - lo < 1e-12) {  // one value: a range around it
    const double pad = magnitude > 0 ? magnitude * 0.1 : 1;
    lo = from_zero && lo >= 0 ? 0 : lo - pad;
    hi += pad;
  }
  Axis a;
  const double raw = (hi - lo) / target_ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  const double n = raw / power;
  a.step = (n < 1.5 ? 1 : n < 3 ? 2 : n < 7 ? 5 : 10) * power;
  a.lo = std::floor(lo / a.step) * a.step;
  a.hi = std::ceil(hi / a.step) * a.step;
  if (a.hi <= a.lo) a.hi = a.lo + a.step;
  for (int i = 0; i <= 4 * target_ticks; ++i) {
    const double t = a.lo + i * a.step;
    if (t > a.hi + a.step * 1e-6) break;
    a.ticks.push_back(std::fabs(t) < a.step * 1e-9 ? 0.0 : t);
  }
  return a;
}

// At most `max` indices of [0, n): every k-th, and always the last.
std::vector<size_t> thin(size_t n, size_t max) {
  std::vector<size_t> out;
  if (n == 0) return out;
  const size_t stride = (n + max - 1) / max;
  for (size_t i = 0; i < n; i += stride) out.push_back(i);
  if (out.back() != n - 1) out.push_back(n - 1);
  return out;
}
constexpr size_t kMaxPlotPoints = 2000;

// One chart: the plot area inside margins, x and y axes with ticks and unit labels.
struct Chart {
  static constexpr double kWidth = 760, kLeft = 76, kRight = 24, kTop = 34, kBottom = 50;
  double height = 300;
  Axis x, y;
  std::string x_label, y_label;

  double x0() const { return kLeft; }
  double x1() const { return kWidth - kRight; }
  double y0() const { return height - kBottom; }  // bottom of the plot area
  double y1() const { return kTop; }
  double px(double v) const { return x0() + x.fraction(v) * (x1() - x0()); }
  double py(double v) const { return y0() - y.fraction(v) * (y0() - y1()); }

  std::string open(const std::string& id, const std::string& title) const {
    return "<svg id=\"" + id + "-plot\" class=\"plot\" width=\"" + coord(kWidth) + "\" height=\"" +
           coord(height) + "\" viewBox=\"0 0 " + coord(kWidth) + " " + coord(height) +
           "\" role=\"img\" aria-label=\"" + escape(title) + "\">\n<title>" + escape(title) +
           "</title>\n";
  }

  std::string axes() const {
    std::string s = "<g class=\"axes\">\n";
    for (double t : x.ticks) {
      const std::string X = coord(px(t));
      s += "<line class=\"grid\" x1=\"" + X + "\" y1=\"" + coord(y1()) + "\" x2=\"" + X +
           "\" y2=\"" + coord(y0()) + "\"/><line class=\"tick\" x1=\"" + X + "\" y1=\"" +
           coord(y0()) + "\" x2=\"" + X + "\" y2=\"" + coord(y0() + 5) + "\"/><text x=\"" + X +
           "\" y=\"" + coord(y0() + 18) + "\" text-anchor=\"middle\">" + escape(x.label(t)) +
           "</text>\n";
    }
    for (double t : y.ticks) {
      const std::string Y = coord(py(t));
      s += "<line class=\"grid\" x1=\"" + coord(x0()) + "\" y1=\"" + Y + "\" x2=\"" + coord(x1()) +
           "\" y2=\"" + Y + "\"/><line class=\"tick\" x1=\"" + coord(x0() - 5) + "\" y1=\"" + Y +
           "\" x2=\"" + coord(x0()) + "\" y2=\"" + Y + "\"/><text x=\"" + coord(x0() - 8) +
           "\" y=\"" + coord(py(t) + 4) + "\" text-anchor=\"end\">" + escape(y.label(t)) +
           "</text>\n";
    }
    s += "<rect class=\"frame\" x=\"" + coord(x0()) + "\" y=\"" + coord(y1()) + "\" width=\"" +
         coord(x1() - x0()) + "\" height=\"" + coord(y0() - y1()) + "\"/>\n";
    s += "<text class=\"axis-label\" x=\"" + coord((x0() + x1()) / 2) + "\" y=\"" +
         coord(height - 10) + "\" text-anchor=\"middle\">" + escape(x_label) + "</text>\n";
    s += "<text class=\"axis-label\" transform=\"translate(16 " + coord((y0() + y1()) / 2) +
         ") rotate(-90)\" text-anchor=\"middle\">" + escape(y_label) + "</text>\n</g>\n";
    return s;
  }
};

struct LegendEntry {
  std::string css_class, text;
  bool line = true;  // a line sample, else a marker sample
};

// A row of samples and names above the plot area.
std::string legend(const std::vector<LegendEntry>& entries) {
  std::string s = "<g class=\"legend\">";
  double x = Chart::kLeft;
  for (const auto& e : entries) {
    if (e.line)
      s += "<line class=\"" + e.css_class + "\" x1=\"" + coord(x) + "\" y1=\"16\" x2=\"" +
           coord(x + 22) + "\" y2=\"16\"/>";
    else if (e.css_class == "checkpoint")  // the shapes of checkpoint_marker and the end's
      s += "<path class=\"checkpoint\" d=\"M" + coord(x + 11) + " 11 l5 9 l-10 0z\"/>";
    else if (e.css_class == "checkpoint-failed")
      s += "<path class=\"checkpoint-failed\" d=\"M" + coord(x + 6) +
           " 11 l10 10 m0 -10 l-10 10\"/>";
    else
      s += "<path class=\"" + e.css_class + "\" d=\"M" + coord(x + 11) +
           " 10 l6 6 l-6 6 l-6 -6z\"/>";
    s += "<text x=\"" + coord(x + 28) + "\" y=\"20\">" + escape(e.text) + "</text>";
    x += 40 + 7.0 * static_cast<double>(e.text.size());
  }
  return s + "</g>\n";
}

void add_checkpoint_keys(const RunRecords& r, std::vector<LegendEntry>& keys) {
  const auto saved = [](const CheckpointRecord& c) { return c.ok; };
  if (std::any_of(r.checkpoints.begin(), r.checkpoints.end(), saved))
    keys.push_back({"checkpoint", "checkpoint", false});
  if (!std::all_of(r.checkpoints.begin(), r.checkpoints.end(), saved))
    keys.push_back({"checkpoint-failed", "failed checkpoint", false});
}

std::string no_data(const std::string& id, const std::string& title, const std::string& why) {
  Chart c;
  c.height = 120;
  return c.open(id, title) + "<text class=\"no-data\" x=\"" + coord(Chart::kWidth / 2) +
         "\" y=\"64\" text-anchor=\"middle\">" + escape(why) + "</text>\n</svg>\n";
}

std::string polyline(const std::string& css_class,
                     const std::vector<std::pair<double, double>>& p) {
  if (p.size() == 1)
    return "<circle class=\"" + css_class + " dot\" cx=\"" + coord(p[0].first) + "\" cy=\"" +
           coord(p[0].second) + "\" r=\"3\"/>\n";
  std::string s = "<polyline class=\"" + css_class + "\" points=\"";
  for (const auto& [x, y] : p) s += coord(x) + "," + coord(y) + " ";
  if (!p.empty()) s.pop_back();
  return s + "\"/>\n";
}

std::string vertical_marker(const Chart& c, double x, const std::string& css_class,
                            const std::string& label, const std::string& tooltip) {
  const std::string X = coord(c.px(x));
  return "<g class=\"" + css_class + "\"><title>" + escape(tooltip) + "</title><line x1=\"" + X +
         "\" y1=\"" + coord(c.y1()) + "\" x2=\"" + X + "\" y2=\"" + coord(c.y0()) +
         "\"/><text x=\"" + coord(c.px(x) + 4) + "\" y=\"" + coord(c.y1() + 12) + "\">" +
         escape(label) + "</text></g>\n";
}

// A checkpoint on a step axis: a triangle on the bottom edge (saved) or a cross (failed).
std::string checkpoint_marker(double x, double y, const CheckpointRecord& c) {
  const std::string tooltip =
      c.ok ? "checkpoint at step " + std::to_string(c.step) +
                 (c.seconds ? " (" + checkpoint_seconds(*c.seconds) + ")" : "")
           : "checkpoint at step " + std::to_string(c.step) + " failed: " + c.reason;
  std::string s = "<g class=\"" + std::string(c.ok ? "checkpoint" : "checkpoint-failed") +
                  "\"><title>" + escape(tooltip) + "</title>";
  if (c.ok)
    s += "<path d=\"M" + coord(x) + " " + coord(y - 9) + " l5 9 l-10 0z\"/>";
  else
    s += "<path d=\"M" + coord(x - 5) + " " + coord(y - 10) + " l10 10 m0 -10 l-10 10\"/>";
  return s + "</g>\n";
}

std::string figure(const std::string& id, const std::string& heading, const std::string& svg,
                   const std::string& note) {
  return "<figure id=\"" + id + "\">\n<figcaption>" + escape(heading) + "</figcaption>\n" + svg +
         (note.empty() ? "" : "<p class=\"note\">" + escape(note) + "</p>\n") + "</figure>\n";
}

// What the plots share: the latest record of each step, and the step axis's extent.
struct View {
  const RunRecords& r;
  std::vector<const StepRecord*> steps;  // latest_steps
  int64_t max_step = 1;
};

std::string thinned_note(size_t drawn, size_t all) {
  return drawn < all ? format("%zu of %zu steps drawn (evenly spaced).", drawn, all) : "";
}

std::string loss_plot(const View& v) {
  const std::string title = "Loss per step";
  std::vector<const StepRecord*> with_loss;
  for (const StepRecord* s : v.steps)
    if (s->loss) with_loss.push_back(s);
  std::optional<double> floor;
  for (const auto& s : v.r.starts)
    if (s.loss_floor) floor = s.loss_floor;
  if (with_loss.empty())
    return figure("loss", title, no_data("loss", title, "no loss recorded"), "");

  double lo = *with_loss[0]->loss, hi = lo;
  for (const StepRecord* s : with_loss) lo = std::min(lo, *s->loss), hi = std::max(hi, *s->loss);
  if (floor) lo = std::min(lo, *floor), hi = std::max(hi, *floor);
  Chart c;
  c.x = nice_axis(0, static_cast<double>(v.max_step), true);
  c.y = nice_axis(lo - 0.04 * (hi - lo), hi + 0.04 * (hi - lo));
  c.x_label = "step";
  c.y_label = "loss (nats)";
  std::string s = c.open("loss", title) + c.axes();
  std::vector<LegendEntry> keys{{"measured", "loss (latest value per step)"}};
  if (floor) keys.push_back({"floor", "entropy floor of the data"});
  if (v.r.starts.size() > 1) keys.push_back({"restart", "restart"});
  add_checkpoint_keys(v.r, keys);
  s += legend(keys);
  if (floor) {
    const std::string Y = coord(c.py(*floor));
    s += "<g class=\"floor\"><title>" + escape(format("entropy floor %.4f nats", *floor)) +
         "</title><line x1=\"" + coord(c.x0()) + "\" y1=\"" + Y + "\" x2=\"" + coord(c.x1()) +
         "\" y2=\"" + Y + "\"/><text x=\"" + coord(c.x1() - 4) + "\" y=\"" +
         coord(c.py(*floor) - 5) + "\" text-anchor=\"end\">" +
         escape(format("floor %.3f", *floor)) + "</text></g>\n";
  }
  for (size_t i = 1; i < v.r.starts.size(); ++i) {
    const auto& st = v.r.starts[i];
    s += vertical_marker(
        c, static_cast<double>(st.resumed_from), "restart", "restart",
        "restart " + std::to_string(i) + ": resumed from step " + std::to_string(st.resumed_from));
  }
  std::vector<std::pair<double, double>> points;
  for (size_t i : thin(with_loss.size(), kMaxPlotPoints))
    points.emplace_back(c.px(static_cast<double>(with_loss[i]->step)), c.py(*with_loss[i]->loss));
  s += polyline("measured", points);
  for (const auto& cp : v.r.checkpoints)
    s += checkpoint_marker(c.px(static_cast<double>(cp.step)), c.y0(), cp);
  s += "</svg>\n";
  return figure("loss", title, s, thinned_note(points.size(), with_loss.size()));
}

std::string tokens_plot(const View& v) {
  const std::string title = "Tokens/s per step, measured and predicted";
  std::vector<const StepRecord*> measured;
  for (const StepRecord* s : v.steps)
    if (s->tokens_per_second) measured.push_back(s);
  // The prediction of each process over the steps it ran: from where it resumed to where the
  // next one resumed (one line when the plan never changed).
  struct Segment {
    double from, to, value;
  };
  std::vector<Segment> predicted;
  for (size_t i = 0; i < v.r.starts.size(); ++i) {
    const auto& st = v.r.starts[i];
    if (!st.predicted_tokens_per_second) continue;
    const double from = i == 0 ? 0 : static_cast<double>(st.resumed_from);
    const double to = i + 1 < v.r.starts.size()
                          ? static_cast<double>(v.r.starts[i + 1].resumed_from)
                          : static_cast<double>(v.max_step);
    if (!predicted.empty() && predicted.back().value == *st.predicted_tokens_per_second)
      predicted.back().to = std::max(predicted.back().to, to);
    else
      predicted.push_back({from, std::max(from, to), *st.predicted_tokens_per_second});
  }
  if (measured.empty() && predicted.empty())
    return figure("tokens", title, no_data("tokens", title, "no tokens/s recorded"), "");

  double hi = 0;
  for (const StepRecord* s : measured) hi = std::max(hi, *s->tokens_per_second);
  for (const auto& p : predicted) hi = std::max(hi, p.value);
  double lo = 0;
  for (const StepRecord* s : measured) lo = std::min(lo, *s->tokens_per_second);
  for (const auto& p : predicted) lo = std::min(lo, p.value);
  Chart c;
  c.x = nice_axis(0, static_cast<double>(v.max_step), true);
  c.y = nice_axis(lo, hi * 1.08, true);
  c.x_label = "step";
  c.y_label = "tokens/s";
  std::string s = c.open("tokens", title) + c.axes();
  s += legend({{"measured", "measured (rank 0)"}, {"predicted", "predicted by the plan"}});
  for (const auto& p : predicted) {
    const std::string Y = coord(c.py(p.value));
    s += "<g class=\"predicted\"><title>" + escape("predicted " + human(p.value) + " tokens/s") +
         "</title><line x1=\"" + coord(c.px(p.from)) + "\" y1=\"" + Y + "\" x2=\"" +
         coord(c.px(p.to)) + "\" y2=\"" + Y + "\"/></g>\n";
  }
  std::vector<std::pair<double, double>> points;
  for (size_t i : thin(measured.size(), kMaxPlotPoints))
    points.emplace_back(c.px(static_cast<double>(measured[i]->step)),
                        c.py(*measured[i]->tokens_per_second));
  s += polyline("measured", points);
  for (size_t i = 1; i < v.r.starts.size(); ++i)
    s += vertical_marker(c, static_cast<double>(v.r.starts[i].resumed_from), "restart", "restart",
                         "restart " + std::to_string(i) + ": resumed from step " +
                             std::to_string(v.r.starts[i].resumed_from));
  s += "</svg>\n";
  return figure("tokens", title, s, thinned_note(points.size(), measured.size()));
}

// The step time by phase: the median over the latest steps run under the last start's plan,
// next to that plan's prediction.
struct PhaseRow {
  std::string name;
  double measured = kNaN, predicted = kNaN;
};

std::vector<PhaseRow> phase_rows(const View& v, std::vector<std::string>& left_out) {
  std::vector<PhaseRow> rows;
  if (v.r.starts.empty()) return rows;
  const StartRecord& plan = v.r.starts.back();
  std::vector<const StepRecord*> same_plan;
  for (const StepRecord* s : v.steps)
    if (v.r.starts[s->attempt].plan_hash == plan.plan_hash) same_plan.push_back(s);
  auto median_of = [&](auto get) {
    std::vector<double> values;
    for (const StepRecord* s : same_plan) values.push_back(get(*s));
    return median(values);
  };
  PhaseRow step{"whole step",
                median_of([](const StepRecord& s) { return s.seconds.value_or(kNaN); }),
                plan.predicted_step_seconds.value_or(kNaN)};
  if (std::isfinite(step.measured) || std::isfinite(step.predicted)) rows.push_back(step);
  for (size_t i = 0; i < v.r.phases.size(); ++i) {
    PhaseRow row{v.r.phases[i],
                 median_of([i](const StepRecord& s) { return phase(s.phase_seconds, i); }),
                 phase(plan.predicted_phase_seconds, i)};
    const bool measured = std::isfinite(row.measured) && row.measured != 0;
    const bool predicted = std::isfinite(row.predicted) && row.predicted != 0;
    if (measured || predicted)
      rows.push_back(row);
    else
      left_out.push_back(row.name);
  }
  return rows;
}

std::string phase_plot(const std::vector<PhaseRow>& rows,
                       const std::vector<std::string>& left_out) {
  const std::string title = "Step time by phase, measured (median) and predicted";
  if (rows.empty())
    return figure("phases", title, no_data("phases", title, "no step times recorded"), "");
  // Horizontal bars: a row per phase, the measured bar above the predicted one.
  constexpr double kLabelWidth = 170, kBar = 11, kRowGap = 10;
  Chart c;
  c.height = Chart::kTop + static_cast<double>(rows.size()) * (2 * kBar + kRowGap) + Chart::kBottom;
  double hi = 0;
  for (const auto& r : rows)
    for (double x : {r.measured, r.predicted})
      if (std::isfinite(x)) hi = std::max(hi, x * 1e3);
  c.x = nice_axis(0, hi * 1.05, true);
  c.y = nice_axis(0, 1);
  c.y.ticks.clear();
  c.x_label = "milliseconds per step";
  c.y_label = "";
  // The chart's left margin is wider here, for the phase names.
  const double x0 = kLabelWidth, x1 = Chart::kWidth - Chart::kRight;
  auto px = [&](double ms) { return x0 + c.x.fraction(ms) * (x1 - x0); };
  std::string s = c.open("phases", title);
  s += "<g class=\"axes\">\n";
  for (double t : c.x.ticks) {
    const std::string X = coord(px(t));
    s += "<line class=\"grid\" x1=\"" + X + "\" y1=\"" + coord(c.y1()) + "\" x2=\"" + X +
         "\" y2=\"" + coord(c.y0()) + "\"/><line class=\"tick\" x1=\"" + X + "\" y1=\"" +
         coord(c.y0()) + "\" x2=\"" + X + "\" y2=\"" + coord(c.y0() + 5) + "\"/><text x=\"" + X +
         "\" y=\"" + coord(c.y0() + 18) + "\" text-anchor=\"middle\">" + escape(c.x.label(t)) +
         "</text>\n";
  }
  s += "<rect class=\"frame\" x=\"" + coord(x0) + "\" y=\"" + coord(c.y1()) + "\" width=\"" +
       coord(x1 - x0) + "\" height=\"" + coord(c.y0() - c.y1()) + "\"/>\n";
  s += "<text class=\"axis-label\" x=\"" + coord((x0 + x1) / 2) + "\" y=\"" + coord(c.height - 10) +
       "\" text-anchor=\"middle\">" + escape(c.x_label) + "</text>\n</g>\n";
  s += legend({{"measured bar", "measured (median)"}, {"predicted bar", "predicted"}});
  double y = c.y1() + kRowGap / 2;
  for (const auto& r : rows) {
    s += "<g class=\"phase\"><text x=\"" + coord(x0 - 8) + "\" y=\"" + coord(y + kBar + 4) +
         "\" text-anchor=\"end\">" + escape(r.name) + "</text>\n";
    for (const auto& [value, css] :
         {std::pair{r.measured, "measured bar"}, std::pair{r.predicted, "predicted bar"}}) {
      if (std::isfinite(value)) {
        const double w = std::max(0.0, px(value * 1e3) - x0);
        s += "<rect class=\"" + std::string(css) + "\" x=\"" + coord(x0) + "\" y=\"" + coord(y) +
             "\" width=\"" + coord(w) + "\" height=\"" + coord(kBar - 1) + "\"><title>" +
             escape(r.name + (css[0] == 'm' ? " measured " : " predicted ") + milliseconds(value)) +
             "</title></rect><text class=\"value\" x=\"" + coord(x0 + w + 4) + "\" y=\"" +
             coord(y + kBar - 2) + "\">" + escape(milliseconds(value)) + "</text>\n";
      } else {
        s += "<text class=\"value\" x=\"" + coord(x0 + 4) + "\" y=\"" + coord(y + kBar - 2) +
             "\">" + escape(css[0] == 'm' ? "not measured" : "not predicted") + "</text>\n";
      }
      y += kBar;
    }
    s += "</g>\n";
    y += kRowGap;
  }
  s += "</svg>\n";
  std::string note;
  if (!left_out.empty()) {
    note = "Zero or absent both measured and predicted, not drawn:";
    for (const auto& n : left_out) note += " " + n;
    note += ".";
  }
  return figure("phases", title, s, note);
}

std::string timeline_plot(const View& v) {
  const std::string title = "Timeline: steps, checkpoints and restarts over wall time";
  const RunRecords& r = v.r;
  const double t0 = r.starts.front().time;
  double t_end = t0;
  for (const auto& s : r.starts) t_end = std::max(t_end, s.time);
  for (const auto& s : r.steps) t_end = std::max(t_end, s.time);
  for (const auto& c : r.checkpoints) t_end = std::max(t_end, c.time);
  for (const auto& e : r.ends) t_end = std::max(t_end, e.time);
  double t_lo = 0;
  for (const auto& s : r.steps) t_lo = std::min(t_lo, s.time - t0);
  const double span = t_end - t0;
  double unit = 1;
  std::string unit_name = "s";
  if (span > 72000)
    unit = 3600, unit_name = "h";
  else if (span > 1200)
    unit = 60, unit_name = "min";

  Chart c;
  c.x = nice_axis(t_lo / unit, span / unit, true);
  c.y = nice_axis(0, static_cast<double>(v.max_step), true);
  c.x_label = "wall time since the first start (" + unit_name + ")";
  c.y_label = "step";
  auto px = [&](double t) { return c.px((t - t0) / unit); };
  std::string s = c.open("timeline", title) + c.axes();
  std::vector<LegendEntry> keys{{"measured", "step reached"}};
  if (r.starts.size() > 1) keys.push_back({"restart", "restart"});
  add_checkpoint_keys(r, keys);
  if (!r.ends.empty()) keys.push_back({"end", "end", false});
  s += legend(keys);
  for (size_t i = 1; i < r.starts.size(); ++i) {
    const auto& st = r.starts[i];
    const std::string X = coord(px(st.time));
    s += "<g class=\"restart\"><title>" +
         escape("restart " + std::to_string(i) + " at " + utc_text(st.time) +
                ": resumed from step " + std::to_string(st.resumed_from)) +
         "</title><line x1=\"" + X + "\" y1=\"" + coord(c.y1()) + "\" x2=\"" + X + "\" y2=\"" +
         coord(c.y0()) + "\"/><text x=\"" + coord(px(st.time) + 4) + "\" y=\"" +
         coord(c.y1() + 12) + "\">" + escape("restart from " + std::to_string(st.resumed_from)) +
         "</text></g>\n";
  }
  // Each process's steps as it ran them (a restart goes back to where it resumed).
  for (size_t a = 0; a < r.starts.size(); ++a) {
    std::vector<const StepRecord*> mine;
    for (const auto& st : r.steps)
      if (st.attempt == a) mine.push_back(&st);
    std::vector<std::pair<double, double>> points;
    if (a > 0 && !mine.empty())
      points.emplace_back(px(r.starts[a].time),
                          c.py(static_cast<double>(r.starts[a].resumed_from)));
    for (size_t i : thin(mine.size(), kMaxPlotPoints))
      points.emplace_back(px(mine[i]->time), c.py(static_cast<double>(mine[i]->step)));
    if (!points.empty()) s += polyline("measured", points);
  }
  for (const auto& cp : r.checkpoints)
    s += checkpoint_marker(px(cp.time), c.py(static_cast<double>(cp.step)) + 4, cp);
  for (const auto& e : r.ends) {
    const double x = px(e.time), y = c.py(static_cast<double>(e.step));
    s += "<g class=\"end\"><title>" +
         escape("ended (" + e.how + ") at step " + std::to_string(e.step) + ", " +
                utc_text(e.time)) +
         "</title><path d=\"M" + coord(x) + " " + coord(y - 6) +
         " l6 6 l-6 6 l-6 -6z\"/><text x=\"" + coord(x - 8) + "\" y=\"" + coord(y - 8) +
         "\" text-anchor=\"end\">" + escape(e.how) + "</text></g>\n";
  }
  s += "</svg>\n";
  return figure("timeline", title, s, "");
}

std::string row(const std::string& name, const std::string& value) {
  return "<tr><th scope=\"row\">" + escape(name) + "</th><td>" + escape(value) + "</td></tr>\n";
}

std::string header_table(const View& v, const ReportOptions& options) {
  const RunRecords& r = v.r;
  const StartRecord& plan = r.starts.back();
  std::string hashes;
  for (const auto& s : r.starts)
    if (hashes.find(s.plan_hash) == std::string::npos)
      hashes += (hashes.empty() ? "" : " → ") + s.plan_hash;
  const StepRecord* last = v.steps.empty() ? nullptr : v.steps.back();
  double t_end = r.starts.front().time;
  for (const auto& s : r.steps) t_end = std::max(t_end, s.time);
  for (const auto& e : r.ends) t_end = std::max(t_end, e.time);
  for (const auto& c : r.checkpoints) t_end = std::max(t_end, c.time);
  size_t saved = 0, failed = 0;
  for (const auto& c : r.checkpoints) (c.ok ? saved : failed)++;
  std::vector<double> seconds, tokens;
  for (const StepRecord* s : v.steps) {
    seconds.push_back(s->seconds.value_or(kNaN));
    tokens.push_back(s->tokens_per_second.value_or(kNaN));
  }
  std::optional<double> floor;
  for (const auto& s : r.starts)
    if (s.loss_floor) floor = s.loss_floor;

  std::string ended = "no end record (still running, or killed)";
  if (!r.ends.empty()) {
    const EndRecord& e = r.ends.back();
    ended = e.how + " at step " + std::to_string(e.step) + ", " + utc_text(e.time);
    if (e.attempt + 1 < r.starts.size()) ended += " (then restarted; the last process has none)";
  }
  std::string t = "<table class=\"summary\">\n";
  t += row("job", options.job.empty() ? "(unknown job)" : options.job);
  t += row("plan", hashes + (r.starts.size() > 1 && hashes.find("→") != std::string::npos
                                 ? " (re-planned at a restart)"
                                 : ""));
  t += row("parallelism",
           "TP " + std::to_string(plan.tp) +
               (plan.pp > 1 ? " × PP " + std::to_string(plan.pp) +
                                  (plan.virtual_stages > 1
                                       ? " (interleaved, " + std::to_string(plan.virtual_stages) +
                                             " virtual stages)"
                                       : " (1F1B)")
                            : "") +
               " × DP " + std::to_string(plan.dp) +
               (plan.cut_layer > 0 ? ", TP " + std::to_string(plan.cut_tp) + " from layer " +
                                         std::to_string(plan.cut_layer) +
                                         (plan.pp > 1 ? " (per-stage TP)" : " (Oases' cutpoint)")
                                   : "") +
               (plan.distributed_optimizer ? ", distributed optimizer (ZeRO-1)" : ""));
  t += row("recompute", plan.recompute);
  t += row("offload", plan.offload);
  t += row("precision", plan.precision);
  t += row("device", plan.device);
  t += row("steps",
           (last ? std::to_string(last->step) : "0") + " of " + std::to_string(plan.total_steps));
  t += row("started", utc_text(r.starts.front().time));
  t += row("wall time", duration_text(t_end - r.starts.front().time));
  t += row("ended", ended);
  t += row("restarts", std::to_string(r.starts.size() - 1));
  t += row("checkpoints", std::to_string(saved) + " saved, " + std::to_string(failed) + " failed");
  t += row("final loss", last && last->loss ? format("%.4f", *last->loss) : "–");
  t += row("entropy floor", floor ? format("%.4f nats", *floor) : "not known");
  t += row("step time", "measured " + milliseconds(median(seconds)) + " (median), predicted " +
                            milliseconds(plan.predicted_step_seconds.value_or(kNaN)));
  t += row("tokens/s", "measured " + human(median(tokens)) + " (median), predicted " +
                           human(plan.predicted_tokens_per_second.value_or(kNaN)));
  return t + "</table>\n";
}

std::string phase_table(const std::vector<PhaseRow>& rows) {
  if (rows.empty()) return "";
  std::string t =
      "<table class=\"phases\">\n<tr><th>phase</th><th>measured (median)</th><th>predicted</th>"
      "<th>measured / predicted</th></tr>\n";
  for (const auto& r : rows) {
    const double ratio = r.measured / r.predicted;
    t += "<tr><th scope=\"row\">" + escape(r.name) + "</th><td>" +
         escape(milliseconds(r.measured)) + "</td><td>" + escape(milliseconds(r.predicted)) +
         "</td><td>" + escape(std::isfinite(ratio) ? format("%.2f×", ratio) : "–") + "</td></tr>\n";
  }
  return t + "</table>\n";
}

// Starts, checkpoints and the end, in file order.
std::string events_table(const RunRecords& r) {
  struct Event {
    size_t line;
    double time;
    std::string what, step, detail;
  };
  std::vector<Event> events;
  for (size_t i = 0; i < r.starts.size(); ++i) {
    const auto& s = r.starts[i];
    events.push_back({s.line, s.time, i == 0 ? "start" : "restart", std::to_string(s.resumed_from),
                      s.resumed_from ? "resumed from its checkpoint" : "from scratch"});
  }
  for (const auto& c : r.checkpoints)
    events.push_back(
        {c.line, c.time, c.ok ? "checkpoint" : "checkpoint failed", std::to_string(c.step),
         c.ok ? (c.seconds ? "written in " + checkpoint_seconds(*c.seconds) : "") : c.reason});
  for (const auto& e : r.ends)
    events.push_back({e.line, e.time, "end", std::to_string(e.step), e.how});
  std::sort(events.begin(), events.end(),
            [](const Event& a, const Event& b) { return a.line < b.line; });
  constexpr size_t kMaxRows = 200;
  std::string t =
      "<table class=\"events\">\n<tr><th>time since start</th><th>event</th><th>step</th>"
      "<th>detail</th></tr>\n";
  const double t0 = r.starts.front().time;
  for (size_t i = 0; i < events.size() && i < kMaxRows; ++i) {
    const Event& e = events[i];
    t += "<tr class=\"" + std::string(e.what == "checkpoint failed" ? "failed" : "") + "\"><td>" +
         escape(duration_text(e.time - t0)) + "</td><td>" + escape(e.what) + "</td><td>" +
         escape(e.step) + "</td><td>" + escape(e.detail) + "</td></tr>\n";
  }
  t += "</table>\n";
  if (events.size() > kMaxRows)
    t += "<p class=\"note\">" +
         escape(format("%zu more events not listed.", events.size() - kMaxRows)) + "</p>\n";
  return t;
}

constexpr const char* kStyle = R"(
:root { color-scheme: light; }
body { background: #fff; color: #1a1a1a; font: 14px/1.45 system-ui, -apple-system, "Segoe UI",
       Roboto, "DejaVu Sans", sans-serif; margin: 24px auto; max-width: 800px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; }
p.source, p.note { color: #555; font-size: 12px; margin: 4px 0; }
ul.warnings { background: #fff6e5; border: 1px solid #e0b050; padding: 8px 8px 8px 28px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 12px 3px 0; text-align: left;
         vertical-align: top; }
th[scope=row] { color: #444; font-weight: 600; white-space: nowrap; }
table.phases td { font-variant-numeric: tabular-nums; }
tr.failed td { color: #b00020; }
figure { margin: 20px 0; }
figcaption { font-weight: 600; margin-bottom: 4px; }
svg.plot { background: #fff; display: block; font-size: 12px; }
svg text { fill: #333; }
svg .grid { stroke: #e6e6e6; }
svg .tick { stroke: #555; }
svg .frame { fill: none; stroke: #888; }
svg .axis-label { fill: #222; font-size: 13px; }
svg .no-data { fill: #777; font-size: 14px; }
svg .measured { fill: none; stroke: #1f63b4; stroke-width: 1.6; }
svg .measured.dot { fill: #1f63b4; }
svg .predicted, svg .predicted line { stroke: #e0701a; stroke-width: 2; stroke-dasharray: 7 4; }
svg .floor line, svg line.floor { stroke: #2b8a3e; stroke-width: 1.6; stroke-dasharray: 4 3; }
svg .floor text { fill: #2b8a3e; }
svg .restart line, svg line.restart { stroke: #c0392b; stroke-width: 1.4; stroke-dasharray: 3 3; }
svg .restart text { fill: #c0392b; }
svg .checkpoint path, svg path.checkpoint { fill: #555; stroke: none; }
svg .checkpoint-failed path, svg path.checkpoint-failed { fill: none; stroke: #c0392b;
                                                          stroke-width: 2.2; }
svg .end path, svg path.end { fill: #2b8a3e; }
svg rect.measured.bar { fill: #1f63b4; stroke: none; }
svg rect.predicted.bar { fill: #f0a050; stroke: none; }
svg line.measured.bar { stroke: #1f63b4; stroke-width: 8; stroke-dasharray: none; }
svg line.predicted.bar { stroke: #f0a050; stroke-width: 8; stroke-dasharray: none; }
svg text.value { fill: #444; font-size: 11px; }
)";

}  // namespace

RunPhases run_phases(const RunRecords& records) {
  if (records.starts.empty())
    throw Error(records.source + ": no \"start\" record: no plan to refit against");
  const StartRecord& plan = records.starts.back();
  std::vector<const StepRecord*> steps;
  for (const StepRecord* s : latest_steps(records))
    if (records.starts[s->attempt].plan_hash == plan.plan_hash) steps.push_back(s);
  const size_t warmup = steps.size() / 4;
  if (steps.size() <= warmup || steps.size() < 2)
    throw Error(records.source + ": " + std::to_string(steps.size()) +
                " step(s) of the last plan: too few to measure its phases (at least 2)");
  RunPhases out;
  out.device = plan.device;
  out.predicted_step_seconds = plan.predicted_step_seconds.value_or(kNaN);
  out.steps = steps.size() - warmup;
  for (size_t i = 0; i < records.phases.size(); ++i) {
    std::vector<double> values;
    for (size_t k = warmup; k < steps.size(); ++k) values.push_back(phase(steps[k]->phase_seconds, i));
    const double measured = median(values), predicted = phase(plan.predicted_phase_seconds, i);
    if (std::isfinite(measured)) out.measured[records.phases[i]] = measured;
    if (std::isfinite(predicted)) out.predicted[records.phases[i]] = predicted;
  }
  return out;
}

std::string render_report(const RunRecords& records, const ReportOptions& options) {
  if (records.starts.empty())
    throw Error(records.source + ": no \"start\" record: nothing to report");
  View v{records, latest_steps(records)};
  for (const StepRecord* s : v.steps) v.max_step = std::max(v.max_step, s->step);
  for (const auto& c : records.checkpoints) v.max_step = std::max(v.max_step, c.step);
  for (const auto& s : records.starts) v.max_step = std::max(v.max_step, s.resumed_from);
  // The timeline shows superseded steps too.
  for (const auto& s : records.steps) v.max_step = std::max(v.max_step, s.step);

  const std::string job = options.job.empty() ? "(unknown job)" : options.job;
  std::vector<std::string> left_out;
  const std::vector<PhaseRow> rows = phase_rows(v, left_out);
  std::string html =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"color-scheme\" content=\"light\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>" +
      escape("kubetrain run report: " + job) + "</title>\n<style>" + kStyle +
      "</style>\n</head>\n<body>\n<h1>" + escape("Run report: " + job) + "</h1>\n" +
      "<p class=\"source\">" + escape("from " + records.source + " (written by rank 0)") + "</p>\n";
  if (!records.warnings.empty()) {
    html += "<ul class=\"warnings\">\n";
    for (const auto& w : records.warnings) html += "<li>" + escape(w) + "</li>\n";
    html += "</ul>\n";
  }
  html += header_table(v, options);
  html += "<h2>Training</h2>\n" + loss_plot(v) + tokens_plot(v);
  html += "<h2>Where the step time goes</h2>\n" + phase_plot(rows, left_out) + phase_table(rows);
  html += "<h2>Checkpoints and restarts</h2>\n" + timeline_plot(v) + events_table(records);
  html += "</body>\n</html>\n";
  return html;
}

std::string find_steps_log(const std::string& run_dir) {
  std::error_code ec;
  if (fs::is_regular_file(run_dir, ec)) return run_dir;
  if (!fs::is_directory(run_dir, ec)) throw Error(run_dir + ": no such file or directory");
  for (const fs::path& candidate :
       {fs::path(run_dir) / "checkpoints" / "steps.jsonl", fs::path(run_dir) / "steps.jsonl"})
    if (fs::is_regular_file(candidate, ec)) return candidate.string();
  throw Error(run_dir + ": no step log (looked for checkpoints/steps.jsonl and steps.jsonl)");
}

std::vector<std::string> write_report(const std::string& steps_path, const std::string& html_path,
                                      const ReportOptions& options) {
  const RunRecords records = load_steps_log(steps_path);
  const std::string html = render_report(records, options);
  const std::string tmp = html_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write " + tmp + ": " + std::strerror(errno));
    out << html;
    out.close();
    if (!out) throw Error("cannot write " + tmp + ": " + std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, html_path, ec);
  if (ec) {
    fs::remove(tmp);
    throw Error("cannot write " + html_path + ": " + ec.message());
  }
  return records.warnings;
}

void report_after_run(const std::string& steps_path, const std::string& html_path,
                      const std::string& job) {
  std::error_code ec;
  if (!fs::exists(steps_path, ec)) return;
  try {
    for (const auto& warning : write_report(steps_path, html_path, ReportOptions{job}))
      std::fprintf(stderr, "kubetrain: warning: %s\n", warning.c_str());
    std::printf("report: %s\n", html_path.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "kubetrain: no report: %s\n", e.what());
  }
  std::fflush(stdout);
}

}  // namespace kt::cli

#include "telemetry/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <type_traits>

#include "api/error.h"

namespace kt::telemetry {

// ---- values --------------------------------------------------------------------------------

void Counter::inc(double amount) {
  KT_CHECK(amount >= 0, "a counter only goes up; inc(" + format_value(amount) + ")");
  value_.fetch_add(amount, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), bucket_counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  // First bucket with value <= bound; NaN matches none and lands in +Inf, as in client_golang.
  const auto bucket = std::partition_point(upper_bounds_.begin(), upper_bounds_.end(),
                                           [value](double bound) { return !(value <= bound); });
  const auto index = static_cast<std::size_t>(bucket - upper_bounds_.begin());
  std::lock_guard lock(mutex_);
  ++bucket_counts_[index];
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot snapshot;
  snapshot.upper_bounds = upper_bounds_;
  std::lock_guard lock(mutex_);
  snapshot.cumulative.reserve(bucket_counts_.size());
  for (std::uint64_t n : bucket_counts_) {
    snapshot.count += n;
    snapshot.cumulative.push_back(snapshot.count);
  }
  snapshot.sum = sum_;
  return snapshot;
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  KT_CHECK(start > 0 && factor > 1 && count > 0,
           "exponential_buckets needs start > 0, factor > 1, count > 0");
  std::vector<double> bounds;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

// ---- text format -----------------------------------------------------------------------------

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  // Integers below 1e15 (exact in a double) in plain digits; anything else as the shortest text
  // that parses back to the same double (std::to_chars without precision guarantees that).
  const bool integral = value == std::trunc(value) && std::fabs(value) < 1e15;
  const auto result =
      integral ? std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::fixed)
               : std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

std::string escape_help(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

namespace {

bool is_letter_or_underscore(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// `name="value",…` for one label set, appended to `out` after a comma if `out` is not empty.
void append_labels(std::string& out, const std::vector<std::string>& names,
                   const std::vector<std::string>& values) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (!out.empty()) out += ',';
    out += names[i];
    out += "=\"";
    out += escape_label_value(values[i]);
    out += '"';
  }
}

// One sample line: `name{labels} value`, braces only when there are labels.
void append_sample(std::string& out, const std::string& name, const std::string& labels,
                   double value) {
  out += name;
  if (!labels.empty()) {
    out += '{';
    out += labels;
    out += '}';
  }
  out += ' ';
  out += format_value(value);
  out += '\n';
}

template <typename Metric>
constexpr const char* type_name() {
  if constexpr (std::is_same_v<Metric, Counter>) {
    return "counter";
  } else if constexpr (std::is_same_v<Metric, Gauge>) {
    return "gauge";
  } else {
    static_assert(std::is_same_v<Metric, Histogram>);
    return "histogram";
  }
}

void check_label_names(const std::string& metric, const std::vector<std::string>& names,
                       const Labels& const_labels, bool histogram) {
  std::set<std::string> seen;
  for (const auto& [name, value] : const_labels) seen.insert(name);
  for (const auto& name : names) {
    KT_CHECK(is_valid_label_name(name), metric + ": invalid label name \"" + name + "\"");
    KT_CHECK(!(histogram && name == "le"), metric + ": \"le\" is reserved in histograms");
    KT_CHECK(seen.insert(name).second,
             metric + ": label \"" + name + "\" given twice (or is a constant label)");
  }
  KT_CHECK(!(histogram && seen.count("le")), metric + ": \"le\" is reserved in histograms");
}

void check_metric_name(const std::string& name, bool counter) {
  KT_CHECK(is_valid_metric_name(name), "invalid metric name \"" + name + "\"");
  if (counter) {
    KT_CHECK(ends_with(name, "_total"), "counter name \"" + name + "\" must end in _total");
  } else {
    KT_CHECK(!ends_with(name, "_total"), "only counter names end in _total: \"" + name + "\"");
  }
}

}  // namespace

bool is_valid_metric_name(const std::string& name) {
  if (name.empty() || !(is_letter_or_underscore(name[0]) || name[0] == ':')) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return is_letter_or_underscore(c) || is_digit(c) || c == ':'; });
}

bool is_valid_label_name(const std::string& name) {
  if (name.empty() || !is_letter_or_underscore(name[0])) return false;
  if (name.rfind("__", 0) == 0) return false;  // reserved for Prometheus' internal use
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return is_letter_or_underscore(c) || is_digit(c); });
}

// ---- families ------------------------------------------------------------------------------

template <typename Metric>
Family<Metric>::Family(std::string name, std::string help, std::vector<std::string> label_names,
                       std::vector<double> histogram_bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      histogram_bounds_(std::move(histogram_bounds)) {
  if (label_names_.empty()) with({});
}

template <typename Metric>
void Family<Metric>::remove(const std::vector<std::string>& label_values) {
  std::lock_guard lock(mutex_);
  children_.erase(label_values);
}

template <typename Metric>
Metric& Family<Metric>::with(const std::vector<std::string>& label_values) {
  KT_CHECK(label_values.size() == label_names_.size(),
           name_ + ": " + std::to_string(label_values.size()) + " label values for " +
               std::to_string(label_names_.size()) + " label names");
  std::lock_guard lock(mutex_);
  auto it = children_.find(label_values);
  if (it == children_.end()) {
    std::unique_ptr<Metric> child;
    if constexpr (std::is_same_v<Metric, Histogram>) {
      child = std::make_unique<Histogram>(histogram_bounds_);
    } else {
      child = std::make_unique<Metric>();
    }
    it = children_.emplace(label_values, std::move(child)).first;
  }
  return *it->second;
}

template <typename Metric>
void Family<Metric>::render(std::string& out, const std::string& const_labels) const {
  std::lock_guard lock(mutex_);
  if (children_.empty()) return;
  out += "# HELP " + name_ + ' ' + escape_help(help_) + '\n';
  out += "# TYPE " + name_ + ' ' + type_name<Metric>() + '\n';
  for (const auto& [label_values, child] : children_) {
    std::string labels = const_labels;
    append_labels(labels, label_names_, label_values);
    if constexpr (std::is_same_v<Metric, Histogram>) {
      const Histogram::Snapshot snapshot = child->snapshot();
      const std::string prefix = labels.empty() ? "le=\"" : labels + ",le=\"";
      for (std::size_t i = 0; i < snapshot.cumulative.size(); ++i) {
        const bool is_inf = i == snapshot.upper_bounds.size();
        const std::string le = is_inf ? "+Inf" : format_value(snapshot.upper_bounds[i]);
        append_sample(out, name_ + "_bucket", prefix + le + '"',
                      static_cast<double>(snapshot.cumulative[i]));
      }
      append_sample(out, name_ + "_sum", labels, snapshot.sum);
      append_sample(out, name_ + "_count", labels, static_cast<double>(snapshot.count));
    } else {
      append_sample(out, name_, labels, child->value());
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- registry ------------------------------------------------------------------------------

Registry::Registry(Labels const_labels) : const_labels_(std::move(const_labels)) {
  std::vector<std::string> names, values;
  for (const auto& [name, value] : const_labels_) {
    names.push_back(name);
    values.push_back(value);
  }
  check_label_names("constant labels", names, {}, /*histogram=*/false);
  append_labels(rendered_const_labels_, names, values);
}

template <typename Metric>
Family<Metric>& Registry::add(std::unique_ptr<Family<Metric>> family) {
  Family<Metric>& result = *family;
  std::lock_guard lock(mutex_);
  const bool inserted = families_.emplace(family->name(), std::move(family)).second;
  KT_CHECK(inserted, "metric \"" + result.name() + "\" registered twice");
  return result;
}

Family<Counter>& Registry::counter(const std::string& name, const std::string& help,
                                   const std::vector<std::string>& label_names) {
  check_metric_name(name, /*counter=*/true);
  check_label_names(name, label_names, const_labels_, /*histogram=*/false);
  return add(std::make_unique<Family<Counter>>(name, help, label_names));
}

Family<Gauge>& Registry::gauge(const std::string& name, const std::string& help,
                               const std::vector<std::string>& label_names) {
  check_metric_name(name, /*counter=*/false);
  check_label_names(name, label_names, const_labels_, /*histogram=*/false);
  return add(std::make_unique<Family<Gauge>>(name, help, label_names));
}

Family<Histogram>& Registry::histogram(const std::string& name, const std::string& help,
                                       const std::vector<double>& upper_bounds,
                                       const std::vector<std::string>& label_names) {
  check_metric_name(name, /*counter=*/false);
  check_label_names(name, label_names, const_labels_, /*histogram=*/true);
  std::vector<double> bounds = upper_bounds;
  if (!bounds.empty() && bounds.back() == INFINITY) bounds.pop_back();  // +Inf is implied
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    KT_CHECK(std::isfinite(bounds[i]), name + ": bucket bounds must be finite");
    KT_CHECK(i == 0 || bounds[i - 1] < bounds[i],
             name + ": bucket bounds must be strictly increasing");
  }
  return add(std::make_unique<Family<Histogram>>(name, help, label_names, std::move(bounds)));
}

void Registry::on_expose(std::function<void()> refresh) {
  std::lock_guard lock(mutex_);
  refreshers_.push_back(std::move(refresh));
}

std::string Registry::expose() const {
  std::vector<std::function<void()>> refreshers;
  {
    std::lock_guard lock(mutex_);
    refreshers = refreshers_;
  }
  for (const auto& refresh : refreshers) refresh();
  std::string out;
  std::lock_guard lock(mutex_);
  for (const auto& [name, family] : families_) family->render(out, rendered_const_labels_);
  return out;
}

}  // namespace kt::telemetry

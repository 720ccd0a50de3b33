// A small thread-safe metrics registry that renders the Prometheus text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
//
//   Registry registry({{"job", "gpt"}, {"rank", "0"}});          // constant labels
//   auto& bytes = registry.counter("kubetrain_worker_transfer_bytes_total",
//                                  "Bytes copied between host and device.", {"direction"});
//   bytes.with({"h2d"}).inc(4096);
//   std::string text = registry.expose();
//
// Families and their children live as long as the registry; references to them stay valid, so
// hot paths look a child up once and keep the reference. Misuse (a bad name, a negative counter
// increment, the wrong number of label values) is a bug and fails a KT_CHECK.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace kt::telemetry {

// Label name/value pairs, in the order they are rendered.
using Labels = std::vector<std::pair<std::string, std::string>>;

// A value that only goes up (requests served, bytes copied). Lock-free.
class Counter {
 public:
  void inc(double amount = 1);  // amount >= 0
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down (loss, bytes in use). Lock-free.
class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  void inc(double amount = 1) { value_.fetch_add(amount, std::memory_order_relaxed); }
  void dec(double amount = 1) { value_.fetch_sub(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Counts observations into fixed buckets `value <= upper_bound` plus an implicit +Inf bucket,
// and keeps their sum. One mutex, so that a snapshot's buckets, sum and count agree.
class Histogram {
 public:
  // `upper_bounds`: finite and strictly increasing (checked by Registry::histogram).
  explicit Histogram(std::vector<double> upper_bounds);

  void observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;       // finite bounds; +Inf is implied
    std::vector<std::uint64_t> cumulative;  // size upper_bounds.size() + 1; last one is +Inf
    double sum = 0;
    std::uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> upper_bounds_;
  mutable std::mutex mutex_;
  std::vector<std::uint64_t> bucket_counts_;  // per bucket, not cumulative; last one is +Inf
  double sum_ = 0;
};

// `count` bounds start, start·factor, start·factor², … (start > 0, factor > 1).
std::vector<double> exponential_buckets(double start, double factor, int count);

namespace detail {

// What Registry needs from a family of any type.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  // Appends HELP, TYPE and one line per sample; nothing when the family has no children.
  // `const_labels` is the registry's rendered constant labels (`job="a",rank="0"` or "").
  virtual void render(std::string& out, const std::string& const_labels) const = 0;
};

}  // namespace detail

// Metrics of one name and type that differ by label values: a "metric family".
template <typename Metric>
class Family : public detail::FamilyBase {
 public:
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> histogram_bounds = {});

  // The child with these label values (one per label name, in order), created on first use.
  // The reference stays valid as long as the registry.
  Metric& with(const std::vector<std::string>& label_values);
  // Drops the child with these label values (its series ends), as for an object that is gone.
  // References from with() to that child dangle after it: use it only on families whose
  // children are looked up by with() at each use.
  void remove(const std::vector<std::string>& label_values);

  const std::string& name() const { return name_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  void render(std::string& out, const std::string& const_labels) const override;

 private:
  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> histogram_bounds_;  // used by Family<Histogram> only
  mutable std::mutex mutex_;
  // Sorted by label values, which is the order of the exposition.
  std::map<std::vector<std::string>, std::unique_ptr<Metric>> children_;
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

// Owns metric families and renders them. Thread-safe; not copyable or movable (families and
// children are handed out by reference).
class Registry {
 public:
  Registry() = default;
  // `const_labels` are added to every sample, before the family's own labels.
  explicit Registry(Labels const_labels);
  // Registry({{"job", "gpt"}}): without this overload one pair would be ambiguous with copying.
  explicit Registry(std::initializer_list<std::pair<std::string, std::string>> const_labels)
      : Registry(Labels(const_labels)) {}
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registers a family. Names follow Prometheus: metric [a-zA-Z_:][a-zA-Z0-9_:]*, label
  // [a-zA-Z_][a-zA-Z0-9_]* without a "__" prefix; counter names end in "_total" and other names
  // don't; a name is registered once. A family without labels has its one child at zero from
  // the start, so it is exposed before the first update.
  Family<Counter>& counter(const std::string& name, const std::string& help,
                           const std::vector<std::string>& label_names = {});
  Family<Gauge>& gauge(const std::string& name, const std::string& help,
                       const std::vector<std::string>& label_names = {});
  // `upper_bounds`: finite, strictly increasing; +Inf is added. "le" is not a usable label.
  Family<Histogram>& histogram(const std::string& name, const std::string& help,
                               const std::vector<double>& upper_bounds,
                               const std::vector<std::string>& label_names = {});

  // The text exposition format 0.0.4: families sorted by name, children by label values.
  std::string expose() const;

  // `refresh` runs at the start of every expose(), before anything is rendered: for values read
  // when scraped (a process's CPU time and memory). It must not call expose().
  void on_expose(std::function<void()> refresh);

 private:
  template <typename Metric>
  Family<Metric>& add(std::unique_ptr<Family<Metric>> family);

  Labels const_labels_;
  std::string rendered_const_labels_;
  mutable std::mutex mutex_;  // guards families_ and refreshers_
  std::map<std::string, std::unique_ptr<detail::FamilyBase>> families_;
  std::vector<std::function<void()>> refreshers_;
};

// Formatting helpers of the exposition format, public for tests and other exporters.
// A sample value: integers without exponent ("1048576"), other values shortest round-trip
// ("0.1", "1e-07"), "+Inf", "-Inf", "NaN".
std::string format_value(double value);
// HELP text: escapes backslash and newline.
std::string escape_help(const std::string& text);
// Label value: escapes backslash, double quote and newline.
std::string escape_label_value(const std::string& value);

bool is_valid_metric_name(const std::string& name);
bool is_valid_label_name(const std::string& name);

}  // namespace kt::telemetry

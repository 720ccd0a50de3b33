#include "api/enums.h"

#include <array>
#include <utility>

namespace kt::api {
namespace {

template <class E>
struct Names;

template <>
struct Names<Precision> {
  static constexpr std::array<std::pair<Precision, std::string_view>, 2> kTable{
      {{Precision::kBf16, "bf16"}, {Precision::kFp32, "fp32"}}};
};
template <>
struct Names<DeviceKind> {
  static constexpr std::array<std::pair<DeviceKind, std::string_view>, 2> kTable{
      {{DeviceKind::kCuda, "cuda"}, {DeviceKind::kCpu, "cpu"}}};
};
template <>
struct Names<Recompute> {
  static constexpr std::array<std::pair<Recompute, std::string_view>, 3> kTable{
      {{Recompute::kNone, "none"},
       {Recompute::kCommAware, "commAware"},
       {Recompute::kFull, "full"}}};
};
template <>
struct Names<OffloadMode> {
  static constexpr std::array<std::pair<OffloadMode, std::string_view>, 3> kTable{
      {{OffloadMode::kNone, "none"},
       {OffloadMode::kOptimizer, "optimizer"},
       {OffloadMode::kWindow, "window"}}};
};
template <>
struct Names<DataSource> {
  static constexpr std::array<std::pair<DataSource, std::string_view>, 2> kTable{
      {{DataSource::kSynthetic, "synthetic"}, {DataSource::kTokens, "tokens"}}};
};
template <>
struct Names<CleanPodPolicy> {
  static constexpr std::array<std::pair<CleanPodPolicy, std::string_view>, 3> kTable{
      {{CleanPodPolicy::kAll, "All"},
       {CleanPodPolicy::kRunning, "Running"},
       {CleanPodPolicy::kNone, "None"}}};
};
template <>
struct Names<UpdateDevice> {
  static constexpr std::array<std::pair<UpdateDevice, std::string_view>, 2> kTable{
      {{UpdateDevice::kGpu, "gpu"}, {UpdateDevice::kCpu, "cpu"}}};
};

template <>
struct Names<ClaimRetention> {
  static constexpr std::array<std::pair<ClaimRetention, std::string_view>, 2> kTable{
      {{ClaimRetention::kDelete, "Delete"}, {ClaimRetention::kRetain, "Retain"}}};
};

template <>
struct Names<GangScheduler> {
  static constexpr std::array<std::pair<GangScheduler, std::string_view>, 4> kTable{
      {{GangScheduler::kNone, "None"},
       {GangScheduler::kCoscheduling, "Coscheduling"},
       {GangScheduler::kVolcano, "Volcano"},
       {GangScheduler::kKueue, "Kueue"}}};
};

template <class E>
std::string_view name_of(E v) {
  for (const auto& [value, name] : Names<E>::kTable)
    if (value == v) return name;
  return "?";
}

}  // namespace

template <class E>
std::optional<E> parse_enum(std::string_view text) {
  for (const auto& [value, name] : Names<E>::kTable)
    if (name == text) return value;
  return std::nullopt;
}

template <class E>
std::string enum_choices() {
  std::string out;
  for (const auto& [value, name] : Names<E>::kTable) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

#define KT_ENUM(E)                                                \
  std::string_view to_string(E v) {                               \
    return name_of(v);                                            \
  }                                                               \
  template std::optional<E> parse_enum<E>(std::string_view text); \
  template std::string enum_choices<E>();

KT_ENUM(Precision)
KT_ENUM(DeviceKind)
KT_ENUM(Recompute)
KT_ENUM(OffloadMode)
KT_ENUM(DataSource)
KT_ENUM(CleanPodPolicy)
KT_ENUM(UpdateDevice)
KT_ENUM(ClaimRetention)
KT_ENUM(GangScheduler)
#undef KT_ENUM

}  // namespace kt::api

// The enumerations shared by the TrainingJob and the Plan, with their manifest spellings.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kt::api {

enum class Precision { kBf16, kFp32 };
enum class DeviceKind { kCuda, kCpu };
enum class Recompute { kNone, kCommAware, kFull };
enum class OffloadMode { kNone, kOptimizer, kWindow };
enum class DataSource { kSynthetic, kTokens };
enum class CleanPodPolicy { kAll, kRunning, kNone };
enum class UpdateDevice { kGpu, kCpu };
// What becomes of the checkpoint PVC the operator made when its job is deleted (as StatefulSet's
// persistentVolumeClaimRetentionPolicy.whenDeleted).
enum class ClaimRetention { kDelete, kRetain };
// Who admits a job's gang all at once (spec.runPolicy.schedulingPolicy.gangScheduler):
// scheduler-plugins' coscheduling or Volcano through a PodGroup, or Kueue's plain pod groups.
enum class GangScheduler { kNone, kCoscheduling, kVolcano, kKueue };

std::string_view to_string(Precision v);
std::string_view to_string(DeviceKind v);
std::string_view to_string(Recompute v);
std::string_view to_string(OffloadMode v);
std::string_view to_string(DataSource v);
std::string_view to_string(CleanPodPolicy v);
std::string_view to_string(UpdateDevice v);
std::string_view to_string(ClaimRetention v);
std::string_view to_string(GangScheduler v);

// Parse the manifest spelling; nullopt when unknown. `choices` lists the spellings for messages.
template <class E>
std::optional<E> parse_enum(std::string_view text);
template <class E>
std::string enum_choices();

}  // namespace kt::api

#include "api/measured_profile.h"

#include <cmath>
#include <string_view>

#include "api/decode.h"
#include "api/error.h"

namespace kt::api {
namespace {

constexpr const char* kApiVersion = "kubetrain.dev/v1alpha1";
constexpr const char* kKind = "HardwareProfile";
constexpr size_t kMaxFileBytes = 1 << 20;

// The figures a measured profile may set: its spec key, the field, and the range it must lie in
// (every figure finite; rates and sizes positive).
struct SpecField {
  const char* key;
  double HardwareProfile::*field;
  double min, max;  // inclusive; min 0 means "> 0" unless zero_ok
  bool zero_ok;
};
constexpr SpecField kSpecFields[] = {
    {"peakBf16Flops", &HardwareProfile::peak_bf16_flops, 0, 1e18, false},
    {"peakFp32Flops", &HardwareProfile::peak_fp32_flops, 0, 1e18, false},
    {"achievedFraction", &HardwareProfile::achieved_fraction, 0, 1, false},
    {"achievedFractionBf16", &HardwareProfile::achieved_fraction_bf16, 0, 1, true},
    {"memoryBandwidth", &HardwareProfile::memory_bandwidth, 0, 1e15, false},
    {"hostLinkBandwidth", &HardwareProfile::host_link_bandwidth, 0, 1e15, false},
    {"intraAllreduceBusbw", &HardwareProfile::intra_allreduce_busbw, 0, 1e15, false},
    {"interNodeBandwidth", &HardwareProfile::inter_node_bandwidth, 0, 1e15, false},
    {"allreduceLatency", &HardwareProfile::allreduce_latency, 0, 10, true},
    {"cpuAdamParamsPerCore", &HardwareProfile::cpu_adam_params_per_core, 0, 1e15, false},
    {"overlapInterference", &HardwareProfile::overlap_interference, 0, 4, true},
    {"recomputeRateRatio", &HardwareProfile::recompute_rate_ratio, 0.5, 3, false},
    {"computeScale", &HardwareProfile::compute_scale, 0.01, 100, false},
    {"tpCommScale", &HardwareProfile::tp_comm_scale, 0.01, 100, false},
    {"dpCommScale", &HardwareProfile::dp_comm_scale, 0.01, 100, false},
    {"transferScale", &HardwareProfile::transfer_scale, 0.01, 100, false},
    {"cpuOptimizerScale", &HardwareProfile::cpu_optimizer_scale, 0.01, 100, false},
};

// The kind of node a profile is for: "cpu" for CPU nodes, else the GPU product's profile.
bool is_for(const HardwareProfile& profile, const Node& node) {
  if (node.is_cpu_node()) return profile.is_cpu;
  const HardwareProfile* builtin = find_profile(node.gpu_product);
  return !profile.is_cpu && builtin && builtin->name == profile.name;
}

}  // namespace

Json to_json(const MeasuredProfile& measured) {
  Json spec = Json::object();
  for (const SpecField& f : kSpecFields) spec[f.key] = measured.profile.*f.field;
  spec["bf16"] = measured.profile.has_bf16;
  Json provenance = Json::object();
  for (const auto& [k, v] : measured.provenance) provenance[k] = v;
  Json measurements = Json::object();
  for (const auto& [k, v] : measured.measurements) measurements[k] = v;
  return {{"apiVersion", kApiVersion},
          {"kind", kKind},
          {"metadata", {{"name", measured.profile.name}}},
          {"provenance", provenance},
          {"spec", spec},
          {"measurements", measurements}};
}

MeasuredProfile decode_measured_profile(const Json& doc) {
  if (!doc.is_object()) throw FieldError("(document)", "a HardwareProfile must be an object");
  ObjectReader top(doc, "");
  const auto api_version = top.string("apiVersion");
  if (api_version != kApiVersion)
    top.fail("apiVersion", "must be " + std::string(kApiVersion) + ", got " +
                               (api_version ? "\"" + *api_version + "\"" : "nothing"));
  const auto kind = top.string("kind");
  if (kind != kKind)
    top.fail("kind", "must be " + std::string(kKind) + ", got " +
                         (kind ? "\"" + *kind + "\"" : "nothing"));
  ObjectReader metadata = top.object("metadata");
  const auto name = metadata.string("name");
  metadata.allow_unknown();
  metadata.finish();
  if (!name || name->empty())
    throw FieldError("metadata.name", "must name the node kind (a built-in profile: cpu, H200, ...)");
  const HardwareProfile* base = find_profile(*name);
  if (!base) {
    std::string known = "cpu";
    for (const auto& p : builtin_profiles()) known += ", " + p.name;
    throw FieldError("metadata.name", "\"" + name->substr(0, 100) +
                                          "\" is no node kind with a built-in profile (known: " +
                                          known + ")");
  }
  MeasuredProfile out;
  out.profile = *base;
  out.provenance = top.string_map("provenance");
  ObjectReader spec = top.object("spec");
  for (const SpecField& f : kSpecFields) {
    const auto value = spec.number(f.key);
    if (!value) continue;
    // (The profiler clamps its figures into these ranges, so a bound itself is valid.)
    const bool inclusive = f.zero_ok || f.min > 0;
    const bool ok =
        std::isfinite(*value) && *value <= f.max && (inclusive ? *value >= f.min : *value > f.min);
    if (!ok) {
      const std::string lo = f.min == 0 ? "0" : Json(f.min).dump();
      throw FieldError(spec.path_of(f.key),
                       Json(*value).dump() + " must be " + (inclusive ? "between " : "above ") +
                           lo + (inclusive ? " and " : " and at most ") + Json(f.max).dump());
    }
    out.profile.*f.field = *value;
  }
  // CPU profiles: whether the CPU has bf16 matmuls (GPU profiles: whether bf16 is native).
  out.profile.has_bf16 = spec.boolean("bf16").value_or(out.profile.has_bf16);
  spec.finish();
  const Json measurements = top.raw("measurements");
  if (!measurements.is_null()) {
    if (!measurements.is_object()) throw FieldError("measurements", "must be an object of numbers");
    for (const auto& [k, v] : measurements.items()) {
      if (!v.is_number() || !std::isfinite(v.get<double>()))
        throw FieldError("measurements." + k.substr(0, 100), "must be a finite number, got " +
                                                                 describe_json(v));
      out.measurements[k] = v.get<double>();
    }
  }
  top.finish();
  out.profile.measured = true;
  out.profile.source = "measured" + (out.provenance.count("host")
                                         ? " on " + out.provenance.at("host")
                                         : std::string()) +
                       (out.provenance.count("date") ? " " + out.provenance.at("date") : "");
  return out;
}

MeasuredProfile load_measured_profile(const std::string& path) {
  const std::string text = read_file(path);
  if (text.size() > kMaxFileBytes)
    throw Error(path + ": " + std::to_string(text.size()) + " bytes; a hardware profile is at most " +
                std::to_string(kMaxFileBytes));
  const auto first = text.find_first_not_of(" \t\r\n");
  const Json doc = first != std::string::npos && text[first] == '{' ? parse_json(text, path)
                                                                     : yaml_to_json(text, path);
  try {
    return decode_measured_profile(doc);
  } catch (const FieldError& e) {
    throw Error(path + ": " + e.what());
  }
}

int apply_measured_profiles(Inventory& inventory, const std::vector<MeasuredProfile>& profiles) {
  int applied = 0;
  for (Node& node : inventory.nodes)
    for (const MeasuredProfile& m : profiles)
      if (is_for(m.profile, node)) {
        const double gpu_memory = node.hardware.memory_bytes;
        node.hardware = m.profile;
        if (!node.is_cpu_node()) node.hardware.memory_bytes = gpu_memory;
        ++applied;
        break;
      }
  return applied;
}

}  // namespace kt::api

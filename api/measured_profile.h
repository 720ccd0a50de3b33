// Measured hardware profiles (docs/PLANNER.md, "Hardware profiles"): what `kubetrain-worker
// profile` measured on one node kind, in the built-in profiles' schema, with its provenance. The
// planner takes the most specific figures for a node: a measured profile for its kind (its GPU
// product, or "cpu" for a CPU node), else the built-in profile with the node's kubetrain.dev/*
// annotations.
//
//   apiVersion: kubetrain.dev/v1alpha1
//   kind: HardwareProfile
//   metadata: {name: cpu}            # the node kind: a built-in profile's name or alias
//   provenance: {host: ..., cpu: ..., gpu: ..., driver: ..., date: ..., version: ..., command: ...}
//   spec:                            # any figure left out is the built-in's
//     peakFp32Flops: 1.2e11          # per core on a CPU node, per GPU otherwise (FLOP/s)
//     achievedFraction: 0.62         # whole-step rate / peak, at the measured model's shapes
//     ...                            # see kSpecFields in measured_profile.cpp
//   measurements: {...}              # the raw figures behind spec (numbers), for the record
#pragma once

#include <map>
#include <string>
#include <vector>

#include "api/hardware.h"
#include "api/inventory.h"
#include "api/yaml_json.h"

namespace kt::api {

struct MeasuredProfile {
  HardwareProfile profile;  // the built-in of its kind with the measured figures over it
  std::map<std::string, std::string> provenance;
  std::map<std::string, double> measurements;
};

Json to_json(const MeasuredProfile& measured);
// Throws FieldError with paths such as "spec.peakFp32Flops" (unknown fields too, as kubectl's
// strict validation does); `source` is prefixed to the message by the caller.
MeasuredProfile decode_measured_profile(const Json& doc);
// A file (YAML or JSON, at most 1 MiB): errors are "FILE: spec.x: problem".
MeasuredProfile load_measured_profile(const std::string& path);

// Every node whose kind a profile is for takes the profile's figures (its own GPU memory kept).
// Returns how many nodes did.
int apply_measured_profiles(Inventory& inventory, const std::vector<MeasuredProfile>& profiles);

}  // namespace kt::api

// A named view of an fp32 tensor the worker owns, with the slice of the logical tensor it holds.
// Checkpoints and model import/export speak in these; nothing here owns memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kt::worker {

struct TensorView {
  std::string name;            // llm.c-style names: "wte", "h.3.qkvw"... see worker/gpt.h
  std::vector<int64_t> shape;  // the shape of what this rank holds
  float* data = nullptr;
  // The logical (unsharded) tensor and where this rank's slice starts in it. Empty: the slice is
  // the whole tensor. A tensor-parallel rank holding rows [r0, r1) of a (3C, C) weight has
  // logical_shape {3C, C} and offset {r0, 0}.
  std::vector<int64_t> logical_shape;
  std::vector<int64_t> offset;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  uint64_t bytes() const { return static_cast<uint64_t>(numel()) * sizeof(float); }
};

// "[12,2304,768]": a shape as messages print it.
inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

}  // namespace kt::worker

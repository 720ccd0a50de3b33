// GPT model dimensions, presets and the closed-form counts the planner builds on.
// Letters: L layers, h hidden, a heads, f ffn hidden, V vocabulary (padded), s sequence length.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kt::api {

struct ModelDims {
  int64_t layers = 0;      // L
  int64_t hidden = 0;      // h
  int64_t heads = 0;       // a
  int64_t ffn_hidden = 0;  // f (4h for GPT-2)
  int64_t vocab = 0;       // V as the tokenizer has it (50257 for GPT-2)
  int64_t seq_len = 0;     // s

  // llm.c pads the vocabulary to a multiple of 128 (50257 -> 50304) for fast kernels; the
  // padded rows are real parameters (never used as targets).
  int64_t padded_vocab() const { return (vocab + 127) / 128 * 128; }
  bool operator==(const ModelDims&) const = default;
};

// The largest values a TrainingJob may ask for, enforced by validate() and by the CRD's schema
// (`maximum`, checked equal by crd_test). Far above what is trained today (GPT-3 175B: L 96,
// h 12288; Llama 3.1 405B: L 126, h 16384, f 53248, V 128256, s 131072), and low enough that every
// product the planner and the worker form (L·h², B·s·V, parameters × bytes) stays inside int64.
struct ModelLimits {
  static constexpr int64_t kLayers = 4096;
  static constexpr int64_t kHidden = 262144;           // 2^18
  static constexpr int64_t kHeads = 16384;
  static constexpr int64_t kFfnHidden = 1048576;       // 2^20
  static constexpr int64_t kVocab = 4194304;           // 2^22
  static constexpr int64_t kSeqLen = 1048576;          // 2^20 tokens
  static constexpr double kParameters = 1e15;          // the total, however the dims combine
};

struct ModelPreset {
  std::string name;
  ModelDims dims;
  std::string description;  // what it is and where the dims come from
};

const std::vector<ModelPreset>& model_presets();
// nullptr when unknown.
const ModelPreset* find_model_preset(const std::string& name);

// Parameters of one transformer layer: ln1 (2h) + qkv (3h²+3h) + proj (h²+h) + ln2 (2h)
// + fc1 (hf+f) + fc2 (fh+h) = 4h² + 2hf + 9h + f  (= 12h² + 13h when f = 4h).
int64_t layer_parameters(const ModelDims& m);
// Total: L·layer + token embedding V·h (tied with the LM head) + positions s·h + final LN 2h.
// gpt2-124m: 124,475,904 with V padded to 50304 (the number llm.c prints).
int64_t parameter_count(const ModelDims& m);

}  // namespace kt::api

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

#include "api/model.h"

namespace kt::api {

const std::vector<ModelPreset>& model_presets() {
  // GPT-2 dims: Radford et al. 2019, Table 2, and the released configs (n_layer, n_embd, n_head,
  // n_ctx = 1024, vocab 50257). gpt-7b: the "GPT-3 6.7B" row of Brown et al. 2020, Table 2.1
  // (32 layers, d_model 4096, 32 heads, n_ctx 2048), with the GPT-2 vocabulary and layout.
  static const std::vector<ModelPreset> kPresets = {
      {"tiny",
       {2, 64, 4, 256, 256, 64},
       "2-layer toy (h=64, 4 heads, vocab 256, seq 64) for tests and CPU smoke runs"},
      {"gpt2-124m", {12, 768, 12, 3072, 50257, 1024}, "GPT-2 small (Radford et al. 2019)"},
      {"gpt2-350m", {24, 1024, 16, 4096, 50257, 1024}, "GPT-2 medium (Radford et al. 2019)"},
      {"gpt2-774m", {36, 1280, 20, 5120, 50257, 1024}, "GPT-2 large (Radford et al. 2019)"},
      {"gpt2-1.5b", {48, 1600, 25, 6400, 50257, 1024}, "GPT-2 XL (Radford et al. 2019)"},
      {"gpt-7b",
       {32, 4096, 32, 16384, 50257, 2048},
       "GPT-3 6.7B dims (Brown et al. 2020, Table 2.1) in the GPT-2 layout, 6.66B parameters"},
  };
  return kPresets;
}

const ModelPreset* find_model_preset(const std::string& name) {
  for (const auto& p : model_presets())
    if (p.name == name) return &p;
  return nullptr;
}

int64_t layer_parameters(const ModelDims& m) {
  const int64_t h = m.hidden, f = m.ffn_hidden;
  return 4 * h * h + 2 * h * f + 9 * h + f;
}

int64_t parameter_count(const ModelDims& m) {
  const int64_t h = m.hidden;
  return m.layers * layer_parameters(m) + m.padded_vocab() * h + m.seq_len * h + 2 * h;
}

}  // namespace kt::api

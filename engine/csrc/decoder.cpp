// A pass through every decoder layer in one call, for a model whose every matrix is read from its
// grid (engine/model_runner.py, `native_decoder`). The Python loop it replaces spent a third of a
// one-stream decode step outside the arithmetic: about 15 torch calls per layer, each a dispatch,
// an allocation and a Python frame, 30 layers a step (measured: docs/architecture.md).
//
// Every number is computed as the Python loop computes it, so its passes are bit for bit the
// loop's (tests/test_native_decoder.py): SiLU is ATen's own kernel (at::silu), the norms are
// `rms_norm` below (the loop calls it too), the products are the grid kernels, attention is
// `attend`, and the rotary embedding and the residual sums are the same IEEE products and sums,
// each rounded (the file is built with -ffp-contract=off, so no multiply-add is fused).
#include <ATen/core/Tensor.h>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels.h"

namespace brigade {

at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "rms_norm takes [rows, width] float32 and a float32 weight");
  const auto x = x_in.contiguous();
  const auto w = weight.contiguous();
  const int64_t rows = x.size(0), width = x.size(1);
  TORCH_CHECK(w.numel() == width, "the norm's weight must have the rows' width");
  auto out = x.new_empty(x.sizes());  // x is contiguous: so is this
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float epsilon = static_cast<float>(eps);
  shared_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = xp + r * width;
      float part[kNormLanes] = {};
      int64_t k = 0;
      for (; k + kNormLanes <= width; k += kNormLanes)
        for (int j = 0; j < kNormLanes; ++j) part[j] += row[k + j] * row[k + j];
      for (int j = 0; k < width; ++k, ++j) part[j] += row[k] * row[k];
      for (int half = kNormLanes / 2; half >= 1; half /= 2)
        for (int j = 0; j < half; ++j) part[j] += part[j + half];
      const float scale = 1.0f / std::sqrt(part[0] / static_cast<float>(width) + epsilon);
      float* y = op + r * width;
      for (int64_t i = 0; i < width; ++i) y[i] = wp[i] * (row[i] * scale);
    }
  });
  return out;
}

at::Tensor GridWeight::operator()(const at::Tensor& x, int64_t panel_from) const {
  auto y = low.defined()     ? q4_linear(x, codes, scale, low, panel_from)
           : scale.defined() ? q8_linear(x, codes, scale, panel_from)
                             : half_linear(x, codes, panel_from);
  return bias.defined() ? y.add(bias) : y;
}

Decoder::Decoder(std::vector<DecoderLayer> layers, double eps, int64_t heads, int64_t kv_heads, int64_t head_dim,
                 double scale, int64_t panel_from)
    : layers_(std::move(layers)), eps_(eps), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim),
      scale_(scale), panel_from_(panel_from) {
  TORCH_CHECK(heads % kv_heads == 0 && head_dim % 2 == 0, "heads must be a multiple of the KV heads");
}

// q and k rotated (x * cos + rotate_half(x) * sin, Llama's halves), split into the queries
// [T, heads, d] and the new keys and values side by side [T, kv_heads, 2d], as attend reads them.
void Decoder::rotate(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                     at::Tensor& q, at::Tensor& new_kv) const {
  const int64_t T = qkv.size(0), d = head_dim_, half = d / 2, H = heads_, KVH = kv_heads_;
  const int64_t width = (H + 2 * KVH) * d;
  q = qkv.new_empty({T, H, d});
  new_kv = qkv.new_empty({T, KVH, 2 * d});
  const float* src = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  float* np = new_kv.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    const float* c = cp + t * d;
    const float* s = sp + t * d;
    for (int64_t h = 0; h < H + KVH; ++h) {
      const float* x = src + t * width + h * d;
      float* out = h < H ? qp + (t * H + h) * d : np + (t * KVH + (h - H)) * 2 * d;
      for (int64_t i = 0; i < half; ++i) out[i] = x[i] * c[i] + (-x[i + half]) * s[i];
      for (int64_t i = half; i < d; ++i) out[i] = x[i] * c[i] + x[i - half] * s[i];
    }
    for (int64_t kh = 0; kh < KVH; ++kh) {
      const float* v = src + t * width + (H + KVH + kh) * d;
      std::copy(v, v + d, np + (t * KVH + kh) * 2 * d + d);
    }
  }
}

at::Tensor Decoder::forward(const at::Tensor& hidden_in, const at::Tensor& cos_in, const at::Tensor& sin_in,
                               const std::vector<at::Tensor>& caches, const std::vector<int64_t>& starts,
                               const std::vector<int64_t>& lengths) const {
  TORCH_CHECK(hidden_in.dim() == 2 && hidden_in.scalar_type() == at::kFloat, "hidden must be [tokens, width] float32");
  const auto cos = cos_in.contiguous(), sin = sin_in.contiguous();
  TORCH_CHECK(cos.size(0) == hidden_in.size(0) && cos.size(1) == head_dim_, "cos and sin must be [tokens, head_dim]");
  auto hidden = hidden_in.contiguous();
  for (size_t index = 0; index < layers_.size(); ++index) {
    const auto& layer = layers_[index];
    auto x = rms_norm(hidden, layer.attn_norm, eps_);
    const auto qkv = layer.qkv(x, panel_from_);
    at::Tensor q, new_kv;
    rotate(qkv, cos, sin, q, new_kv);
    const auto attended = attend(q, new_kv, caches, starts, lengths, static_cast<int64_t>(index), scale_, heads_ / kv_heads_);
    hidden = hidden.add(layer.o(attended, panel_from_));
    x = rms_norm(hidden, layer.mlp_norm, eps_);
    const auto gate_up = layer.gate_up(x, panel_from_);
    const int64_t inner = gate_up.size(1) / 2;
    const auto act = at::_ops::silu::call(gate_up.narrow(1, 0, inner)).mul(gate_up.narrow(1, inner, inner));
    hidden = hidden.add(layer.down(act, panel_from_));
  }
  return hidden;
}

}  // namespace brigade

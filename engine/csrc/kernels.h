// Brigade's CPU kernels, built for the machine they run on (engine/kernels.py); bindings.cpp
// exposes them to Python. The kernels include ATen only, and bindings.cpp torch/python.h, not
// <torch/extension.h> (pybind11 and the whole C++ frontend): about 28 s of the compiler's time per
// file against ATen's 8, and a worker's first start waits for the build (on 2 cores: 75 s before,
// 27 s with this and bindings.cpp compiled first).
#pragma once
// The Tensor type and its methods, not ATen/ATen.h (every operator's function): that header was
// 15 of each file's 17 s of compile (2-core AVX2, 2026-12). New tensors come from the methods
// (`new_empty`, `new_zeros`), and the one operator without a method, SiLU, from its op's own
// header (ATen/ops/silu_ops.h): each function's header (ATen/ops/silu.h) costs 4-7 s more.
#include <ATen/core/Tensor.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace brigade {

// [begin, end) cut into pieces of `grain` that the threads take in turn (OpenMP's dynamic
// schedule), not into equal shares fixed up front as at::parallel_for cuts it: where the cores are
// shared (a worker beside its gateway, Redis and clients on two cores), a thread the system puts
// aside leaves its pieces to the others instead of holding the whole pass at the barrier. Which
// thread computes a piece never changes a number (each output is summed by one thread).
template <class F>
inline void shared_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  const int64_t pieces = (end - begin + grain - 1) / grain;
  const int threads = at::get_num_threads();
  if (pieces <= 1 || threads == 1 || at::in_parallel_region()) {
    if (end > begin) f(begin, end);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t p = 0; p < pieces; ++p) f(begin + p * grain, std::min(end, begin + (p + 1) * grain));
}

// x @ W.T for W on a 4-bit (Q4_1: scale, low) or 8-bit (Q8_0: scale) block grid (grid_linear.cpp).
at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                        const at::Tensor& low, int64_t panel_from);
at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                        int64_t panel_from);
// x @ W.T for W whose float32 values are all bfloat16 or float16 (codes: those halves' bits).
at::Tensor half_linear(const at::Tensor& x, const at::Tensor& codes, int64_t panel_from);
// Llama's RMSNorm of each row, y = w * (x * (1 / sqrt(mean(x^2) + eps))), each product rounded as
// Hugging Face's ops round it; the sum of squares in one fixed order (kNormLanes partial sums over
// the row in order, then added pairwise), so a row's bits never depend on the rows beside it
// (decoder.cpp). ATen's composite rms_norm is about ten dispatched ops per call: 61 calls a decode
// step cost about a millisecond of a 7.5 ms step.
constexpr int kNormLanes = 16;
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
// The vector instructions the build uses: "avx512", "avx2" or "scalar".
std::string isa();

// A pass's attention, each query over exactly its keys, in one fixed order (attention.cpp).
at::Tensor attend(const at::Tensor& q, const at::Tensor& new_kv, const std::vector<at::Tensor>& caches,
                     const std::vector<int64_t>& starts, const std::vector<int64_t>& lengths, int64_t layer,
                     double scale, int64_t group);
// The same numbers one key at a time, the order that defines them: what `attend` is held to.
at::Tensor attend_key_by_key(const at::Tensor& q, const at::Tensor& new_kv, const std::vector<at::Tensor>& caches,
                             const std::vector<int64_t>& starts, const std::vector<int64_t>& lengths, int64_t layer,
                             double scale, int64_t group);

// A matrix read from its grid: q4 when `low` is defined, q8 when `scale` is, else halves (bf16 or
// f16, by the codes' type); `bias` added when defined.
struct GridWeight {
  at::Tensor codes, scale, low, bias;
  at::Tensor operator()(const at::Tensor& x, int64_t panel_from) const;
};

struct DecoderLayer {
  at::Tensor attn_norm, mlp_norm;
  GridWeight qkv, o, gate_up, down;
};

// Every decoder layer of a Llama-shaped model on grids, in one call (decoder.cpp).
class Decoder {
 public:
  Decoder(std::vector<DecoderLayer> layers, double eps, int64_t heads, int64_t kv_heads, int64_t head_dim,
          double scale, int64_t panel_from);
  // hidden [tokens, width] after every layer; cos and sin [tokens, head_dim]; the chunks as attend takes them.
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                        const std::vector<at::Tensor>& caches, const std::vector<int64_t>& starts,
                        const std::vector<int64_t>& lengths) const;

 private:
  void rotate(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& q,
              at::Tensor& new_kv) const;
  std::vector<DecoderLayer> layers_;
  double eps_;
  int64_t heads_, kv_heads_, head_dim_;
  double scale_;
  int64_t panel_from_;
};

}  // namespace brigade

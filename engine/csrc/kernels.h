// Brigade's CPU kernels, built for the machine they run on (engine/kernels.py); bindings.cpp
// exposes them to Python.
#pragma once
#include <torch/extension.h>
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
torch::Tensor q4_linear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scale,
                        const torch::Tensor& low, int64_t panel_from);
torch::Tensor q8_linear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scale,
                        int64_t panel_from);
// x @ W.T for W whose float32 values are all bfloat16 or float16 (codes: those halves' bits).
torch::Tensor half_linear(const torch::Tensor& x, const torch::Tensor& codes, int64_t panel_from);
// Llama's RMSNorm of each row, y = w * (x * (1 / sqrt(mean(x^2) + eps))), each product rounded as
// Hugging Face's ops round it; the sum of squares in one fixed order (kNormLanes partial sums over
// the row in order, then added pairwise), so a row's bits never depend on the rows beside it
// (decoder.cpp). ATen's composite rms_norm is about ten dispatched ops per call: 61 calls a decode
// step cost about a millisecond of a 7.5 ms step.
constexpr int kNormLanes = 16;
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
// The vector instructions the build uses: "avx512", "avx2" or "scalar".
std::string isa();

// A pass's attention, each query over exactly its keys, in one fixed order (attention.cpp).
torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& new_kv, const std::vector<torch::Tensor>& caches,
                     const std::vector<int64_t>& starts, const std::vector<int64_t>& lengths, int64_t layer,
                     double scale, int64_t group);

// A matrix read from its grid: q4 when `low` is defined, q8 when `scale` is, else halves (bf16 or
// f16, by the codes' type); `bias` added when defined.
struct GridWeight {
  torch::Tensor codes, scale, low, bias;
  torch::Tensor operator()(const torch::Tensor& x, int64_t panel_from) const;
};

struct DecoderLayer {
  torch::Tensor attn_norm, mlp_norm;
  GridWeight qkv, o, gate_up, down;
};

// Every decoder layer of a Llama-shaped model on grids, in one call (decoder.cpp).
class Decoder {
 public:
  Decoder(std::vector<DecoderLayer> layers, double eps, int64_t heads, int64_t kv_heads, int64_t head_dim,
          double scale, int64_t panel_from);
  // hidden [tokens, width] after every layer; cos and sin [tokens, head_dim]; the chunks as attend takes them.
  torch::Tensor forward(const torch::Tensor& hidden, const torch::Tensor& cos, const torch::Tensor& sin,
                        const std::vector<torch::Tensor>& caches, const std::vector<int64_t>& starts,
                        const std::vector<int64_t>& lengths) const;

 private:
  void rotate(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& q,
              torch::Tensor& new_kv) const;
  std::vector<DecoderLayer> layers_;
  double eps_;
  int64_t heads_, kv_heads_, head_dim_;
  double scale_;
  int64_t panel_from_;
};

}  // namespace brigade

// Brigade's CPU kernels, built for the machine they run on (engine/kernels.py); bindings.cpp
// exposes them to Python.
#pragma once
#include <torch/extension.h>
#include <optional>
#include <string>
#include <vector>

namespace brigade {

// x @ W.T for W on a 4-bit (Q4_1: scale, low) or 8-bit (Q8_0: scale) block grid (grid_linear.cpp).
torch::Tensor q4_linear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scale,
                        const torch::Tensor& low, int64_t panel_from);
torch::Tensor q8_linear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scale,
                        int64_t panel_from);
// The vector instructions the build uses: "avx512", "avx2" or "scalar".
std::string isa();

// A pass's attention, each query over exactly its keys, in one fixed order (attention.cpp).
torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& new_kv, const std::vector<torch::Tensor>& caches,
                     const std::vector<int64_t>& starts, const std::vector<int64_t>& lengths, int64_t layer,
                     double scale, int64_t group);

}  // namespace brigade

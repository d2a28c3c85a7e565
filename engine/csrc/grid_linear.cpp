// y = x @ W.T for a weight W whose float32 values lie on a block grid (exactly), read from that
// grid instead of from 4-byte floats. See engine/grid_linear.py for why and for the formats.
//
// Two formats, 32 weights a block along the input dimension:
//   q4: W[n, 32b + j] = (scale[n, b] * q) + low[n, b], q a 4-bit code (codes[n, 16b + j] low nibble
//       for j < 16, high nibble of codes[n, 16b + j - 16] for j >= 16); product and sum each
//       rounded to float32, exactly as the values were made (no fused multiply-add).
//   q8: W[n, 32b + j] = scale[n, b] * q, q a signed byte codes[n, 32b + j] (the product is exact).
//
// The order of every sum is fixed: y[m, n] = reduce(acc), acc one vector of L lanes (16 with
// AVX-512, 8 with AVX2) with acc += x[m, k:k+L] * W[n, k:k+L] (fused) for k = 0, L, 2L, ..., and
// reduce a fixed tree. It does not depend on the number of rows M, a row's place among them, the
// path taken (decoding in registers for few rows, a decoded panel for many) or the thread count
// (threads split the weight rows, so each output is one thread's): the pass is batch-invariant by
// construction. Built with -ffp-contract=off (the decoding must round twice) and -march=native.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels.h"

namespace brigade {
namespace {

constexpr int kBlock = 32;

#if defined(__AVX512F__)
using V = __m512;
constexpr int L = 16;
constexpr int MR = 4, NR = 4;  // panel micro-tile: 16 accumulators + 5 operands of 32 registers
inline V vzero() { return _mm512_setzero_ps(); }
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(V v) { return _mm512_reduce_add_ps(v); }

template <bool Q4>
inline void decode(const uint8_t* codes, float scale, float low, V w[kBlock / L]) {
  const V d = _mm512_set1_ps(scale);
  if constexpr (Q4) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const V m = _mm512_set1_ps(low);
    w[0] = _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(bytes, mask)))), m);
    w[1] = _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
        _mm_and_si128(_mm_srli_epi16(bytes, 4), mask)))), m);
  } else {
    for (int i = 0; i < 2; ++i) {
      const __m128i part = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * i));
      w[i] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(part)));
    }
  }
}

#elif defined(__AVX2__) && defined(__FMA__)
using V = __m256;
constexpr int L = 8;
constexpr int MR = 2, NR = 4;  // 8 accumulators + 6 operands of 16 registers
inline V vzero() { return _mm256_setzero_ps(); }
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(V v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

template <bool Q4>
inline void decode(const uint8_t* codes, float scale, float low, V w[kBlock / L]) {
  const V d = _mm256_set1_ps(scale);
  if constexpr (Q4) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(bytes, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
    const V m = _mm256_set1_ps(low);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; ++i)
      w[i] = _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[i]))), m);
  } else {
    for (int i = 0; i < 4; ++i) {
      const __m128i part = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + 8 * i));
      w[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part)));
    }
  }
}

#else
// No vector unit the kernel knows: one lane, the same structure.
struct V { float v; };
constexpr int L = 1;
constexpr int MR = 1, NR = 1;
inline V vzero() { return {0.f}; }
inline V vload(const float* p) { return {*p}; }
inline void vstore(float* p, V v) { *p = v.v; }
inline V vfma(V a, V b, V c) { return {__builtin_fmaf(a.v, b.v, c.v)}; }
inline float vsum(V v) { return v.v; }

template <bool Q4>
inline void decode(const uint8_t* codes, float scale, float low, V w[kBlock]) {
  for (int j = 0; j < kBlock; ++j) {
    if constexpr (Q4) {
      const uint8_t byte = codes[j & 15];
      float p = scale * static_cast<float>(j < 16 ? (byte & 15) : (byte >> 4));
      w[j] = {p + low};
    } else {
      w[j] = {scale * static_cast<float>(static_cast<int8_t>(codes[j]))};
    }
  }
}
#endif

constexpr int kPerBlock = kBlock / L;  // vectors per block

// The compiler would fold a panel vector into each multiply-add that reads it, loading it MR times
// instead of once; an empty asm that claims to change it keeps it in a register.
inline void keep_in_register(V& v) {
#if defined(__AVX512F__)
  asm("" : "+v"(v));
#elif defined(__AVX2__)
  asm("" : "+x"(v));
#else
  (void)v;
#endif
}

struct Matrix {
  const uint8_t* codes;
  const float* scale;
  const float* low;
  int64_t K, blocks, code_row;
  bool q4;
};

// Few rows: decode each block in registers and use it for up to R rows at once.
template <bool Q4, int R>
inline void direct_tile(const Matrix& w, int64_t n, const float* x, float* out, int64_t ldo) {
  V acc[R];
  for (int r = 0; r < R; ++r) acc[r] = vzero();
  const uint8_t* c = w.codes + n * w.code_row;
  const float* s = w.scale + n * w.blocks;
  const float* l = Q4 ? w.low + n * w.blocks : nullptr;
  const int64_t stride = Q4 ? 16 : 32;
  for (int64_t b = 0; b < w.blocks; ++b) {
    V wv[kPerBlock];
    decode<Q4>(c + b * stride, s[b], Q4 ? l[b] : 0.f, wv);
    const float* xb = x + b * kBlock;
    for (int i = 0; i < kPerBlock; ++i)
      for (int r = 0; r < R; ++r) acc[r] = vfma(vload(xb + r * w.K + i * L), wv[i], acc[r]);
  }
  for (int r = 0; r < R; ++r) out[r * ldo] = vsum(acc[r]);
}

template <bool Q4, int R>
inline void direct_rows(const Matrix& w, int64_t n, const float* x, float* out, int64_t ldo, int64_t rows) {
  if constexpr (R > 0) {
    if (rows == R) direct_tile<Q4, R>(w, n, x, out, ldo);
    else direct_rows<Q4, R - 1>(w, n, x, out, ldo, rows);
  }
}

template <bool Q4>
void decode_rows(const Matrix& w, int64_t n, int64_t count, float* panel) {
  const int64_t stride = Q4 ? 16 : 32;
  for (int64_t j = 0; j < count; ++j) {
    const uint8_t* c = w.codes + (n + j) * w.code_row;
    const float* s = w.scale + (n + j) * w.blocks;
    const float* l = Q4 ? w.low + (n + j) * w.blocks : nullptr;
    for (int64_t b = 0; b < w.blocks; ++b) {
      V wv[kPerBlock];
      decode<Q4>(c + b * stride, s[b], Q4 ? l[b] : 0.f, wv);
      for (int i = 0; i < kPerBlock; ++i) vstore(panel + j * w.K + b * kBlock + i * L, wv[i]);
    }
  }
}

// Many rows: NR weight rows decoded once into a panel, then MR x NR tiles of outputs from it.
template <int RM>
inline void panel_tile(const float* x, int64_t K, const float* panel, float* out, int64_t ldo) {
  V acc[RM][NR];
  for (int r = 0; r < RM; ++r)
    for (int j = 0; j < NR; ++j) acc[r][j] = vzero();
  for (int64_t k = 0; k < K; k += L) {
    V wv[NR];
    for (int j = 0; j < NR; ++j) {
      wv[j] = vload(panel + j * K + k);
      keep_in_register(wv[j]);
    }
    for (int r = 0; r < RM; ++r) {
      const V xv = vload(x + r * K + k);  // NOLINT: one operand register, loaded per row
      for (int j = 0; j < NR; ++j) acc[r][j] = vfma(xv, wv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < RM; ++r)
    for (int j = 0; j < NR; ++j) out[r * ldo + j] = vsum(acc[r][j]);
}

template <int RM>
inline void panel_rows(const float* x, int64_t K, const float* panel, float* out, int64_t ldo, int64_t rows) {
  if constexpr (RM > 0) {
    if (rows == RM) panel_tile<RM>(x, K, panel, out, ldo);
    else panel_rows<RM - 1>(x, K, panel, out, ldo, rows);
  }
}

template <bool Q4>
torch::Tensor grid_linear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scale,
                          const std::optional<torch::Tensor>& low, int64_t panel_from) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x must be [rows, in] float32");
  const auto xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = codes.size(0);
  TORCH_CHECK(K % kBlock == 0, "the input size must be a multiple of 32");
  TORCH_CHECK(codes.size(1) == (Q4 ? K / 2 : K) && scale.size(1) == K / kBlock, "weight shape does not match x");
  auto out = torch::empty({M, N}, xc.options());
  const Matrix w{codes.data_ptr<uint8_t>(), scale.data_ptr<float>(), Q4 ? low->data_ptr<float>() : nullptr,
                 K, K / kBlock, codes.size(1), Q4};
  const float* xp = xc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  constexpr int kDirect = 8;
  if (M < panel_from) {
    at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t m = 0; m < M; m += kDirect)
          direct_rows<Q4, kDirect>(w, n, xp + m * K, op + m * N + n, N, std::min<int64_t>(kDirect, M - m));
    });
    return out;
  }
  const int64_t groups = N / NR;
  at::parallel_for(0, groups, 4, [&](int64_t g0, int64_t g1) {
    std::vector<float> panel(NR * K);
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t n = g * NR;
      decode_rows<Q4>(w, n, NR, panel.data());
      for (int64_t m = 0; m < M; m += MR)
        panel_rows<MR>(xp + m * K, K, panel.data(), op + m * N + n, N, std::min<int64_t>(MR, M - m));
    }
  });
  for (int64_t n = groups * NR; n < N; ++n)  // rows past the last whole panel (same order)
    for (int64_t m = 0; m < M; m += kDirect)
      direct_rows<Q4, kDirect>(w, n, xp + m * K, op + m * N + n, N, std::min<int64_t>(kDirect, M - m));
  return out;
}

}  // namespace

torch::Tensor q4_linear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scale,
                        const torch::Tensor& low, int64_t panel_from) {
  return grid_linear<true>(x, codes, scale, low, panel_from);
}

torch::Tensor q8_linear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scale,
                        int64_t panel_from) {
  return grid_linear<false>(x, codes, scale, std::nullopt, panel_from);
}

std::string isa() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace brigade

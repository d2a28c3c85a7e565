// Attention for a pass's chunks, each query over exactly the keys it sees, in one fixed order:
// see engine/model_runner.py (ModelRunner._attend_exact) for where it is used and why.
//
// For each chunk c (a sequence's positions start .. start+len-1), its new keys and values are
// written into the sequence's cache (layer `layer` of a [layers, kv_heads, capacity, 2 x d]
// tensor, key and value side by side), then each new query i (position p = start + i) of each
// head h attends over the keys 0..p of its KV head (h / group):
//   s_j = (q . k_j) * scale; m = max s_j; e_j = exp(s_j - m); out = (sum_j e_j v_j) / (sum_j e_j),
// every sum taken in key order by one thread. A query's numbers so depend only on its own
// sequence's keys and values: not on the chunk it came in (chunked prefill, a prefix-cache hit,
// a resumed prefill, a decode step), nor on what else shares the pass.
//
// Each number is fixed by the order written in `attend_key_by_key`: q . k_j as one vector
// accumulator over d (lane l sums positions l, l + 16, ... by fused multiply-adds) reduced as
// _mm512_reduce_add_ps reduces it, exp as glibc's expf. With AVX-512, `attend` computes the same
// numbers 16 keys at a time: the 16 accumulators reduced together by the same pairwise sums
// (addition is commutative, so each sum is the same bits), exp 16 at a time by glibc's own
// algorithm (`exp16`: every float checked against expf, bit for bit), and the sums over keys
// still in key order, with a query's heads side by side. A cold 1,012-token prefill spent about
// 0.8 s of its 2 s here one key at a time (docs/architecture.md).
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels.h"

namespace brigade {

namespace {

// q . k over d values, d a multiple of 16 (AVX-512) / 8 (AVX2): one vector accumulator, a fixed reduction.
inline float dot(const float* a, const float* b, int64_t d) {
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < d; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  return _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
#else
  float acc = 0.f;
  for (int64_t i = 0; i < d; ++i) acc = __builtin_fmaf(a[i], b[i], acc);
  return acc;
#endif
}

// out += w * v over d values.
inline void axpy(float* out, float w, const float* v, int64_t d) {
  for (int64_t i = 0; i < d; ++i) out[i] = __builtin_fmaf(w, v[i], out[i]);
}

// A work item's query rows at most: consecutive rows of one chunk, which read their KV head's keys
// and values once together (a verify pass's drafted rows, a prompt chunk's rows) where the blocked
// path shares those reads (AVX2's `rows_blocked`). AVX-512's goes a row at a time, so there a row is
// its own item, as many items as before for the threads to share.
#if defined(__AVX512F__)
constexpr int kTileRows = 1;
#else
constexpr int kTileRows = 4;
#endif

// One query row's `group` heads (q [group, d], out [group, d], zeroed) over its `seen` keys, one
// key at a time: the order that defines every number here.
void heads_key_by_key(const float* q, const float* kv, float* out, int64_t seen, int64_t d, int64_t group,
                      float scale) {
  thread_local std::vector<float> scores;
  scores.resize(seen);
  for (int64_t g = 0; g < group; ++g) {
    const float* qh = q + g * d;
    float top = -INFINITY;
    for (int64_t j = 0; j < seen; ++j) {
      scores[j] = dot(qh, kv + j * 2 * d, d) * scale;
      top = std::max(top, scores[j]);
    }
    float total = 0.f;
    float* o = out + g * d;
    for (int64_t j = 0; j < seen; ++j) {
      const float e = std::exp(scores[j] - top);
      total += e;
      axpy(o, e, kv + j * 2 * d + d, d);
    }
    const float inv = 1.f / total;
    for (int64_t i = 0; i < d; ++i) o[i] *= inv;
  }
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// glibc's expf table (2.36's, for its FMA variant): exp2(i / 32) for i < 32, as doubles' bits;
// both blocked paths below read it.
alignas(64) constexpr uint64_t kExp2Table[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540};
#endif

#if defined(__AVX512F__)
// glibc's expf (2.36, the variant its ifunc picks on CPUs with FMA, as every AVX-512 CPU has):
// x = (k + r) ln2 / 32, exp(x) = 2^(k/32) * p(r), in double, rounded once to float. Its table
// and coefficients, read from glibc; tests/test_exact_attention.py holds the two to the same bits.

inline __m512d exp8(__m512d x) {
  const __m512d inv_ln2_32 = _mm512_set1_pd(0x1.71547652b82fep+5), shift = _mm512_set1_pd(0x1.8p+52);
  const __m512d shifted = _mm512_fmadd_pd(inv_ln2_32, x, shift);  // k, rounded to an integer, in its low bits
  const __m512i k = _mm512_castpd_si512(shifted);
  const __m512d r = _mm512_fmsub_pd(inv_ln2_32, x, _mm512_sub_pd(shifted, shift));
  const __m512i i = _mm512_and_si512(k, _mm512_set1_epi64(31));
  const __m512i* table = reinterpret_cast<const __m512i*>(kExp2Table);
  const __m512i low = _mm512_permutex2var_epi64(_mm512_load_si512(table), i, _mm512_load_si512(table + 1));
  const __m512i high = _mm512_permutex2var_epi64(_mm512_load_si512(table + 2), i, _mm512_load_si512(table + 3));
  const __m512i t = _mm512_add_epi64(_mm512_mask_blend_epi64(_mm512_test_epi64_mask(i, _mm512_set1_epi64(16)), low, high),
                                     _mm512_slli_epi64(k, 47));
  const __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(0x1.c6af84b912394p-20), r, _mm512_set1_pd(0x1.ebfce50fac4f3p-13));
  const __m512d y = _mm512_fmadd_pd(z, _mm512_mul_pd(r, r),
                                    _mm512_fmadd_pd(r, _mm512_set1_pd(0x1.62e42ff0c52d6p-6), _mm512_set1_pd(1.0)));
  return _mm512_mul_pd(y, _mm512_castsi512_pd(t));
}

inline __m512 exp16(__m512 x) {
  // AVX-512F's own moves between halves (no AVX512DQ needed).
  const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
  __m512 y = _mm512_castpd_ps(_mm512_insertf64x4(
      _mm512_castps_pd(_mm512_castps256_ps512(_mm512_cvtpd_ps(exp8(_mm512_cvtps_pd(_mm512_castps512_ps256(x)))))),
      _mm256_castps_pd(_mm512_cvtpd_ps(exp8(_mm512_cvtps_pd(high)))), 1));
  // glibc's own cases for |x| >= 88 and for what is not a number, as it takes them.
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i top = _mm512_and_si512(_mm512_srli_epi32(bits, 20), _mm512_set1_epi32(0x7ff));
  const __mmask16 rare = _mm512_cmpgt_epu32_mask(top, _mm512_set1_epi32(0x42a));
  if (rare) {
    const __mmask16 not_finite = _mm512_cmpgt_epu32_mask(top, _mm512_set1_epi32(0x7f7));
    y = _mm512_mask_mov_ps(y, rare & _mm512_cmp_ps_mask(x, _mm512_set1_ps(-0x1.9d1d9ep6f), _CMP_LT_OQ),
                           _mm512_set1_ps(0x1p-149f));  // may underflow: the least subnormal
    y = _mm512_mask_mov_ps(y, rare & _mm512_cmp_ps_mask(x, _mm512_set1_ps(-0x1.9fe368p6f), _CMP_LT_OQ),
                           _mm512_setzero_ps());
    y = _mm512_mask_mov_ps(y, rare & _mm512_cmp_ps_mask(x, _mm512_set1_ps(0x1.62e42ep6f), _CMP_GT_OQ),
                           _mm512_set1_ps(INFINITY));
    y = _mm512_mask_add_ps(y, not_finite, x, x);
    y = _mm512_mask_mov_ps(y, not_finite & _mm512_cmpeq_epi32_mask(bits, _mm512_set1_epi32(int(0xff800000u))),
                           _mm512_setzero_ps());
  }
  return y;
}

// The 16 accumulators' lanes added pairwise as _mm512_reduce_add_ps adds one's ((l, l + 8), then
// (l, l + 4), (l, l + 2), (0, 1)), for all 16 at once: each level adds two accumulators' halves
// in one vector (a blend and one shuffle put the pairs side by side). The sums come out in the
// levels' own order (`landed`).
inline __m512 reduce16_levels(const __m512 (&a)[16]) {
  const __m512i pair_quarters = _mm512_setr_epi32(4, 5, 6, 7, 16, 17, 18, 19, 12, 13, 14, 15, 24, 25, 26, 27);
  const __m512i pair_lanes = _mm512_setr_epi32(1, 16, 3, 18, 5, 20, 7, 22, 9, 24, 11, 26, 13, 28, 15, 30);
  __m512 b[8], c[4], e[2];
  for (int m = 0; m < 8; ++m)  // lanes 0-7: a[m]'s (l, l + 8); lanes 8-15: a[m + 8]'s
    b[m] = _mm512_add_ps(_mm512_mask_blend_ps(0xFF00, a[m], a[m + 8]), _mm512_shuffle_f32x4(a[m], a[m + 8], 0x4E));
  for (int m = 0; m < 4; ++m)  // each quarter: one accumulator's (l, l + 4)
    c[m] = _mm512_add_ps(_mm512_mask_blend_ps(0xF0F0, b[m], b[m + 4]),
                         _mm512_permutex2var_ps(b[m], pair_quarters, b[m + 4]));
  for (int m = 0; m < 2; ++m)  // each half quarter: one accumulator's (l, l + 2)
    e[m] = _mm512_add_ps(_mm512_mask_blend_ps(0xCCCC, c[m], c[m + 2]), _mm512_shuffle_ps(c[m], c[m + 2], 0x4E));
  return _mm512_add_ps(_mm512_mask_blend_ps(0xAAAA, e[0], e[1]), _mm512_permutex2var_ps(e[0], pair_lanes, e[1]));
}

// For each accumulator t, the lane its sum lands in: the levels run once on a[t] = t everywhere.
const __m512i& landed() {
  static const __m512i lanes = [] {
    __m512 probe[16];
    for (int t = 0; t < 16; ++t) probe[t] = _mm512_set1_ps(static_cast<float>(t));
    alignas(64) float sums[16];
    alignas(64) int32_t lane_of[16];
    _mm512_store_ps(sums, reduce16_levels(probe));
    for (int lane = 0; lane < 16; ++lane) lane_of[static_cast<int>(sums[lane]) / 16] = lane;
    return _mm512_load_si512(lane_of);
  }();
  return lanes;
}

// The scores of 16 keys from kv (key t at kv + t * 2d; the first `keys` of them, the rest zero),
// each `dot(q, k) * scale` to the bit: key t's accumulator lane l sums q[l + 16 i] k[l + 16 i] in
// order i, as `dot` does, and reduce16_levels adds the lanes as `dot` does.
template <int L>
inline __m512 scores16(const __m512 (&q)[L], const float* kv, int64_t keys, __m512 scale) {
  constexpr int64_t stride = 2 * 16 * L;
  __m512 a[16];
  if (keys == 16) {
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) {
      a[t] = _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int i = 0; i < L; ++i) a[t] = _mm512_fmadd_ps(q[i], _mm512_loadu_ps(kv + t * stride + 16 * i), a[t]);
    }
  } else {
    for (int t = 0; t < 16; ++t) {
      a[t] = _mm512_setzero_ps();
      if (t < keys)
        for (int i = 0; i < L; ++i) a[t] = _mm512_fmadd_ps(q[i], _mm512_loadu_ps(kv + t * stride + 16 * i), a[t]);
    }
  }
  return _mm512_mul_ps(_mm512_permutexvar_ps(landed(), reduce16_levels(a)), scale);
}

// heads_key_by_key's numbers for d = 16 L and `group` = G, 16 keys at a time.
template <int L, int G>
void heads_blocked(const float* q, const float* kv, float* out, int64_t seen, float scale) {
  constexpr int64_t d = 16 * L;
  thread_local std::vector<float> weights;
  const int64_t padded = (seen + 15) / 16 * 16;
  weights.resize(G * padded);
  const __m512 s = _mm512_set1_ps(scale);
  for (int g = 0; g < G; ++g) {
    __m512 qv[L];
    for (int i = 0; i < L; ++i) qv[i] = _mm512_loadu_ps(q + g * d + 16 * i);
    float* w = weights.data() + g * padded;
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < seen; j += 16) {
      const int64_t keys = std::min<int64_t>(16, seen - j);
      const __m512 sc = scores16<L>(qv, kv + j * 2 * d, keys, s);
      _mm512_storeu_ps(w + j, sc);
      top = _mm512_mask_max_ps(top, static_cast<__mmask16>((1u << keys) - 1), top, sc);
    }
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    for (int64_t j = 0; j < seen; j += 16) _mm512_storeu_ps(w + j, exp16(_mm512_sub_ps(_mm512_loadu_ps(w + j), m)));
  }
  // out_g = sum_j e_j v_j and total_g = sum_j e_j, each in key order, the heads side by side.
  __m512 acc[G][L];
  float total[G];
  for (int g = 0; g < G; ++g) {
    total[g] = 0.f;
    for (int i = 0; i < L; ++i) acc[g][i] = _mm512_setzero_ps();
  }
  const float* w = weights.data();
  for (int64_t j = 0; j < seen; ++j) {
    const float* v = kv + j * 2 * d + d;
    __m512 vv[L];
    for (int i = 0; i < L; ++i) vv[i] = _mm512_loadu_ps(v + 16 * i);
    for (int g = 0; g < G; ++g) {
      const float e = w[g * padded + j];
      total[g] += e;
      const __m512 eb = _mm512_set1_ps(e);
      for (int i = 0; i < L; ++i) acc[g][i] = _mm512_fmadd_ps(eb, vv[i], acc[g][i]);
    }
  }
  for (int g = 0; g < G; ++g) {
    const __m512 inv = _mm512_set1_ps(1.f / total[g]);
    for (int i = 0; i < L; ++i) _mm512_storeu_ps(out + g * d + 16 * i, _mm512_mul_ps(acc[g][i], inv));
  }
}

// The blocked path where its accumulators fit in registers (d = 16 L, L * group <= 16); false: none.
bool heads_blocked_for(const float* q, const float* kv, float* out, int64_t seen, int64_t d, int64_t group,
                       float scale) {
#define BRIGADE_HEADS(L, G) \
  if (d == 16 * (L) && group == (G)) return heads_blocked<L, G>(q, kv, out, seen, scale), true;
  BRIGADE_HEADS(1, 1) BRIGADE_HEADS(1, 2) BRIGADE_HEADS(1, 3) BRIGADE_HEADS(1, 4) BRIGADE_HEADS(1, 8)
  BRIGADE_HEADS(2, 1) BRIGADE_HEADS(2, 2) BRIGADE_HEADS(2, 3) BRIGADE_HEADS(2, 4) BRIGADE_HEADS(2, 8)
  BRIGADE_HEADS(4, 1) BRIGADE_HEADS(4, 2) BRIGADE_HEADS(4, 3) BRIGADE_HEADS(4, 4)
  BRIGADE_HEADS(8, 1) BRIGADE_HEADS(8, 2)
#undef BRIGADE_HEADS
  return false;
}

// `rows` query rows of one chunk (row r at q + r q_stride sees seen0 + r keys), one row at a time.
bool rows_blocked_for(const float* q, int64_t q_stride, const float* kv, float* out, int64_t out_stride,
                      int64_t seen0, int rows, int64_t d, int64_t group, float scale) {
  for (int r = 0; r < rows; ++r)
    if (!heads_blocked_for(q + r * q_stride, kv, out + r * out_stride, seen0 + r, d, group, scale)) return false;
  return true;
}
#elif defined(__AVX2__) && defined(__FMA__)
// The blocked path for AVX2, 8 keys at a time: the same numbers as one key at a time, as the
// AVX-512 path above gives them (see there), with AVX2's `dot` reduction and exp in 4 doubles.

// glibc's expf for 4 floats widened to doubles (its algorithm, its table and coefficients; rounded
// to float by the caller, once, as glibc rounds).
inline __m256d exp4(__m256d x) {
  const __m256d inv_ln2_32 = _mm256_set1_pd(0x1.71547652b82fep+5), shift = _mm256_set1_pd(0x1.8p+52);
  const __m256d shifted = _mm256_fmadd_pd(inv_ln2_32, x, shift);
  const __m256i k = _mm256_castpd_si256(shifted);
  const __m256d r = _mm256_fmsub_pd(inv_ln2_32, x, _mm256_sub_pd(shifted, shift));
  const __m256i i = _mm256_and_si256(k, _mm256_set1_epi64x(31));
  const __m256i t = _mm256_add_epi64(_mm256_i64gather_epi64(reinterpret_cast<const long long*>(kExp2Table), i, 8),
                                     _mm256_slli_epi64(k, 47));
  const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(0x1.c6af84b912394p-20), r, _mm256_set1_pd(0x1.ebfce50fac4f3p-13));
  const __m256d y = _mm256_fmadd_pd(z, _mm256_mul_pd(r, r),
                                    _mm256_fmadd_pd(r, _mm256_set1_pd(0x1.62e42ff0c52d6p-6), _mm256_set1_pd(1.0)));
  return _mm256_mul_pd(y, _mm256_castsi256_pd(t));
}

// expf of 8 floats, glibc's bits: its own cases (|x| >= 88, what is not a number) taken by expf itself.
inline __m256 exp8(__m256 x) {
  const __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20), _mm256_set1_epi32(0x7ff));
  if (_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42a))))) {
    alignas(32) float v[8];
    _mm256_store_ps(v, x);
    for (float& e : v) e = std::exp(e);
    return _mm256_load_ps(v);
  }
  const __m128 low = _mm256_cvtpd_ps(exp4(_mm256_cvtps_pd(_mm256_castps256_ps128(x))));
  const __m128 high = _mm256_cvtpd_ps(exp4(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));
  return _mm256_insertf128_ps(_mm256_castps128_ps256(low), high, 1);
}

// The 8 accumulators' lanes added as `dot` adds one's (lane l + lane l + 4, then l + l + 2, then
// 0 + 1), all 8 at once; key t's sum lands in lane `landed8()[t]`.
inline __m256 reduce8_levels(const __m256 (&a)[8]) {
  __m256 b[4], c[2];
  for (int m = 0; m < 4; ++m)  // lanes 0-3: a[m]'s (l, l + 4); lanes 4-7: a[m + 4]'s
    b[m] = _mm256_add_ps(_mm256_permute2f128_ps(a[m], a[m + 4], 0x20), _mm256_permute2f128_ps(a[m], a[m + 4], 0x31));
  for (int m = 0; m < 2; ++m)  // per half: b[m]'s (l, l + 2) in lanes 0-1, b[m + 2]'s in lanes 2-3
    c[m] = _mm256_add_ps(_mm256_shuffle_ps(b[m], b[m + 2], 0x44), _mm256_shuffle_ps(b[m], b[m + 2], 0xEE));
  return _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], 0x88), _mm256_shuffle_ps(c[0], c[1], 0xDD));
}

const __m256i& landed8() {
  static const __m256i lanes = [] {
    __m256 probe[8];
    for (int t = 0; t < 8; ++t) probe[t] = _mm256_set1_ps(static_cast<float>(t));
    alignas(32) float sums[8];
    alignas(32) int32_t lane_of[8];
    _mm256_store_ps(sums, reduce8_levels(probe));
    for (int lane = 0; lane < 8; ++lane) lane_of[static_cast<int>(sums[lane]) / 8] = lane;
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(lane_of));
  }();
  return lanes;
}

// The scores of 8 keys (the first `keys` of them, the rest zero), each `dot(q, k) * scale` to the bit.
template <int L>
inline __m256 scores8(const float* q, const float* kv, int64_t keys, __m256 scale) {
  constexpr int64_t stride = 2 * 8 * L;
  __m256 a[8];
  for (int t = 0; t < 8; ++t) {
    a[t] = _mm256_setzero_ps();
    if (t < keys)
      for (int i = 0; i < L; ++i)
        a[t] = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * i), _mm256_loadu_ps(kv + t * stride + 8 * i), a[t]);
  }
  return _mm256_mul_ps(_mm256_permutevar8x32_ps(reduce8_levels(a), landed8()), scale);
}

// heads_key_by_key's numbers for d = 8 L and `group` = G, 8 keys at a time, for `rows` query rows
// of one chunk at once (row r at q + r q_stride sees the keys 0 .. seen0 + r - 1). A KV head's keys
// and values are each read once for all the rows' heads: at a 1,100-token context they are half a
// megabyte per layer and KV head, more than L2 holds, and a head at a time read the keys from
// memory once per head and row (1 row, 30 layers: 8.7 ms on one core, now 6.1; docs/architecture.md).
// The scores an 8-key block at a time for every row and head; then each (row, head)'s exps and
// total in key order; then the values' sums a block of keys at a time for every row, each output's
// chain still in key order (kept in `sums` between blocks: a float stored and loaded is the same
// float), a quarter of d at a time so that the heads' accumulators fit AVX2's 16 registers.
template <int L, int G>
void rows_blocked(const float* q, int64_t q_stride, const float* kv, float* out, int64_t out_stride,
                  int64_t seen0, int rows, float scale) {
  constexpr int64_t d = 8 * L;
  constexpr int64_t kValueBlock = 32;  // keys whose values stay in L1 while every row reads them
  const int64_t last = seen0 + rows - 1;  // the keys the last row sees
  const int64_t padded = (last + 7) / 8 * 8;
  thread_local std::vector<float> weights, sums;
  weights.resize(static_cast<size_t>(rows) * G * padded);
  sums.assign(static_cast<size_t>(rows) * G * d, 0.f);
  const __m256 s = _mm256_set1_ps(scale);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 top[kTileRows * G];
  for (int h = 0; h < rows * G; ++h) top[h] = _mm256_set1_ps(-INFINITY);
  for (int64_t j = 0; j < last; j += 8) {
    for (int r = 0; r < rows; ++r) {
      const int64_t keys = std::min<int64_t>(8, seen0 + r - j);
      if (keys <= 0) continue;
      const __m256 real = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(keys)), lane));
      for (int g = 0; g < G; ++g) {
        const int h = r * G + g;
        const __m256 sc = scores8<L>(q + r * q_stride + g * d, kv + j * 2 * d, keys, s);
        _mm256_storeu_ps(weights.data() + h * padded + j, sc);
        top[h] = _mm256_max_ps(top[h], _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sc, real));
      }
    }
  }
  float total[kTileRows * G];
  for (int h = 0; h < rows * G; ++h) {
    const int64_t seen = seen0 + h / G;
    float* w = weights.data() + h * padded;
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, top[h]);
    const __m256 m = _mm256_set1_ps(*std::max_element(lanes, lanes + 8));
    for (int64_t j = 0; j < seen; j += 8) _mm256_storeu_ps(w + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(w + j), m)));
    total[h] = 0.f;
    for (int64_t j = 0; j < seen; ++j) total[h] += w[j];
  }
  constexpr int P = L >= 4 ? 4 : L;  // vectors of d per sweep over a block's keys
  static_assert(L % P == 0, "d must be a multiple of the sweep");
  for (int64_t j0 = 0; j0 < last; j0 += kValueBlock) {
    for (int r = 0; r < rows; ++r) {
      const int64_t j1 = std::min<int64_t>(j0 + kValueBlock, seen0 + r);
      if (j1 <= j0) continue;
      const float* w = weights.data() + r * G * padded;
      float* acc_at = sums.data() + r * G * d;
      for (int i0 = 0; i0 < L; i0 += P) {
        __m256 acc[G][P];
        for (int g = 0; g < G; ++g)
          for (int i = 0; i < P; ++i) acc[g][i] = _mm256_loadu_ps(acc_at + g * d + 8 * (i0 + i));
        for (int64_t j = j0; j < j1; ++j) {
          const float* v = kv + j * 2 * d + d + 8 * i0;
          __m256 vv[P];
          for (int i = 0; i < P; ++i) vv[i] = _mm256_loadu_ps(v + 8 * i);
          for (int g = 0; g < G; ++g) {
            const __m256 eb = _mm256_set1_ps(w[g * padded + j]);
            for (int i = 0; i < P; ++i) acc[g][i] = _mm256_fmadd_ps(eb, vv[i], acc[g][i]);
          }
        }
        for (int g = 0; g < G; ++g)
          for (int i = 0; i < P; ++i) _mm256_storeu_ps(acc_at + g * d + 8 * (i0 + i), acc[g][i]);
      }
    }
  }
  for (int h = 0; h < rows * G; ++h) {
    const __m256 inv = _mm256_set1_ps(1.f / total[h]);
    float* o = out + (h / G) * out_stride + (h % G) * d;
    for (int i = 0; i < L; ++i) _mm256_storeu_ps(o + 8 * i, _mm256_mul_ps(_mm256_loadu_ps(sums.data() + h * d + 8 * i), inv));
  }
}

bool rows_blocked_for(const float* q, int64_t q_stride, const float* kv, float* out, int64_t out_stride,
                      int64_t seen0, int rows, int64_t d, int64_t group, float scale) {
#define BRIGADE_HEADS(L, G)                                                                   \
  if (d == 8 * (L) && group == (G))                                                           \
    return rows_blocked<L, G>(q, q_stride, kv, out, out_stride, seen0, rows, scale), true;
  BRIGADE_HEADS(2, 1) BRIGADE_HEADS(2, 2) BRIGADE_HEADS(2, 3) BRIGADE_HEADS(2, 4) BRIGADE_HEADS(2, 8)
  BRIGADE_HEADS(4, 1) BRIGADE_HEADS(4, 2) BRIGADE_HEADS(4, 3) BRIGADE_HEADS(4, 4) BRIGADE_HEADS(4, 8)
  BRIGADE_HEADS(8, 1) BRIGADE_HEADS(8, 2) BRIGADE_HEADS(8, 3) BRIGADE_HEADS(8, 4)
  BRIGADE_HEADS(16, 1) BRIGADE_HEADS(16, 2) BRIGADE_HEADS(16, 3)
#undef BRIGADE_HEADS
  return false;
}
#endif

}  // namespace

namespace {

at::Tensor attend_pass(const at::Tensor& q_in, const at::Tensor& new_kv_in, const std::vector<at::Tensor>& caches,
                       const std::vector<int64_t>& starts, const std::vector<int64_t>& lengths, int64_t layer,
                       double scale_in, int64_t group, bool key_by_key) {
  TORCH_CHECK(q_in.dim() == 3 && q_in.scalar_type() == at::kFloat, "q must be [tokens, heads, d] float32");
  const auto q = q_in.contiguous();
  const auto new_kv = new_kv_in.contiguous();  // [tokens, kv_heads, 2d]
  const int64_t T = q.size(0), H = q.size(1), d = q.size(2), KVH = new_kv.size(1);
  TORCH_CHECK(caches.size() == starts.size() && starts.size() == lengths.size(), "one start and length per chunk");
  TORCH_CHECK(H == KVH * group && new_kv.size(2) == 2 * d, "head counts do not match");
  const float scale = static_cast<float>(scale_in);
  auto out = q.new_zeros({T, H * d});
  const float* qp = q.data_ptr<float>();
  const float* np = new_kv.data_ptr<float>();
  float* op = out.data_ptr<float>();

  // Where each chunk's rows start in the pass, and each query's (chunk, position).
  const int64_t chunks = static_cast<int64_t>(caches.size());
  std::vector<float*> base(chunks);
  std::vector<int64_t> cap(chunks), row_of(chunks + 1, 0);
  for (int64_t c = 0; c < chunks; ++c) {
    const auto& cache = caches[c];
    TORCH_CHECK(cache.is_contiguous() && cache.scalar_type() == at::kFloat && cache.size(1) == KVH &&
                cache.size(3) == 2 * d, "a cache must be a contiguous [layers, kv_heads, capacity, 2d] float32 tensor");
    cap[c] = cache.size(2);
    TORCH_CHECK(starts[c] + lengths[c] <= cap[c], "a chunk runs past its cache's capacity");
    base[c] = cache.data_ptr<float>() + layer * KVH * cap[c] * 2 * d;
    row_of[c + 1] = row_of[c] + lengths[c];
  }
  TORCH_CHECK(row_of[chunks] <= T, "more chunk rows than tokens in the pass");
  // The new keys and values into their caches first: a query reads its own chunk's earlier ones.
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t i = 0; i < lengths[c]; ++i)
      for (int64_t kh = 0; kh < KVH; ++kh)
        std::copy(np + ((row_of[c] + i) * KVH + kh) * 2 * d, np + ((row_of[c] + i) * KVH + kh + 1) * 2 * d,
                  base[c] + (kh * cap[c] + starts[c] + i) * 2 * d);

  // Work items: (tile, KV head), a tile up to kTileRows consecutive rows of one chunk; a KV head's
  // query heads, and a tile's rows, share its keys' and values' reads.
  std::vector<std::array<int64_t, 3>> tiles;  // (chunk, first row in the pass, rows)
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t r = row_of[c]; r < row_of[c + 1]; r += kTileRows)
      tiles.push_back({c, r, std::min<int64_t>(kTileRows, row_of[c + 1] - r)});
  const int64_t items = static_cast<int64_t>(tiles.size()) * KVH;
  shared_for(0, items, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t item = i0; item < i1; ++item) {
      const auto [c, row, rows] = tiles[item / KVH];
      const int64_t kh = item % KVH;
      const int64_t seen = starts[c] + (row - row_of[c]) + 1;  // the tile's first row sees keys 0 .. position
      const float* kv = base[c] + kh * cap[c] * 2 * d;
      const float* qh = qp + (row * H + kh * group) * d;
      float* o = op + row * H * d + kh * group * d;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
      if (!key_by_key && rows_blocked_for(qh, H * d, kv, o, H * d, seen, static_cast<int>(rows), d, group, scale))
        continue;
#endif
      for (int64_t r = 0; r < rows; ++r) heads_key_by_key(qh + r * H * d, kv, o + r * H * d, seen + r, d, group, scale);
    }
  });
  return out;
}

}  // namespace

at::Tensor attend(const at::Tensor& q, const at::Tensor& new_kv, const std::vector<at::Tensor>& caches,
                  const std::vector<int64_t>& starts, const std::vector<int64_t>& lengths, int64_t layer,
                  double scale, int64_t group) {
  return attend_pass(q, new_kv, caches, starts, lengths, layer, scale, group, false);
}

at::Tensor attend_key_by_key(const at::Tensor& q, const at::Tensor& new_kv, const std::vector<at::Tensor>& caches,
                             const std::vector<int64_t>& starts, const std::vector<int64_t>& lengths, int64_t layer,
                             double scale, int64_t group) {
  return attend_pass(q, new_kv, caches, starts, lengths, layer, scale, group, true);
}

}  // namespace brigade

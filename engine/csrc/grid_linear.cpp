// y = x @ W.T for a weight W whose float32 values lie on a block grid (exactly), read from that
// grid instead of from 4-byte floats. See engine/grid_linear.py for why and for the formats.
//
// Weight rows come in groups of 16 (a "lane group"); within a group, the 16 rows' weights for one
// input k sit side by side, so one vector holds W[n0..n0+15, k]:
//   q4: codes[g, k/2, lane] holds q(k) in its low nibble and q(k+1) in its high one;
//       W = (scale * q) + low, product and sum each rounded to float32, as the values were made
//       (the product of a float16 scale and a 4-bit code is exact, so a fused multiply-add gives
//       the same W; the file is built with -ffp-contract=off so that nothing else is fused);
//   q8: codes[g, k, lane] a signed byte; W = scale * q (exact);
//   scale[g, k/32, lane], low[g, k/32, lane]: per row and block of 32 inputs, float16 as GGUF stores
//   them (a decode step is bound by the bytes it reads; each is exactly its float32 value);
//   bf16, f16: codes[g, k, lane] the weight's own 16 bits (a checkpoint stored in bfloat16 or
//   float16 and upcast at load: every float32 weight is exactly such a half, half the bytes).
//
// The order of every sum is fixed: y[m, n] = fma(x[m, K-1], W[n, K-1], ... fma(x[m, 1], W[n, 1],
// x[m, 0] * W[n, 0] + 0)), one lane of one accumulator, k in order. It does not depend on the
// number of rows M, a row's place among them, the path (weights decoded in registers for few rows,
// a decoded panel for many) or the thread count (threads split the lane groups): the pass is
// batch-invariant by construction, and there is no reduction across lanes at all.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels.h"

namespace brigade {
namespace {

constexpr int kBlock = 32;
constexpr int kGroup = 16;  // weight rows per lane group (one AVX-512 vector, two AVX2 vectors)
// How a weight is stored (engine/grid_linear.py's GridMatrix.kind).
enum Kind { kQ8, kQ4, kBF16, kF16 };
constexpr bool blocked(int kind) { return kind == kQ4 || kind == kQ8; }  // scale (and low) per block
constexpr int64_t code_cols(int kind, int64_t K) { return kind == kQ4 ? K / 2 : K; }  // codes per row of a group
constexpr int code_bytes(int kind) { return blocked(kind) ? 1 : 2; }  // bytes per code

#if defined(__AVX512F__)
// A lane group's 16 floats.
struct G {
  __m512 v;
};
inline G gzero() { return {_mm512_setzero_ps()}; }
inline G gload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void gstore(float* p, G a) { _mm512_storeu_ps(p, a.v); }
inline G gfma(float x, G w, G acc) { return {_mm512_fmadd_ps(_mm512_set1_ps(x), w.v, acc.v)}; }
inline G hload(const uint16_t* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
// 16 bfloat16 -> floats: a bfloat16 is a float32's top half (exact).
inline G bload(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))};
}
inline void keep(G& a) { asm("" : "+v"(a.v)); }
// 16 unsigned bytes -> floats.
inline G from_u8(__m128i b) { return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b))}; }
inline G from_i8(__m128i b) { return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b))}; }
inline G mul(G a, G b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline G madd(G a, G b, G c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
constexpr int MR = 12, NG = 2;  // panel micro-tile: 12 rows x 2 groups = 24 accumulators
constexpr int kDirect = 8;      // rows per pass over a group's weights decoded in registers
#elif defined(__AVX2__) && defined(__FMA__)
struct G {
  __m256 lo, hi;
};
inline G gzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline G gload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void gstore(float* p, G a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
inline G gfma(float x, G w, G acc) {
  const __m256 b = _mm256_set1_ps(x);
  return {_mm256_fmadd_ps(b, w.lo, acc.lo), _mm256_fmadd_ps(b, w.hi, acc.hi)};
}
inline void keep(G& a) { asm("" : "+x"(a.lo), "+x"(a.hi)); }
inline G hload(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline G bload(const uint16_t* p) {
  const auto half = [](const uint16_t* q) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  };
  return {half(p), half(p + 8)};
}
inline G from_u8(__m128i b) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)))};
}
inline G from_i8(__m128i b) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)))};
}
inline G mul(G a, G b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline G madd(G a, G b, G c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
constexpr int MR = 6, NG = 1;  // 6 rows x 1 group (2 vectors) = 12 accumulators of 16 registers
// 5: a speculative verify pass (a token and 4 drafted ones) in one sweep over the weights, not 4 + 1
// (measured, 30 layers' products, 5 rows: 13.0 ms against 16.6).
constexpr int kDirect = 5;
#else
struct G {
  float v[kGroup];
};
inline G gzero() { return G{}; }
inline G gload(const float* p) { G a; std::copy(p, p + kGroup, a.v); return a; }
inline void gstore(float* p, G a) { std::copy(a.v, a.v + kGroup, p); }
inline G gfma(float x, G w, G acc) {
  for (int i = 0; i < kGroup; ++i) acc.v[i] = __builtin_fmaf(x, w.v[i], acc.v[i]);
  return acc;
}
inline void keep(G&) {}
inline G hload(const uint16_t* p) {
  G a;
  for (int i = 0; i < kGroup; ++i) a.v[i] = static_cast<float>(c10::Half(p[i], c10::Half::from_bits()));
  return a;
}
inline G bload(const uint16_t* p) {
  G a;
  for (int i = 0; i < kGroup; ++i) a.v[i] = static_cast<float>(c10::BFloat16(p[i], c10::BFloat16::from_bits()));
  return a;
}
constexpr int MR = 1, NG = 1;
constexpr int kDirect = 1;
#endif

struct Matrix {
  const uint8_t* codes;
  const uint16_t* scale;  // float16 (GGUF stores them so; exact as float32)
  const uint16_t* low;
  int64_t K, blocks;
};

// The group's weights for inputs k and k+1 (q4: one byte per lane holds both).
template <int Kind>
inline void decode(const Matrix& w, int64_t g, int64_t k, G s, G l, G out[2]) {
  if constexpr (!blocked(Kind)) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(w.codes) + (g * w.K + k) * kGroup;
    out[0] = Kind == kBF16 ? bload(p) : hload(p);
    out[1] = Kind == kBF16 ? bload(p + kGroup) : hload(p + kGroup);
    return;
  }
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  if constexpr (Kind == kQ4) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.codes + (g * (w.K / 2) + k / 2) * kGroup));
    const __m128i mask = _mm_set1_epi8(0x0f);
    // scale * q + low in one fused multiply-add, the same bits as the product and the sum each
    // rounded: a float16 scale (11 significant bits) times a 4-bit code is exact in float32, so
    // only the sum rounds, once, either way.
    out[0] = madd(s, from_u8(_mm_and_si128(bytes, mask)), l);
    out[1] = madd(s, from_u8(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask)), l);
  } else if constexpr (Kind == kQ8) {
    for (int i = 0; i < 2; ++i) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.codes + (g * w.K + k + i) * kGroup));
      out[i] = mul(s, from_i8(bytes));
    }
  }
#else
  for (int lane = 0; lane < kGroup; ++lane) {
    for (int i = 0; i < 2; ++i) {
      if constexpr (Kind == kQ4) {
        const uint8_t byte = w.codes[(g * (w.K / 2) + k / 2) * kGroup + lane];
        const float p = s.v[lane] * static_cast<float>(i == 0 ? (byte & 15) : (byte >> 4));
        out[i].v[lane] = p + l.v[lane];
      } else if constexpr (Kind == kQ8) {
        out[i].v[lane] = s.v[lane] * static_cast<float>(static_cast<int8_t>(w.codes[(g * w.K + k + i) * kGroup + lane]));
      }
    }
  }
#endif
}

// The scale and low of group g's block b (a half has none).
template <int Kind>
inline void block_numbers(const Matrix& w, int64_t g, int64_t b, G& s, G& l) {
  if constexpr (blocked(Kind)) {
    s = hload(w.scale + (g * w.blocks + b) * kGroup);
    l = Kind == kQ4 ? hload(w.low + (g * w.blocks + b) * kGroup) : gzero();
  } else {
    s = l = gzero();
  }
}

// A decode step waits on memory: while a tile of D groups is multiplied, the next D groups are
// fetched, block for block (a prefetch past the matrix's end is harmless: it never faults).
template <int Kind, int D>
inline void prefetch_block(const Matrix& w, int64_t g0, int64_t b) {
  constexpr int64_t block_bytes = code_cols(Kind, kBlock) * kGroup * code_bytes(Kind);  // 256, 512 or 1024
  for (int j = 0; j < D; ++j) {
    const int64_t g = g0 + j;
    const char* codes = reinterpret_cast<const char*>(w.codes) +
                        (g * code_cols(Kind, w.K) * kGroup + b * code_cols(Kind, kBlock) * kGroup) * code_bytes(Kind);
    for (int64_t line = 0; line < block_bytes / 64; ++line) _mm_prefetch(codes + 64 * line, _MM_HINT_T0);
    if (blocked(Kind)) _mm_prefetch(reinterpret_cast<const char*>(w.scale + (g * w.blocks + b) * kGroup), _MM_HINT_T0);
    if (Kind == kQ4) _mm_prefetch(reinterpret_cast<const char*>(w.low + (g * w.blocks + b) * kGroup), _MM_HINT_T0);
  }
}

// Few rows: each lane group's weights decoded in registers, used for up to R rows of x at once,
// D lane groups side by side. Every output's sum is one chain of fused multiply-adds, k in order,
// and each has to wait for the one before it (4 cycles); a decode step (one row) with one group
// at a time waited on that chain for most of its time (measured: 9 GB/s of weights, a third of
// the machine's bandwidth). D independent chains hide the wait without changing any sum.
template <int Kind, int R, int D>
inline void direct_tile(const Matrix& w, int64_t g0, const float* x, float* out, int64_t ldo) {
  G acc[R][D];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < D; ++j) acc[r][j] = gzero();
  for (int64_t b = 0; b < w.blocks; ++b) {
    G s[D], l[D];
    prefetch_block<Kind, D>(w, g0 + D, b);  // the same block of the next D groups: the tile after this one
    for (int j = 0; j < D; ++j) block_numbers<Kind>(w, g0 + j, b, s[j], l[j]);
    for (int64_t k = b * kBlock; k < (b + 1) * kBlock; k += 2) {
      for (int j = 0; j < D; ++j) {
        G wv[2];
        decode<Kind>(w, g0 + j, k, s[j], l[j], wv);
        for (int r = 0; r < R; ++r) {
          acc[r][j] = gfma(x[r * w.K + k], wv[0], acc[r][j]);
          acc[r][j] = gfma(x[r * w.K + k + 1], wv[1], acc[r][j]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < D; ++j) gstore(out + r * ldo + j * kGroup, acc[r][j]);
}

// Groups side by side for R rows: enough independent chains (R x D of them) to keep the
// multiply-add units busy, few enough for the registers.
template <int R>
constexpr int groups_beside() { return R == 1 ? 4 : (R <= 3 ? 2 : 1); }

template <int Kind, int R>
inline void direct_rows(const Matrix& w, int64_t g, int64_t groups, const float* x, float* out, int64_t ldo,
                        int64_t rows) {
  if constexpr (R > 0) {
    if (rows == R) {
      constexpr int D = groups_beside<R>();
      int64_t j = 0;
      for (; j + D <= groups; j += D) direct_tile<Kind, R, D>(w, g + j, x, out + j * kGroup, ldo);
      for (; j < groups; ++j) direct_tile<Kind, R, 1>(w, g + j, x, out + j * kGroup, ldo);
    } else {
      direct_rows<Kind, R - 1>(w, g, groups, x, out, ldo, rows);
    }
  }
}

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
// AVX2's few-rows path, by half groups. AVX2 has 16 vector registers, and a lane group (two of
// them) with its scale, low and accumulator takes six: `direct_tile` with 4 groups side by side
// kept 24 values in 16 registers and moved accumulators through the stack every two inputs
// (measured: a one-stream step's 30 layers of products took 8.2 ms, 2.4 cycles per 8 weights).
// Here the unit is 8 lanes, one register each for its accumulator and its block's scale, the low
// read from memory (a q4 weight is still scale * q + low, one fused multiply-add, the same bits),
// the codes widened straight from memory (8 bytes to 8 lanes). The sums are the same chains, k in
// order, one per output: the same bits as `direct_tile` and the panel path.
template <int Kind>
inline const uint8_t* unit_codes(const Matrix& w, int64_t u) {  // unit u: group u / 2, lanes 8 (u % 2) ..
  return w.codes + (u >> 1) * code_cols(Kind, w.K) * kGroup + 8 * (u & 1);
}

template <int Kind, int R, int U>
inline void direct_units(const Matrix& w, int64_t u0, const float* x, float* out, int64_t ldo) {
  static_assert(blocked(Kind), "halves take direct_tile");
  __m256 acc[R][U];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < U; ++j) acc[r][j] = _mm256_setzero_ps();
  const uint8_t* codes[U];
  for (int j = 0; j < U; ++j) codes[j] = unit_codes<Kind>(w, u0 + j);
  const __m256i nibble = _mm256_set1_epi32(0x0f);
  for (int64_t b = 0; b < w.blocks; ++b) {
    __m256 s[U];
    alignas(32) float low[U][8];
    for (int j = 0; j < U; ++j) {
      const int64_t at = ((u0 + j) >> 1) * w.blocks * kGroup + b * kGroup + 8 * ((u0 + j) & 1);
      s[j] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scale + at)));
      if constexpr (Kind == kQ4)
        _mm256_store_ps(low[j], _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.low + at))));
    }
    if ((u0 & 1) == 0) prefetch_block<Kind, (U + 1) / 2>(w, (u0 + U) >> 1, b);  // the next tile's groups
    for (int64_t k = b * kBlock; k < (b + 1) * kBlock; k += 2) {
      __m256 xv[R][2];
      for (int r = 0; r < R; ++r) {
        xv[r][0] = _mm256_broadcast_ss(x + r * w.K + k);
        xv[r][1] = _mm256_broadcast_ss(x + r * w.K + k + 1);
      }
      for (int j = 0; j < U; ++j) {
        __m256 w0, w1;
        if constexpr (Kind == kQ4) {
          const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes[j] + k / 2 * kGroup)));
          const __m256 l = _mm256_load_ps(low[j]);
          w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, nibble)), s[j], l);
          w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), s[j], l);
        } else {
          const uint8_t* c = codes[j] + k * kGroup;
          w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)))), s[j]);
          w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + kGroup)))), s[j]);
        }
        for (int r = 0; r < R; ++r) {
          acc[r][j] = _mm256_fmadd_ps(xv[r][0], w0, acc[r][j]);
          acc[r][j] = _mm256_fmadd_ps(xv[r][1], w1, acc[r][j]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < U; ++j) _mm256_storeu_ps(out + r * ldo + 8 * j, acc[r][j]);
}

// Units side by side for R rows: enough chains for the multiply-add units' latency, few enough
// values for the 16 registers (measured, 30 layers' products: 2 units at 2 rows and at 3; at 4
// and 5 rows `direct_tile`'s one group, which reloads the inputs' broadcasts, is faster than units).
template <int R>
constexpr int units_beside() { return R == 1 ? 4 : 2; }

template <int Kind, int R>
inline void direct_unit_rows(const Matrix& w, int64_t g, int64_t groups, const float* x, float* out, int64_t ldo,
                             int64_t rows) {
  if constexpr (R > 0) {
    if constexpr (R >= 4) {
      if (rows == R) direct_rows<Kind, R>(w, g, groups, x, out, ldo, rows);
      else direct_unit_rows<Kind, R - 1>(w, g, groups, x, out, ldo, rows);
    } else if (rows == R) {
      constexpr int U = units_beside<R>();
      const int64_t u1 = 2 * (g + groups);
      int64_t u = 2 * g;
      for (; u + U <= u1; u += U) direct_units<Kind, R, U>(w, u, x, out + (u - 2 * g) * 8, ldo);
      for (; u < u1; ++u) direct_units<Kind, R, 1>(w, u, x, out + (u - 2 * g) * 8, ldo);
    } else {
      direct_unit_rows<Kind, R - 1>(w, g, groups, x, out, ldo, rows);
    }
  }
}
#endif

// Many rows: NG lane groups decoded once into a panel [K][NG * 16], then MR x NG tiles from it.
template <int Kind>
void decode_panel(const Matrix& w, int64_t g0, int64_t groups, float* panel) {
  for (int64_t j = 0; j < groups; ++j) {
    const int64_t g = g0 + j;
    for (int64_t b = 0; b < w.blocks; ++b) {
      G s, l;
      block_numbers<Kind>(w, g, b, s, l);
      for (int64_t k = b * kBlock; k < (b + 1) * kBlock; k += 2) {
        G wv[2];
        decode<Kind>(w, g, k, s, l, wv);
        gstore(panel + (k * NG + j) * kGroup, wv[0]);
        gstore(panel + ((k + 1) * NG + j) * kGroup, wv[1]);
      }
    }
  }
}

template <int RM>
inline void panel_tile(const float* x, int64_t K, const float* panel, float* out, int64_t ldo) {
  G acc[RM][NG];
  for (int r = 0; r < RM; ++r)
    for (int j = 0; j < NG; ++j) acc[r][j] = gzero();
  for (int64_t k = 0; k < K; ++k) {
    G wv[NG];
    for (int j = 0; j < NG; ++j) {
      wv[j] = gload(panel + (k * NG + j) * kGroup);
      keep(wv[j]);  // loaded once, used by every row (the compiler would fold it into each)
    }
    for (int r = 0; r < RM; ++r) {
      const float xv = x[r * K + k];
      for (int j = 0; j < NG; ++j) acc[r][j] = gfma(xv, wv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < RM; ++r)
    for (int j = 0; j < NG; ++j) gstore(out + r * ldo + j * kGroup, acc[r][j]);
}

template <int RM>
inline void panel_rows(const float* x, int64_t K, const float* panel, float* out, int64_t ldo, int64_t rows) {
  if constexpr (RM > 0) {
    if (rows == RM) panel_tile<RM>(x, K, panel, out, ldo);
    else panel_rows<RM - 1>(x, K, panel, out, ldo, rows);
  }
}

template <int Kind>
at::Tensor grid_linear(const at::Tensor& x, const at::Tensor& codes, const std::optional<at::Tensor>& scale,
                          const std::optional<at::Tensor>& low, int64_t panel_from) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be [rows, in] float32");
  const auto xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), groups = codes.size(0);
  TORCH_CHECK(K % kBlock == 0, "the input size must be a multiple of 32");
  TORCH_CHECK(codes.is_contiguous() && codes.dim() == 3 && codes.size(1) == code_cols(Kind, K) &&
                  codes.size(2) == kGroup && codes.element_size() == code_bytes(Kind),
              "weight shape does not match x");
  TORCH_CHECK(!blocked(Kind) || (scale && scale->size(1) == K / kBlock), "weight scale does not match x");
  const int64_t N = groups * kGroup;
  auto out = xc.new_empty({M, N});
  const auto halves = [](const std::optional<at::Tensor>& t) {
    return t ? reinterpret_cast<const uint16_t*>(t->data_ptr<at::Half>()) : nullptr;
  };
  const Matrix w{static_cast<const uint8_t*>(codes.data_ptr()), halves(scale), Kind == kQ4 ? halves(low) : nullptr,
                 K, K / kBlock};
  const float* xp = xc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  if (M < panel_from || groups % NG != 0) {
    // About four pieces a thread: long runs of groups (the weights stream in order, the next tile
    // prefetched is this thread's own), and still room for one thread to take another's share.
    const int64_t grain = std::max<int64_t>(4, (groups / (4 * at::get_num_threads()) + 3) / 4 * 4);
    shared_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
      for (int64_t m = 0; m < M; m += kDirect) {
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
        if constexpr (blocked(Kind)) {
          direct_unit_rows<Kind, kDirect>(w, g0, g1 - g0, xp + m * K, op + m * N + g0 * kGroup, N,
                                          std::min<int64_t>(kDirect, M - m));
          continue;
        }
#endif
        direct_rows<Kind, kDirect>(w, g0, g1 - g0, xp + m * K, op + m * N + g0 * kGroup, N,
                                 std::min<int64_t>(kDirect, M - m));
      }
    });
    return out;
  }
  shared_for(0, groups / NG, 1, [&](int64_t p0, int64_t p1) {
    thread_local std::vector<float> panel;  // one per thread, kept: a piece is one panel
    panel.resize(K * NG * kGroup);
    for (int64_t p = p0; p < p1; ++p) {
      decode_panel<Kind>(w, p * NG, NG, panel.data());
      for (int64_t m = 0; m < M; m += MR)
        panel_rows<MR>(xp + m * K, K, panel.data(), op + m * N + p * NG * kGroup, N, std::min<int64_t>(MR, M - m));
    }
  });
  return out;
}

}  // namespace

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                        const at::Tensor& low, int64_t panel_from) {
  return grid_linear<kQ4>(x, codes, scale, low, panel_from);
}

at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                        int64_t panel_from) {
  return grid_linear<kQ8>(x, codes, scale, std::nullopt, panel_from);
}

at::Tensor half_linear(const at::Tensor& x, const at::Tensor& codes, int64_t panel_from) {
  TORCH_CHECK(codes.scalar_type() == at::kBFloat16 || codes.scalar_type() == at::kHalf,
              "a half matrix's codes are bfloat16 or float16");
  return codes.scalar_type() == at::kBFloat16 ? grid_linear<kBF16>(x, codes, std::nullopt, std::nullopt, panel_from)
                                                 : grid_linear<kF16>(x, codes, std::nullopt, std::nullopt, panel_from);
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

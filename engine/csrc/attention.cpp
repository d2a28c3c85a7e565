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
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
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

}  // namespace

at::Tensor attend(const at::Tensor& q_in, const at::Tensor& new_kv_in, const std::vector<at::Tensor>& caches,
                     const std::vector<int64_t>& starts, const std::vector<int64_t>& lengths, int64_t layer,
                     double scale_in, int64_t group) {
  TORCH_CHECK(q_in.dim() == 3 && q_in.scalar_type() == at::kFloat, "q must be [tokens, heads, d] float32");
  const auto q = q_in.contiguous();
  const auto new_kv = new_kv_in.contiguous();  // [tokens, kv_heads, 2d]
  const int64_t T = q.size(0), H = q.size(1), d = q.size(2), KVH = new_kv.size(1);
  TORCH_CHECK(caches.size() == starts.size() && starts.size() == lengths.size(), "one start and length per chunk");
  TORCH_CHECK(H == KVH * group && new_kv.size(2) == 2 * d, "head counts do not match");
  const float scale = static_cast<float>(scale_in);
  auto out = at::zeros({T, H * d}, q.options());
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

  std::vector<int64_t> chunk_of(row_of[chunks]);
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t r = row_of[c]; r < row_of[c + 1]; ++r) chunk_of[r] = c;
  // Work items: (query row, KV head); a KV head's query heads share its keys' reads.
  const int64_t items = row_of[chunks] * KVH;
  shared_for(0, items, 1, [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> scores;
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t row = item / KVH, kh = item % KVH, c = chunk_of[row];
      const int64_t seen = starts[c] + (row - row_of[c]) + 1;  // keys 0 .. position
      const float* kv = base[c] + kh * cap[c] * 2 * d;
      scores.resize(seen);
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kh * group + g;
        const float* qh = qp + (row * H + h) * d;
        float top = -INFINITY;
        for (int64_t j = 0; j < seen; ++j) {
          scores[j] = dot(qh, kv + j * 2 * d, d) * scale;
          top = std::max(top, scores[j]);
        }
        float total = 0.f;
        float* o = op + row * H * d + h * d;
        for (int64_t j = 0; j < seen; ++j) {
          const float e = std::exp(scores[j] - top);
          total += e;
          axpy(o, e, kv + j * 2 * d + d, d);
        }
        const float inv = 1.f / total;
        for (int64_t i = 0; i < d; ++i) o[i] *= inv;
      }
    }
  });
  return out;
}

}  // namespace brigade

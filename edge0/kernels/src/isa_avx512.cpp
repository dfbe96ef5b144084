// The AVX-512 variant of the row kernel (compiled with -mavx512f -mfma, run only where
// the CPU reports AVX-512F).
#include <immintrin.h>

#include "kernel.h"

namespace edge0k {
namespace {

struct V {
  static constexpr int W = 16;
  // the GEMM's register tile (gemm_impl.h): weight rows x input rows, in 32 registers
  static constexpr int GEMM_R = 4, GEMM_M = 4;
  using f = __m512;
  static f zero() { return _mm512_setzero_ps(); }
  static f load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, f a) { _mm512_storeu_ps(p, a); }
  static f set1(float a) { return _mm512_set1_ps(a); }
  static f fma(f a, f b, f c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(f a) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
  }
  // out[j] = sum(a[j]), j < N, each in sum's own order (lane i + i+8, then i + i+4, then
  // 0 + 2 and 1 + 3, then the two), sixteen sums a pass: fewer shuffles than N sums
  template <int N>
  static void sums(const f* a, float* out) {
    for (int j0 = 0; j0 < N; j0 += 16) {
      auto in = [&](int j) { return a[j0 + j < N ? j0 + j : j0]; };  // lanes past N: unused
      f h[8], q[4], d[2];
      for (int p = 0; p < 8; ++p)  // [a(2p) lanes i + i+8 | a(2p+1) lanes i + i+8]
        h[p] = _mm512_add_ps(_mm512_shuffle_f32x4(in(2 * p), in(2 * p + 1), 0x44),
                             _mm512_shuffle_f32x4(in(2 * p), in(2 * p + 1), 0xEE));
      for (int t = 0; t < 4; ++t)  // block b: a(4t + b) lanes i + i+4
        q[t] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * t], h[2 * t + 1], 0x88),
                             _mm512_shuffle_f32x4(h[2 * t], h[2 * t + 1], 0xDD));
      for (int u = 0; u < 2; ++u)  // block b: 0 + 2, 1 + 3 of a(8u + b), then of a(8u + 4 + b)
        d[u] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * u], q[2 * u + 1], 0x44),
                             _mm512_shuffle_ps(q[2 * u], q[2 * u + 1], 0xEE));
      // block b, lane c: the sum of a(4c + b)
      const f s = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, s);
      for (int j = 0; j < 16 && j0 + j < N; ++j) out[j0 + j] = lanes[4 * (j % 4) + j / 4];
    }
  }
  static __m512i widen(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void nibbles(const uint8_t* p, f& lo, f& hi) {
    const __m512i v = widen(p);
    lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
    hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
  }
  static void fp4(const uint8_t* p, f& lo, f& hi) {
    const __m512 lut = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f,
                                      -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
    const __m512i v = widen(p);
    lo = _mm512_permutexvar_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)), lut);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut);
  }
  static constexpr bool FP4_WIDE = false;
  static constexpr bool Q8 = false;  // int8 inputs: the avx2 unit's (dispatch.cpp)
  static f bytes(const uint8_t* p) { return _mm512_cvtepi32_ps(widen(p)); }
  // into L2, not L1 (kernel_impl.h, PREFETCH_BYTES): a line headed for L1 holds one of its
  // ~12 fill buffers until it arrives, which caps one core's stream from DRAM near 6 GB/s;
  // L2 keeps more lines in flight (docs/benchmarks/kernels.md, "Prefetch into L2")
  static void prefetch(const void* p) {
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1);
  }
};

#include "kernel_impl.h"
#include "gemm_impl.h"

}  // namespace

const Kernels* kernels_avx512() {
  static const Kernels k{"avx512", V::W, &rows_entry, nullptr, q8_rows<V>(), &gemm_entry, V::GEMM_R};
  return &k;
}

}  // namespace edge0k

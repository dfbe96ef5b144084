// The AVX2 + FMA variant of the row kernel (compiled with -mavx2 -mfma, run only where
// the CPU reports both).
#include <immintrin.h>

#include "kernel.h"

namespace edge0k {
namespace {

struct V {
  static constexpr int W = 8;
  using f = __m256;
  static f zero() { return _mm256_setzero_ps(); }
  static f load(const float* p) { return _mm256_loadu_ps(p); }
  static f set1(float a) { return _mm256_set1_ps(a); }
  static f fma(f a, f b, f c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(f a) {
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
  }
  static __m256i widen(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static void nibbles(const uint8_t* p, f& lo, f& hi) {
    const __m256i v = widen(p);
    lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
    hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
  }
  static f fp4_of(__m256i code) {  // magnitude from the low 3 bits, sign from bit 3
    const __m256 lut = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256 mag = _mm256_permutevar8x32_ps(lut, code);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(8)), 28);
    return _mm256_xor_ps(mag, _mm256_castsi256_ps(sign));
  }
  static void fp4(const uint8_t* p, f& lo, f& hi) {
    const __m256i v = widen(p);
    lo = fp4_of(_mm256_and_si256(v, _mm256_set1_epi32(15)));
    hi = fp4_of(_mm256_srli_epi32(v, 4));
  }
  static f bytes(const uint8_t* p) { return _mm256_cvtepi32_ps(widen(p)); }
  static void prefetch(const void* p) {
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
  }
};

#include "kernel_impl.h"

}  // namespace

const Kernels* kernels_avx2() {
  static const Kernels k{"avx2", V::W, &rows_entry};
  return &k;
}

}  // namespace edge0k

// The AVX2 + FMA variant of the row kernel (compiled with -mavx2 -mfma -mf16c, run only
// where the CPU reports all three).
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
  // FP4 (e2m1) codes -> the high byte of their fp16 value: the low byte is 0 for all
  // sixteen, so a byte shuffle and an unpack give exact fp16s, and F16C widens them
  // (1.3x the float permute this replaced, measured)
  static __m128i fp4_lut() {
    return _mm_setr_epi8(0x00, 0x38, 0x3c, 0x3e, 0x40, 0x42, 0x44, 0x46, char(0x80), char(0xb8),
                         char(0xbc), char(0xbe), char(0xc0), char(0xc2), char(0xc4), char(0xc6));
  }
  static void fp4(const uint8_t* p, f& lo, f& hi) {
    f w[4];
    fp4_pair(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), w);
    lo = w[0];
    hi = w[1];
  }
  static constexpr bool FP4_WIDE = true;
  static void fp4x2(const uint8_t* p, f* w) {  // 16 bytes: two chunks, each lo then hi
    fp4_pair(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), w);
  }
  static void fp4_pair(__m128i v, f* w) {
    const __m128i m = _mm_set1_epi8(15);
    const __m128i l = _mm_shuffle_epi8(fp4_lut(), _mm_and_si128(v, m));
    const __m128i h = _mm_shuffle_epi8(fp4_lut(), _mm_and_si128(_mm_srli_epi16(v, 4), m));
    const __m128i z = _mm_setzero_si128();
    w[0] = _mm256_cvtph_ps(_mm_unpacklo_epi8(z, l));
    w[1] = _mm256_cvtph_ps(_mm_unpacklo_epi8(z, h));
    w[2] = _mm256_cvtph_ps(_mm_unpackhi_epi8(z, l));
    w[3] = _mm256_cvtph_ps(_mm_unpackhi_epi8(z, h));
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

// The AVX2 + FMA variant of the row kernel and of the Gated-DeltaNet state rows (compiled
// with -mavx2 -mfma, run only where the CPU reports both).
#include <immintrin.h>

#include "kernel.h"

namespace edge0k {
namespace {

struct V {
  static constexpr int W = 8;
  // the GEMM's register tile (gemm_impl.h): weight rows x input rows, in 16 registers
  static constexpr int GEMM_R = 3, GEMM_M = 2;
  using f = __m256;
  static f zero() { return _mm256_setzero_ps(); }
  static f load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, f a) { _mm256_storeu_ps(p, a); }
  static f set1(float a) { return _mm256_set1_ps(a); }
  static f fma(f a, f b, f c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(f a) {
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
  }
  // out[j] = sum(a[j]), j < N, each in sum's own order (lane i + i+4, then 0 + 2 and 1 + 3,
  // then the two), eight sums a pass: fewer shuffles than N sums
  template <int N>
  static void sums(const f* a, float* out) {
    for (int j0 = 0; j0 < N; j0 += 8) {
      auto in = [&](int j) { return a[j0 + j < N ? j0 + j : j0]; };  // lanes past N: unused
      f q[4], d[2];
      for (int p = 0; p < 4; ++p)  // [a(2p) lanes i + i+4 | a(2p+1) lanes i + i+4]
        q[p] = _mm256_add_ps(_mm256_permute2f128_ps(in(2 * p), in(2 * p + 1), 0x20),
                             _mm256_permute2f128_ps(in(2 * p), in(2 * p + 1), 0x31));
      for (int t = 0; t < 2; ++t)  // block b: 0 + 2, 1 + 3 of a(4t + b), then of a(4t + 2 + b)
        d[t] = _mm256_add_ps(_mm256_shuffle_ps(q[2 * t], q[2 * t + 1], 0x44),
                             _mm256_shuffle_ps(q[2 * t], q[2 * t + 1], 0xEE));
      // block b, lane c: the sum of a(2c + b)
      const f s = _mm256_add_ps(_mm256_shuffle_ps(d[0], d[1], 0x88), _mm256_shuffle_ps(d[0], d[1], 0xDD));
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, s);
      for (int j = 0; j < 8 && j0 + j < N; ++j) out[j0 + j] = lanes[4 * (j % 2) + j / 2];
    }
  }
  static __m256i widen(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static void nibbles(const uint8_t* p, f& lo, f& hi) {
    const __m256i v = widen(p);
    lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
    hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
  }
  // FP4 (e2m1) codes -> bfloat16: every e2m1 value is exact in bf16, so two byte
  // shuffles (a table of high bytes, sign included, and one of low bytes) and an unpack
  // give sixteen bf16s a register, and a float's high half is a bf16: a mask keeps the odd
  // words, a shift moves up the even ones. The inputs meet them through FP4_PERM (x is
  // permuted once per call). No conversion instruction, no unpack with zeros.
  static constexpr bool FP4_WIDE = true;
  static void fp4x2(const uint8_t* p, f* w) {  // 16 bytes: 32 codes -> w[0..3], FP4_PERM order
    const __m256i hi_lut = _mm256_broadcastsi128_si256(
        _mm_setr_epi8(0x00, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40, char(0x80), char(0xbf),
                      char(0xbf), char(0xbf), char(0xc0), char(0xc0), char(0xc0), char(0xc0)));
    const __m256i lo_lut = _mm256_broadcastsi128_si256(
        _mm_setr_epi8(0x00, 0x00, char(0x80), char(0xc0), 0x00, 0x40, char(0x80), char(0xc0),
                      0x00, 0x00, char(0x80), char(0xc0), 0x00, 0x40, char(0x80), char(0xc0)));
    // lane 0: the low nibbles of the 16 bytes (even codes), lane 1: the high (odd codes)
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i idx = _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)),
                                         _mm256_set1_epi8(15));
    const __m256i hb = _mm256_shuffle_epi8(hi_lut, idx);
    const __m256i lb = _mm256_shuffle_epi8(lo_lut, idx);
    const __m256i t0 = _mm256_unpacklo_epi8(lb, hb);  // bf16 words: codes 2k (lane 0), 2k+1 (lane 1)
    const __m256i t1 = _mm256_unpackhi_epi8(lb, hb);  // the same for codes 16+2k, 17+2k
    const __m256i odd = _mm256_set1_epi32(int(0xffff0000u));
    w[0] = _mm256_castsi256_ps(_mm256_and_si256(t0, odd));
    w[1] = _mm256_castsi256_ps(_mm256_slli_epi32(t0, 16));
    w[2] = _mm256_castsi256_ps(_mm256_and_si256(t1, odd));
    w[3] = _mm256_castsi256_ps(_mm256_slli_epi32(t1, 16));
  }
  // int8 inputs (kernel.h: XQ8): 64 codes in two registers, the low nibbles of 32 bytes
  // and the high ones (the order XQ8 stores a pair of blocks in), read unsigned (affine q,
  // MXFP4 2v + 12); pmaddubsw multiplies them with x, signed (products of at most 24 * 127:
  // no saturation), the two are added and the fix takes the offset back (|sum| < 2^14),
  // pmaddwd adds pairs again
  static constexpr bool Q8 = true;
  struct q8w {
    __m256i lo, hi;
  };
  static q8w q8_split(__m256i raw) {
    const __m256i m = _mm256_set1_epi8(15);
    return {_mm256_and_si256(raw, m), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m)};
  }
  static q8w q8_codes(const uint8_t* p) {
    return q8_split(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static q8w q8_codes_half(const uint8_t* p) {  // a lone last block: its partner's codes 0
    return q8_split(_mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static q8w q8_lut(q8w c) {  // e2m1 code -> 2 * value + 12, in 0..24
    const __m256i lut = _mm256_broadcastsi128_si256(
        _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    return {_mm256_shuffle_epi8(lut, c.lo), _mm256_shuffle_epi8(lut, c.hi)};
  }
  static q8w q8_fp4(const uint8_t* p) { return q8_lut(q8_codes(p)); }
  static q8w q8_fp4_half(const uint8_t* p) { return q8_lut(q8_codes_half(p)); }
  static f q8_dot(const q8w& w, const int8_t* x, const int16_t* fix) {
    const __m256i lo = _mm256_maddubs_epi16(w.lo, _mm256_load_si256(reinterpret_cast<const __m256i*>(x)));
    const __m256i hi = _mm256_maddubs_epi16(w.hi, _mm256_load_si256(reinterpret_cast<const __m256i*>(x + 32)));
    const __m256i c = _mm256_sub_epi16(_mm256_add_epi16(lo, hi),
                                       _mm256_load_si256(reinterpret_cast<const __m256i*>(fix)));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(c, _mm256_set1_epi16(1)));
  }
  static f q8_halves(float a, float b) { return _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a)); }
  static f q8_mul(f a, const float* b) { return _mm256_mul_ps(a, _mm256_load_ps(b)); }
  static f q8_fma(f a, f b, f c) { return _mm256_fmadd_ps(a, b, c); }
  static f bytes(const uint8_t* p) { return _mm256_cvtepi32_ps(widen(p)); }
  // into L2, not L1 (kernel_impl.h, PREFETCH_BYTES): a line headed for L1 holds one of its
  // ~12 fill buffers until it arrives, which caps one core's stream from DRAM near 6 GB/s;
  // L2 keeps more lines in flight (docs/benchmarks/kernels.md, "Prefetch into L2")
  static void prefetch(const void* p) {
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1);
  }
};

#include "kernel_impl.h"
#include "gemm_impl.h"

// the code each of fp4x2's 32 output lanes holds: w[0] takes odd words of t0 (codes 4d+2 in
// lane 0, 4d+3 in lane 1), w[1] its even words (4d, 4d+1), w[2] and w[3] the same plus 16
constexpr uint8_t FP4_PERM[32] = {2,  6,  10, 14, 3,  7,  11, 15, 0,  4,  8,  12, 1,  5,  9,  13,
                                  18, 22, 26, 30, 19, 23, 27, 31, 16, 20, 24, 28, 17, 21, 25, 29};

// r[c] lane a <- r[a] lane c
inline __attribute__((always_inline)) void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

constexpr int64_t DELTA_MAX_DK = 512;  // the block's scratch: 8 rows of up to this many

// kernel.h, Kernels::delta: eight rows a pass, one row a lane. A block of 8 x 8 state values
// is scaled or updated row-wise (elementwise: any order), then transposed so that each row's
// sum over j takes its products one after another, j ascending, as the scalar code does.
// The scaled rows wait in a scratch block (L1) for the second pass, which writes the new
// rows once, streamed past the caches where aligned: the state is read back next token,
// after the whole model has gone through the caches, and a cached store would first read
// the line it overwrites.
void delta_rows(const float* from, float* s, int64_t n, int64_t Dk, const float* q,
                const float* k, const float* v, float g, float beta, float* y) {
  alignas(32) float blk[8 * DELTA_MAX_DK];
  const bool scratch = Dk <= DELTA_MAX_DK;
  const bool stream = scratch && reinterpret_cast<uintptr_t>(s) % 32 == 0;
  const __m256 gv = _mm256_set1_ps(g), bv = _mm256_set1_ps(beta);
  for (int64_t i = 0; i < n; i += 8) {
    const float* f = from + i * Dk;
    float* t = s + i * Dk;
    float* mid = scratch ? blk : t;  // the scaled rows (row a at mid + a * Dk)
    __m256 acc = _mm256_setzero_ps();  // kv = sum_j (s[i, j] * g) * k[j]
    for (int64_t j = 0; j < Dk; j += 8) {
      __m256 r[8];
      for (int a = 0; a < 8; ++a) {
        r[a] = _mm256_mul_ps(_mm256_loadu_ps(f + a * Dk + j), gv);
        _mm256_storeu_ps(mid + a * Dk + j, r[a]);
      }
      transpose8(r);
      for (int c = 0; c < 8; ++c)
        acc = _mm256_add_ps(acc, _mm256_mul_ps(r[c], _mm256_set1_ps(k[j + c])));
    }
    alignas(32) float delta[8];  // (v - kv) * beta
    _mm256_store_ps(delta, _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + i), acc), bv));
    __m256 out = _mm256_setzero_ps();  // y = sum_j (s[i, j] + k[j] * delta[i]) * q[j]
    for (int64_t j = 0; j < Dk; j += 8) {
      const __m256 kj = _mm256_loadu_ps(k + j);
      __m256 r[8];
      for (int a = 0; a < 8; ++a) {
        const __m256 u = _mm256_mul_ps(kj, _mm256_set1_ps(delta[a]));
        r[a] = _mm256_add_ps(_mm256_loadu_ps(mid + a * Dk + j), u);
        if (stream)
          _mm256_stream_ps(t + a * Dk + j, r[a]);
        else
          _mm256_storeu_ps(t + a * Dk + j, r[a]);
      }
      transpose8(r);
      for (int c = 0; c < 8; ++c)
        out = _mm256_add_ps(out, _mm256_mul_ps(r[c], _mm256_set1_ps(q[j + c])));
    }
    _mm256_storeu_ps(y + i, out);
  }
  if (stream) _mm_sfence();  // the streamed rows are visible before the caller reads them
}

}  // namespace

const Kernels* kernels_avx2() {
  static const Kernels k{"avx2",      V::W,        &rows_entry, FP4_PERM, q8_rows<V>(),
                         &gemm_entry, V::GEMM_R,  &delta_rows};
  return &k;
}

}  // namespace edge0k

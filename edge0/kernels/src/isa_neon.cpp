// The NEON variant of the row kernel (AArch64, where NEON is always present).
#include <arm_neon.h>

#include "kernel.h"

namespace edge0k {
namespace {

// FP4 (e2m1) codes -> the high byte of their fp16 value (the low byte is 0 for all
// sixteen): a table lookup and a zip with zeros give exact fp16s to widen
constexpr uint8_t FP4_HALF_HIGH[16] = {0x00, 0x38, 0x3c, 0x3e, 0x40, 0x42, 0x44, 0x46,
                                       0x80, 0xb8, 0xbc, 0xbe, 0xc0, 0xc2, 0xc4, 0xc6};

struct V {
  static constexpr int W = 4;
  // the GEMM's register tile (gemm_impl.h): weight rows x input rows, in 32 registers
  static constexpr int GEMM_R = 4, GEMM_M = 3;
  using f = float32x4_t;
  static f zero() { return vdupq_n_f32(0.0f); }
  static f load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, f a) { vst1q_f32(p, a); }
  static f set1(float a) { return vdupq_n_f32(a); }
  static f fma(f a, f b, f c) { return vfmaq_f32(c, a, b); }
  static float sum(f a) {
    const float32x2_t h = vadd_f32(vget_low_f32(a), vget_high_f32(a));
    return vget_lane_f32(h, 0) + vget_lane_f32(h, 1);
  }
  template <int N>
  static void sums(const f* a, float* out) {
    for (int j = 0; j < N; ++j) out[j] = sum(a[j]);
  }
  static uint32x4_t widen(const uint8_t* p) {
    uint32_t word;
    __builtin_memcpy(&word, p, 4);
    const uint8x8_t b = vreinterpret_u8_u32(vdup_n_u32(word));
    return vmovl_u16(vget_low_u16(vmovl_u8(b)));
  }
  static void nibbles(const uint8_t* p, f& lo, f& hi) {
    const uint32x4_t v = widen(p);
    lo = vcvtq_f32_u32(vandq_u32(v, vdupq_n_u32(15)));
    hi = vcvtq_f32_u32(vshrq_n_u32(v, 4));
  }
  static void fp4x2(const uint8_t* p, f* w) { fp4_pair(vld1_u8(p), w); }  // 8 bytes: 2 chunks
  static void fp4_pair(uint8x8_t v, f* w) {
    const uint8x16_t lut = vld1q_u8(FP4_HALF_HIGH);
    const uint8x8_t l = vqtbl1_u8(lut, vand_u8(v, vdup_n_u8(15)));
    const uint8x8_t h = vqtbl1_u8(lut, vshr_n_u8(v, 4));
    const uint8x8_t z = vdup_n_u8(0);
    w[0] = vcvt_f32_f16(vreinterpret_f16_u8(vzip1_u8(z, l)));
    w[1] = vcvt_f32_f16(vreinterpret_f16_u8(vzip1_u8(z, h)));
    w[2] = vcvt_f32_f16(vreinterpret_f16_u8(vzip2_u8(z, l)));
    w[3] = vcvt_f32_f16(vreinterpret_f16_u8(vzip2_u8(z, h)));
  }
  static constexpr bool FP4_WIDE = true;
  // int8 inputs (kernel.h: XQ8), the same bits as AVX2's and the portable unit's: the
  // eight lanes of a pair are two registers, each lane the exact integer sum of 8
  // consecutive products, the codes centred as signed integers (affine q - 8, MXFP4 twice
  // the e2m1 value: no fix to take back); products widened to 16 bits and added in pairs
  // (any order: every sum is exact), then one rounding per product and per FMA
  static constexpr bool Q8 = true;
  struct q8f {
    float32x4_t a, b;  // lanes 0-3 (the pair's first block), 4-7
  };
  static q8f q8_zero() { return {zero(), zero()}; }
  static q8f q8_set1(float s) { return {set1(s), set1(s)}; }
  static float q8_sum(q8f v) {  // AVX2's order: lanes i + (i + 4), then (0 + 2) + (1 + 3)
    const float32x4_t q = vaddq_f32(v.a, v.b);
    const float32x2_t d = vadd_f32(vget_low_f32(q), vget_high_f32(q));
    return vget_lane_f32(d, 0) + vget_lane_f32(d, 1);
  }
  struct q8w {
    int8x16_t lo[2], hi[2];  // the low nibbles of 32 code bytes (even codes), the high
  };
  static q8w q8_split(uint8x16_t b0, uint8x16_t b1) {
    const uint8x16_t m = vdupq_n_u8(15);
    return {{vreinterpretq_s8_u8(vandq_u8(b0, m)), vreinterpretq_s8_u8(vandq_u8(b1, m))},
            {vreinterpretq_s8_u8(vshrq_n_u8(b0, 4)), vreinterpretq_s8_u8(vshrq_n_u8(b1, 4))}};
  }
  template <class Code>
  static q8w q8_map(q8w w, bool whole, Code code) {
    q8w r;
    for (int h = 0; h < 2; ++h) {
      r.lo[h] = code(w.lo[h]);
      r.hi[h] = code(w.hi[h]);
    }
    if (!whole) r.lo[1] = r.hi[1] = vdupq_n_s8(0);  // a lone last block: no partner
    return r;
  }
  static int8x16_t centred(int8x16_t c) { return vsubq_s8(c, vdupq_n_s8(Q8_AFFINE_OFFSET)); }
  static int8x16_t twice_e2m1(int8x16_t c) {
    static constexpr int8_t LUT[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    return vqtbl1q_s8(vld1q_s8(LUT), vreinterpretq_u8_s8(c));
  }
  static q8w q8_load(const uint8_t* p, bool whole) {
    return q8_split(vld1q_u8(p), whole ? vld1q_u8(p + 16) : vdupq_n_u8(0));
  }
  static q8w q8_codes(const uint8_t* p) { return q8_map(q8_load(p, true), true, centred); }
  static q8w q8_codes_half(const uint8_t* p) { return q8_map(q8_load(p, false), false, centred); }
  static q8w q8_fp4(const uint8_t* p) { return q8_map(q8_load(p, true), true, twice_e2m1); }
  static q8w q8_fp4_half(const uint8_t* p) {
    return q8_map(q8_load(p, false), false, twice_e2m1);
  }
  // four lanes: 16 code bytes (low nibbles `lo` against x's evens, high `hi` against its
  // odds), lane j the 8 products of bytes 4j..4j+3
  static float32x4_t q8_quad(int8x16_t lo, int8x16_t hi, const int8_t* xe, const int8_t* xo) {
    const int8x16_t e = vld1q_s8(xe), o = vld1q_s8(xo);
    int16x8_t p0 = vmull_s8(vget_low_s8(lo), vget_low_s8(e));
    p0 = vmlal_s8(p0, vget_low_s8(hi), vget_low_s8(o));  // |.| <= 2 * 12 * 127
    int16x8_t p1 = vmull_high_s8(lo, e);
    p1 = vmlal_high_s8(p1, hi, o);
    const int32x4_t s = vpaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1));
    return vcvtq_f32_s32(s);
  }
  static q8f q8_dot(const q8w& w, const int8_t* x, const int16_t*) {
    return {q8_quad(w.lo[0], w.hi[0], x, x + 32), q8_quad(w.lo[1], w.hi[1], x + 16, x + 48)};
  }
  static q8f q8_halves(float a, float b) { return {set1(a), set1(b)}; }
  static q8f q8_mul(q8f a, const float* b) {
    return {vmulq_f32(a.a, vld1q_f32(b)), vmulq_f32(a.b, vld1q_f32(b + 4))};
  }
  static q8f q8_fma(q8f a, q8f b, q8f c) {
    return {vfmaq_f32(c.a, a.a, b.a), vfmaq_f32(c.b, a.b, b.b)};
  }
  static f bytes(const uint8_t* p) { return vcvtq_f32_u32(widen(p)); }
  static void prefetch(const void* p) { __builtin_prefetch(p); }
};

#include "kernel_impl.h"
#include "gemm_impl.h"

}  // namespace

const Kernels* kernels_neon() {
  static const Kernels k{"neon", V::W, &rows_entry, nullptr, q8_rows<V>(), &gemm_entry, V::GEMM_R};
  return &k;
}

}  // namespace edge0k

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
  using f = float32x4_t;
  static f zero() { return vdupq_n_f32(0.0f); }
  static f load(const float* p) { return vld1q_f32(p); }
  static f set1(float a) { return vdupq_n_f32(a); }
  static f fma(f a, f b, f c) { return vfmaq_f32(c, a, b); }
  static float sum(f a) {
    const float32x2_t h = vadd_f32(vget_low_f32(a), vget_high_f32(a));
    return vget_lane_f32(h, 0) + vget_lane_f32(h, 1);
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
  static constexpr bool Q8 = false;  // no int8-input path (kernel.h: rows_q8)
  static f bytes(const uint8_t* p) { return vcvtq_f32_u32(widen(p)); }
  static void prefetch(const void* p) { __builtin_prefetch(p); }
};

#include "kernel_impl.h"

}  // namespace

const Kernels* kernels_neon() {
  static const Kernels k{"neon", V::W, &rows_entry, nullptr, q8_rows<V>()};
  return &k;
}

}  // namespace edge0k

// The NEON variant of the row kernel (AArch64, where NEON is always present).
#include <arm_neon.h>

#include "kernel.h"

namespace edge0k {
namespace {

constexpr float FP4_VALUES[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

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
  static void fp4(const uint8_t* p, f& lo, f& hi) {
    float l[4], h[4];
    for (int i = 0; i < 4; ++i) {
      l[i] = FP4_VALUES[p[i] & 15];
      h[i] = FP4_VALUES[p[i] >> 4];
    }
    lo = vld1q_f32(l);
    hi = vld1q_f32(h);
  }
  static constexpr bool FP4_WIDE = false;
  static f bytes(const uint8_t* p) { return vcvtq_f32_u32(widen(p)); }
  static void prefetch(const void* p) { __builtin_prefetch(p); }
};

#include "kernel_impl.h"

}  // namespace

const Kernels* kernels_neon() {
  static const Kernels k{"neon", V::W, &rows_entry};
  return &k;
}

}  // namespace edge0k

// The portable variant of the row kernel: plain C++ over 8-float blocks, which the
// compiler vectorises for the baseline of whatever CPU it targets.
#include "kernel.h"

namespace edge0k {
namespace {

constexpr float FP4_VALUES[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

struct V {
  static constexpr int W = 8;
  struct f {
    float v[8];
  };
  static f zero() {
    f r;
    for (int i = 0; i < W; ++i) r.v[i] = 0.0f;
    return r;
  }
  static f load(const float* p) {
    f r;
    for (int i = 0; i < W; ++i) r.v[i] = p[i];
    return r;
  }
  static f set1(float a) {
    f r;
    for (int i = 0; i < W; ++i) r.v[i] = a;
    return r;
  }
  static f fma(f a, f b, f c) {
    f r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] * b.v[i] + c.v[i];
    return r;
  }
  static float sum(f a) {
    const float s0 = (a.v[0] + a.v[4]) + (a.v[2] + a.v[6]);
    const float s1 = (a.v[1] + a.v[5]) + (a.v[3] + a.v[7]);
    return s0 + s1;
  }
  static void nibbles(const uint8_t* p, f& lo, f& hi) {
    for (int i = 0; i < W; ++i) {
      lo.v[i] = float(p[i] & 15);
      hi.v[i] = float(p[i] >> 4);
    }
  }
  static void fp4(const uint8_t* p, f& lo, f& hi) {
    for (int i = 0; i < W; ++i) {
      lo.v[i] = FP4_VALUES[p[i] & 15];
      hi.v[i] = FP4_VALUES[p[i] >> 4];
    }
  }
  static constexpr bool FP4_WIDE = false;
  static f bytes(const uint8_t* p) {
    f r;
    for (int i = 0; i < W; ++i) r.v[i] = float(p[i]);
    return r;
  }
  static void prefetch(const void* p) { __builtin_prefetch(p); }
};

#include "kernel_impl.h"

}  // namespace

const Kernels* kernels_portable() {
  static const Kernels k{"portable", V::W, &rows_entry, nullptr};
  return &k;
}

}  // namespace edge0k

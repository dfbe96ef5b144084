// The portable variant of the row kernel: plain C++ over 8-float blocks, which the
// compiler vectorises for the baseline of whatever CPU it targets.
#include "kernel.h"

namespace edge0k {
namespace {

constexpr float FP4_VALUES[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

struct V {
  static constexpr int W = 8;
  static constexpr int GEMM_R = 2, GEMM_M = 2;  // the GEMM's tile (gemm_impl.h)
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
  static void store(float* p, f a) {
    for (int i = 0; i < W; ++i) p[i] = a.v[i];
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
  template <int N>
  static void sums(const f* a, float* out) {
    for (int j = 0; j < N; ++j) out[j] = sum(a[j]);
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
  // int8 inputs (kernel.h: XQ8), the same bits as AVX2's: lane j of a pair's dot product
  // is the exact integer sum of its inputs 8j..8j+7 times their codes centred as signed
  // integers (affine q - 8, MXFP4 twice the e2m1 value: no fix to take back), then one
  // rounding per product and per FMA
  static constexpr bool Q8 = true;
  struct q8w {
    int8_t v[64];  // the pair's codes in input order
  };
  template <class Code>
  static q8w q8_decode(const uint8_t* p, int bytes, Code code) {
    q8w r = {};
    for (int i = 0; i < bytes; ++i) {
      r.v[2 * i] = code(p[i] & 15);
      r.v[2 * i + 1] = code(p[i] >> 4);
    }
    return r;
  }
  static int8_t centred(int c) { return int8_t(c - Q8_AFFINE_OFFSET); }
  static int8_t twice_e2m1(int c) { return int8_t(2.0f * FP4_VALUES[c]); }
  static q8w q8_codes(const uint8_t* p) { return q8_decode(p, 32, centred); }
  static q8w q8_codes_half(const uint8_t* p) { return q8_decode(p, 16, centred); }
  static q8w q8_fp4(const uint8_t* p) { return q8_decode(p, 32, twice_e2m1); }
  static q8w q8_fp4_half(const uint8_t* p) { return q8_decode(p, 16, twice_e2m1); }
  static f q8_dot(const q8w& w, const int8_t* x, const int16_t*) {
    // x: per block of the pair its 16 evens, then per block its 16 odds (kernel.h)
    auto input = [&](int i) {
      const int blk = i / 32, c = i % 32;
      return int(x[(c % 2) * 32 + blk * 16 + c / 2]);
    };
    f r;
    for (int j = 0; j < 8; ++j) {
      int s = 0;
      for (int i = 8 * j; i < 8 * j + 8; ++i) s += int(w.v[i]) * input(i);
      r.v[j] = float(s);
    }
    return r;
  }
  static f q8_halves(float a, float b) {
    f r;
    for (int i = 0; i < W; ++i) r.v[i] = i < 4 ? a : b;
    return r;
  }
  static f q8_mul(f a, const float* b) {
    f r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] * b[i];
    return r;
  }
  static f q8_fma(f a, f b, f c) {
    f r;
    for (int i = 0; i < W; ++i) r.v[i] = __builtin_fmaf(a.v[i], b.v[i], c.v[i]);
    return r;
  }
  static f bytes(const uint8_t* p) {
    f r;
    for (int i = 0; i < W; ++i) r.v[i] = float(p[i]);
    return r;
  }
  static void prefetch(const void* p) { __builtin_prefetch(p); }
};

#include "kernel_impl.h"
#include "gemm_impl.h"

}  // namespace

const Kernels* kernels_portable() {
  static const Kernels k{"portable", V::W, &rows_entry, nullptr, q8_rows<V>(), &gemm_entry, V::GEMM_R};
  return &k;
}

}  // namespace edge0k

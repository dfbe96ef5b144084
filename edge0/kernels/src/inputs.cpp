// x in the order a row-kernel table reads it (kernel.h): the one place that layout is built,
// in float32 and in int8 (XQ8).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernel.h"

namespace edge0k {

void lay_out_inputs(const float* x, int M, int cols, int bits, int lanes, const uint8_t* fp4_perm,
                    float* xp) {
  for (int m = 0; m < M; ++m) {
    const float* xm = x + int64_t(m) * cols;
    float* pm = xp + int64_t(m) * cols;
    if (fp4_perm != nullptr) {
      for (int c0 = 0; c0 < cols; c0 += 32)
        for (int i = 0; i < 32; ++i) pm[c0 + i] = xm[c0 + fp4_perm[i]];
    } else if (bits == 4) {
      for (int c0 = 0; c0 < cols; c0 += 2 * lanes)
        for (int j = 0; j < lanes; ++j) {
          pm[c0 + j] = xm[c0 + 2 * j];
          pm[c0 + lanes + j] = xm[c0 + 2 * j + 1];
        }
    } else {
      std::copy(xm, xm + cols, pm);
    }
  }
}

void quantize_inputs(const float* x, int M, int cols, bool fp4, int8_t* q, float* scale,
                     int16_t* fix) {
  const int nb = cols / Q8_BLOCK, np = q8_pairs(cols);
  const int off = fp4 ? 12 : Q8_AFFINE_OFFSET;
  constexpr int H = Q8_BLOCK / 2;
  for (int m = 0; m < M; ++m)
    for (int p = 0; p < np; ++p) {
      const int64_t i = int64_t(m) * np + p;
      int8_t* qp = q + i * 2 * Q8_BLOCK;
      int8_t v[2 * Q8_BLOCK] = {};  // the pair's inputs in their own order
      for (int h = 0; h < 2; ++h) {
        const int b = 2 * p + h;
        float s = 0.0f;
        if (b < nb) {
          const float* xb = x + int64_t(m) * cols + int64_t(b) * Q8_BLOCK;
          // max |x| as bits: for |x| the order of the bits is the order of the floats, and
          // an inf or NaN is at or above 0x7f800000 (an integer loop that vectorises)
          uint32_t top = 0;
          for (int c = 0; c < Q8_BLOCK; ++c) {
            uint32_t bits;
            std::memcpy(&bits, xb + c, 4);
            top = std::max(top, bits & 0x7fffffffu);
          }
          float amax;
          std::memcpy(&amax, &top, 4);
          if (top >= 0x7f800000u) {  // an inf or NaN input: the block's products are NaN
            s = std::numeric_limits<float>::quiet_NaN();
          } else if (amax > 0.0f) {
            const float inv = 127.0f / amax;
            constexpr float ROUND = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
            for (int c = 0; c < Q8_BLOCK; ++c)  // to nearest even, as nearbyint (|x * inv| <= 127)
              v[h * Q8_BLOCK + c] = int8_t(int((xb[c] * inv + ROUND) - ROUND));
            s = (amax / 127.0f) * (fp4 ? 0.5f : 1.0f);
          }
        }
        for (int j = 0; j < 4; ++j) scale[i * 8 + h * 4 + j] = s;
        const int8_t* vh = v + h * Q8_BLOCK;
        for (int j = 0; j < H; ++j) qp[h * H + j] = vh[2 * j];  // evens of both blocks,
        for (int j = 0; j < H; ++j) qp[2 * H + h * H + j] = vh[2 * j + 1];  // then odds
      }
      for (int t = 0; t < 2 * Q8_BLOCK / 4; ++t)
        fix[i * 16 + t] = int16_t(off * (int(v[4 * t]) + v[4 * t + 1] + v[4 * t + 2] + v[4 * t + 3]));
    }
}

}  // namespace edge0k

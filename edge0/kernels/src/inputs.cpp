// x in the order a row-kernel table reads it (kernel.h): the one place that layout is built.
#include <algorithm>

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

}  // namespace edge0k

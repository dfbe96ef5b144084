// The kernels' own interface: quantized matrices as raw pointers, no MLX types.
//
// A matrix is `rows` x `cols` with packed rows (MLX's layout: uint32 words, element j
// of a word in bits [bits*j, bits*(j+1))), one scale (and for affine, one bias) per
// `group` consecutive elements of a row. Each ISA translation unit fills one Kernels
// table from kernel_impl.h; dispatch.cpp picks one at import.
#pragma once

#include <cstddef>
#include <cstdint>

namespace edge0k {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2, U8 = 3 };
enum class Mode : int { Affine = 0, Mxfp4 = 1 };

struct QMat {
  const uint8_t* w = nullptr;  // row 0's packed bytes
  int64_t w_row = 0;           // bytes between rows
  const void* scales = nullptr;
  int64_t s_row = 0;  // elements between rows
  const void* biases = nullptr;  // affine only
  int64_t b_row = 0;
  DType sdt = DType::F32;  // scales' and biases' dtype (U8: mxfp4 exponents)
  int rows = 0, cols = 0, bits = 4, group = 64;
  Mode mode = Mode::Affine;
};

// x prepared for one matrix layout: `xp` holds cols floats per input row (for 4-bit
// codes each chunk of 2*lanes elements is stored evens first, then odds, so the low and
// high nibbles of `lanes` bytes meet their inputs), `xs` the per-group sums of x. A
// table with `fp4_perm` reads MXFP4's x in its own order instead: each chunk of 32
// inputs stored as xp[c0 + i] = x[c0 + fp4_perm[i]].
struct Kernels {
  const char* name;
  int lanes;
  // out[m * ldo + r] = sum_c x[m][c] * W[r][c], rows r in [r0, r1), inputs m in [0, M)
  void (*rows)(const QMat& q, const float* xp, const float* xs, int M, int r0, int r1,
               float* out, int64_t ldo);
  const uint8_t* fp4_perm;  // nullptr: MXFP4 uses the 4-bit layout above
};

// x (M rows of `cols`) -> xp in the layout above, for a table of `lanes` lanes reading
// `bits`-bit codes; `fp4_perm`: the table's, for an MXFP4 matrix, else nullptr
// (inputs.cpp, compiled for the baseline: no ISA unit calls it)
void lay_out_inputs(const float* x, int M, int cols, int bits, int lanes, const uint8_t* fp4_perm,
                    float* xp);

const Kernels* kernels_portable();
#if defined(__x86_64__) || defined(_M_X64)
const Kernels* kernels_avx2();
const Kernels* kernels_avx512();
#endif
#if defined(__aarch64__)
const Kernels* kernels_neon();
#endif

// The best table this CPU runs (chosen once), or the one named by `force`.
const Kernels* select_kernels(const char* force);

}  // namespace edge0k

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
// x quantized to int8 for 4-bit matrices (the opt-in int8-activation path): per input
// row, each block of 32 inputs is scale * q, scale = max|x| / 127, q rounded to nearest
// even. Blocks go in pairs (a last lone block with a zero partner), each pair stored as
// 64 bytes: the even-indexed inputs of its first block, of its second, then the
// odd-indexed ones of each (the low and the high nibbles of 32 code bytes). The codes meet
// q centred, as signed integers: affine q - 8 (the 8 * scale moves to the bias term),
// MXFP4 twice the e2m1 value (its scale is halved here). Per pair:
// - `scale`: 8 floats, the first block's scale 4 times, then the second's;
// - `fix`: 16 int16s, off * the sum of inputs 4t..4t+3 of the pair (t < 8: first block),
//   off = 8 (affine) or 12 (MXFP4), for a kernel that reads codes unsigned (affine q,
//   MXFP4 2v + 12) and must take the offset back.
// `xs`: the float sums of x per group, as for the float path (the affine bias term).
struct XQ8 {
  const int8_t* q = nullptr;  // M rows of q8_pairs(cols) * 64
  const float* scale = nullptr;  // M rows of q8_pairs(cols) * 8
  const int16_t* fix = nullptr;  // M rows of q8_pairs(cols) * 16
  const float* xs = nullptr;  // M rows of cols / group
};
constexpr int Q8_BLOCK = 32;
constexpr int q8_pairs(int cols) { return (cols / Q8_BLOCK + 1) / 2; }
constexpr int Q8_AFFINE_OFFSET = 8;  // affine 4-bit codes 0..15 meet x as q - 8

struct Kernels {
  const char* name;
  int lanes;
  // out[m * ldo + r] = sum_c x[m][c] * W[r][c], rows r in [r0, r1), inputs m in [0, M)
  void (*rows)(const QMat& q, const float* xp, const float* xs, int M, int r0, int r1,
               float* out, int64_t ldo);
  const uint8_t* fp4_perm;  // nullptr: MXFP4 uses the 4-bit layout above
  // the same from int8 inputs (XQ8), 4-bit matrices only; nullptr: not built for this ISA.
  // Per pair of blocks eight lanes, each the exact integer sum of 8 consecutive products
  // (lanes 0-3 the first block), then float32: every variant that has it gives the same bits.
  void (*rows_q8)(const QMat& q, const XQ8& x, int M, int r0, int r1, float* out, int64_t ldo);
  // the same as `rows` for many input rows (gemm_impl.h), bit for bit: each block of
  // `gemm_rows` weight rows decoded once into the caller's `scratch` (gemm_scratch floats)
  void (*gemm)(const QMat& q, const float* xp, const float* xs, int M, int r0, int r1,
               float* out, int64_t ldo, float* scratch);
  int gemm_rows;
  // A Gated-DeltaNet value head's state update for one token (gated_delta.cpp): rows [0, n)
  // of the (n, Dk) state, n and Dk multiples of 8, `from` the old rows (may be `s` itself).
  // Each row's operations are the scalar code's, in its order (no FMA): the same bits.
  // nullptr: not built for this ISA (the scalar code runs).
  void (*delta)(const float* from, float* s, int64_t n, int64_t Dk, const float* q,
                const float* k, const float* v, float g, float beta, float* y) = nullptr;
};

// floats of scratch one `gemm` call needs: its decoded weight rows, their bias terms for
// every input row, and x's group sums transposed
constexpr int64_t gemm_scratch(int gemm_rows, int cols, int group, int M) {
  return int64_t(gemm_rows) * cols + int64_t(gemm_rows + cols / group) * M;
}

// x (M rows of `cols`) -> xp in the layout above, for a table of `lanes` lanes reading
// `bits`-bit codes; `fp4_perm`: the table's, for an MXFP4 matrix, else nullptr
// (inputs.cpp, compiled for the baseline: no ISA unit calls it)
void lay_out_inputs(const float* x, int M, int cols, int bits, int lanes, const uint8_t* fp4_perm,
                    float* xp);

// x (M rows of `cols`, a multiple of 32) -> XQ8's q, scale and fix for affine or MXFP4 codes
void quantize_inputs(const float* x, int M, int cols, bool fp4, int8_t* q, float* scale,
                     int16_t* fix);

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

// What the primitives share: the chosen row kernel and settings, and MLX arrays read as the
// kernels' quantized matrices (with the checks a graph build runs on them).
#pragma once

#include <optional>
#include <string>

#include "compute.h"
#include "mlx/array.h"

namespace edge0 {

namespace mx = mlx::core;

const edge0k::Kernels& kernels(edge0k::Mode mode);  // the row kernel in use for a mode
edge0k::Settings& settings();

edge0k::DType dtype_of(const mx::array& a);

// The matrix view of a 2-D (rows, packed) array, or of one slot of a 3-D stack.
edge0k::QMat matrix(const mx::array& w, const mx::array& scales, const mx::array* biases,
                    int group, int bits, int mode);

int mode_code(const std::string& mode);  // affine 0, mxfp4 1

// weight (..., rows, packed) with `stack_dims` leading stack dimensions
void check_quant(const mx::array& w, const mx::array& scales,
                 const std::optional<mx::array>& biases, int group, int bits, int mode,
                 int stack_dims);

}  // namespace edge0

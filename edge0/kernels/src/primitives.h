// The MLX face of the kernels: two CPU primitives and the ops that build them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mlx/mlx.h"

namespace edge0 {

namespace mx = mlx::core;

// x (M, cols) float32 @ dequantized(w)^T -> (M, rows) float32, as mx.quantized_matmul
// with transpose=True (affine 4/8-bit or mxfp4)
mx::array qmm(const mx::array& x, const mx::array& w, const mx::array& scales,
              const std::optional<mx::array>& biases, int group_size, int bits,
              const std::string& mode, mx::StreamOrDevice s = {});

// Per row n of x (N, d): down(act(gate(x[n]), up(x[n]))) with slot idx[n] of each
// projection stack (weight (S, rows, packed), scales, optional biases, optional
// per-row bias (S, rows)); projections ordered gate, up, down; meta: bits, group,
// mode (0 affine, 1 mxfp4) per projection.
mx::array expert_ffn(const mx::array& x, const mx::array& idx,
                     const std::vector<std::optional<mx::array>>& projections,
                     const std::vector<int>& meta, const std::string& activation, float alpha,
                     float limit, mx::StreamOrDevice s = {});

std::string isa();
bool use_isa(const std::string& name);  // false: not built or not supported here
int threads();
void set_threads(int n);

}  // namespace edge0

// The base of Edge0's MLX primitives: one output, run on the CPU stream only.
#pragma once

#include <stdexcept>
#include <vector>

#include "mlx/primitives.h"

namespace edge0 {

// A one-output primitive that runs on the CPU stream only (the Python face never builds
// one for a GPU stream).
class CpuPrimitive : public mlx::core::UnaryPrimitive {
 public:
  using mlx::core::UnaryPrimitive::UnaryPrimitive;
  void eval_gpu(const std::vector<mlx::core::array>&, mlx::core::array&) override {
    throw std::runtime_error("edge0 kernels run on the CPU stream only");
  }
};

}  // namespace edge0

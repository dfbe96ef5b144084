// The base of Edge0's MLX primitives: one output, run on the CPU stream only.
#pragma once

#include <stdexcept>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
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

 protected:
  // What every eval_cpu does first: allocate `out` and register the inputs and the output
  // with the stream's encoder (they stay alive until the dispatched task has run). Returns
  // the encoder, and, when `args` is given, weak copies of the inputs for the task.
  mlx::core::cpu::CommandEncoder& prepare(const std::vector<mlx::core::array>& in,
                                          mlx::core::array& out,
                                          std::vector<mlx::core::array>* args = nullptr) {
    out.set_data(mlx::core::allocator::malloc(out.nbytes()));
    auto& enc = mlx::core::cpu::get_command_encoder(stream());
    for (const auto& a : in) {
      enc.set_input_array(a);
      if (args) args->push_back(mlx::core::array::unsafe_weak_copy(a));
    }
    enc.set_output_array(out);
    return enc;
  }
};

}  // namespace edge0

// The nanobind module `edge0.kernels._native` (import mlx.core first: it loads libmlx
// and registers mx.array with nanobind's `mlx` domain).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "primitives.h"

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_native, m) {
  m.doc() = "Edge0's native CPU kernels behind MLX primitives";
  m.def("qmm", &edge0::qmm, "x"_a, "w"_a, "scales"_a, "biases"_a.none(), "group_size"_a,
        "bits"_a, "mode"_a, nb::kw_only(), "stream"_a = nb::none(),
        "x @ dequantize(w).T in float32 (mx.quantized_matmul with transpose=True)");
  m.def("expert_ffn", &edge0::expert_ffn, "x"_a, "idx"_a, "projections"_a, "meta"_a,
        "activation"_a, "alpha"_a, "limit"_a, nb::kw_only(), "stream"_a = nb::none(),
        "The routed experts' gated FFN of each row with its slot, in one op");
  m.def("isa", &edge0::isa, "The row kernel in use (avx512, avx2, neon, portable)");
  m.def("use_isa", &edge0::use_isa, "name"_a,
        "Switch to another built row kernel; False when this CPU cannot run it");
  m.def("threads", &edge0::threads);
  m.def("set_threads", &edge0::set_threads, "n"_a);
}

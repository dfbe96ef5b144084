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
  m.def("moe", &edge0::moe, "x"_a, "logits"_a, "projections"_a, "meta"_a, "activation"_a,
        "alpha"_a, "limit"_a, "k"_a, "norm"_a, nb::kw_only(), "stream"_a = nb::none(),
        "A sparse-MoE block after its router: top-k by softmax, the experts, the weighted sum");
  m.def("rms_norm", &edge0::rms_norm, "x"_a, "weight"_a, "eps"_a, nb::kw_only(),
        "stream"_a = nb::none(), "mx.fast.rms_norm in one CPU node (float32 x)");
  m.def("rope", &edge0::rope, "x"_a, "offset"_a, "freqs"_a.none(), "dims"_a, "traditional"_a,
        "base"_a, "scale"_a, "forward"_a = true, nb::kw_only(), "stream"_a = nb::none(),
        "mx.fast.rope in one CPU node (float32 x, int32 offset)");
  m.def("sdpa", &edge0::sdpa, "q"_a, "k"_a, "v"_a, "scale"_a, "causal"_a, "mask"_a = nb::none(),
        "sinks"_a = nb::none(), nb::kw_only(),
        "stream"_a = nb::none(), "scaled dot-product attention in one CPU node (float32)");
  m.def("linear", &edge0::linear, "x"_a, "w"_a, "bias"_a.none(), nb::kw_only(),
        "stream"_a = nb::none(), "x @ w.T (+ bias) for a float weight, in one CPU node");
  m.def("gated_delta", &edge0::gated_delta, "qkv"_a, "z"_a, "b"_a, "a"_a, "conv_state"_a,
        "conv_w"_a, "state"_a, "A_log"_a, "dt_bias"_a, "norm_w"_a, "Hk"_a, "Dk"_a, "Hv"_a,
        "Dv"_a, "q_scale"_a, "k_scale"_a, "qk_eps"_a, "norm_eps"_a, nb::kw_only(),
        "stream"_a = nb::none(),
        "A Gated-DeltaNet layer between its projections in one CPU node: (y, conv state, state)");
  m.def("isa", &edge0::isa, "kind"_a = "",
        "The row kernel in use (avx512, avx2, neon, portable) for kind 'affine' (also '') or "
        "'mxfp4'");
  m.def("use_isa", &edge0::use_isa, "name"_a, "kind"_a = "",
        "Switch kind 'affine' or 'mxfp4' (both: '') to another built row kernel; False when "
        "this CPU cannot run it");
  m.def("int8_inputs", &edge0::int8_inputs,
        "Whether 4-bit matrices now meet x quantized to int8 (asked for and built here)");
  m.def("set_int8_inputs", &edge0::set_int8_inputs, "on"_a,
        "Quantize x to int8 per block of 32 for 4-bit matrices (opt-in: not exact)");
  m.def("has_int8_inputs", &edge0::has_int8_inputs,
        "Whether the row kernel in use has the int8-input path");
  m.def("evict", &edge0::evict, "arrays"_a,
        "Drop the evaluated arrays' lines from every cache level (x86); False where it cannot");
  m.def("threads", &edge0::threads);
  m.def("set_threads", &edge0::set_threads, "n"_a);
}

"""Native CPU kernels behind MLX: quantized matmul and the routed experts' fused FFN.

The engine calls one function per op (`qmm`, `expert_ffn`) and never knows which path
ran: the native kernel (a C++ MLX primitive, `_native`, built at install from `src/`
with one row kernel per ISA, picked at import) on the CPU device for float32 inputs,
MLX's own ops otherwise (Metal, CUDA, a failed build, `EDGE0_NATIVE_KERNELS=0`).
`status()` is the one line that says which. `use_native(model)` makes a loaded model's
quantized linears call `qmm`.
"""

from edge0.kernels.layers import use_native
from edge0.kernels.native import module, status
from edge0.kernels.ops import expert_ffn, qmm

__all__ = ["expert_ffn", "module", "qmm", "status", "use_native"]

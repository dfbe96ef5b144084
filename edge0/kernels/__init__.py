"""Native CPU kernels behind MLX: quantized matmul and the routed experts' fused FFN.

The engine calls one function per op (`ops.qmm`, `ops.expert_ffn`) and never knows
which path ran: the native kernel (a C++ MLX primitive, `_native`, built at install
from `src/` with one row kernel per ISA, picked at import) on the CPU device for float32
inputs, MLX's own ops otherwise (Metal, CUDA, a failed build, `EDGE0_NATIVE_KERNELS=0`).
`native.status()` is the one line that says which; `layers.use_native(model)` makes a
loaded model's quantized layers call the ops. Imports nothing else of Edge0.
"""

// Whole operations over the row kernel: a quantized matmul and the experts' gated FFN.
#pragma once

#include <cstdint>

#include "kernel.h"

namespace edge0k {

// A stack of quantized matrices (one per slot or expert): slot s's matrix is `m` with
// its pointers advanced by s times the slot strides; `bias` (optional) is one float per
// output row and slot, added after the projection.
struct QStack {
  QMat m;
  int64_t w_slot = 0;  // bytes
  int64_t s_slot = 0;  // elements of the scales
  int64_t b_slot = 0;  // elements of the biases
  const void* bias = nullptr;
  DType bias_dt = DType::F32;
  int64_t bias_slot = 0;  // elements
};

enum class Act : int { SwiGLU = 0, SwiGLU_OAI = 1 };

struct Settings {
  int threads = 1;
  // x quantized to int8 for 4-bit matrices where the table has rows_q8 (opt-in: not exact)
  bool int8_inputs = false;
  int64_t min_bytes_per_thread = 256 * 1024;  // smaller calls stay on one thread ...
  int64_t min_macs_per_thread = 1 << 20;  // ... unless they have this many products a thread
};

// out (M, rows) = x (M, cols) @ W^T
void qmm(const Kernels& k, const Settings& st, const QMat& q, const float* x, int M, float* out);

// out[n] (d) = down(act(gate(x[n]), up(x[n]))) with every projection of slot idx[n]
// (rows that share a slot read its weights once)
void expert_ffn(const Kernels& k, const Settings& st, const QStack& gate, const QStack& up,
                const QStack& down, const float* x, const uint32_t* idx, int n, Act act,
                float alpha, float limit, float* out);

}  // namespace edge0k

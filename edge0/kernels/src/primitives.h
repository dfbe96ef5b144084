// The MLX face of the kernels: the CPU primitives and the ops that build them.
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

// mx.fast.rms_norm(x, weight, eps) for float32 x: one node, MLX's CPU result bit for bit
mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps,
                   mx::StreamOrDevice s = {});

// mx.fast.rope for float32 x (3-D or 4-D) with an int32 offset (scalar or one per batch
// row) and either base or freqs: one node, MLX's CPU result bit for bit
mx::array rope(const mx::array& x, const mx::array& offset, const std::optional<mx::array>& freqs,
               int dims, bool traditional, float base, float scale, bool forward,
               mx::StreamOrDevice s = {});

// mx.fast.scaled_dot_product_attention for float32 q (B, Hq, Lq, D), k/v (B, Hk, Lk, D)
// with no mask, the causal one or a boolean one, and optional attention sinks (Hq,): one
// node (agrees to float rounding)
mx::array sdpa(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
               bool causal, const std::optional<mx::array>& mask = std::nullopt,
               const std::optional<mx::array>& sinks = std::nullopt, mx::StreamOrDevice s = {});

// A sparse-MoE block after its router projection: per row n of x (N, d), the top-k experts
// by softmax(logits[n]) (weights renormalized over the k when norm), their gated FFN over
// the full expert stacks (as expert_ffn), summed with those weights -> (N, d_out)
mx::array moe(const mx::array& x, const mx::array& logits,
              const std::vector<std::optional<mx::array>>& projections,
              const std::vector<int>& meta, const std::string& activation, float alpha,
              float limit, int k, bool norm, mx::StreamOrDevice s = {});

// x (..., cols) float32 @ w.T (+ bias) for a float32/float16/bfloat16 weight (rows, cols):
// nn.Linear in one CPU node (agrees to float rounding)
mx::array linear(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                 mx::StreamOrDevice s = {});

// A Gated-DeltaNet layer between its projections (mlx-lm's Qwen3-Next / Qwen3.5 linear
// attention): conv over the kept rows and qkv (B, T, 2 Hk Dk + Hv Dv), SiLU, q/k L2 norms
// (times q_scale / k_scale, eps qk_eps), the gates from a, b (B, T, Hv), the delta-rule
// recurrence from `state` (B, Hv, Dv, Dk), the gated RMSNorm with z (B, T, Hv, Dv): one
// node, MLX's CPU result bit for bit -> {y (B, T, Hv, Dv), conv state, state}
std::vector<mx::array> gated_delta(const mx::array& qkv, const mx::array& z, const mx::array& b,
                                   const mx::array& a, const mx::array& conv_state,
                                   const mx::array& conv_w, const mx::array& state,
                                   const mx::array& A_log, const mx::array& dt_bias,
                                   const mx::array& norm_w, int Hk, int Dk, int Hv, int Dv,
                                   float q_scale, float k_scale, float qk_eps, float norm_eps,
                                   mx::StreamOrDevice s = {});

std::string isa(const std::string& kind);  // kind "" (the affine one), "affine" or "mxfp4"
// kind "" switches both modes; false: not built or not supported here
bool use_isa(const std::string& name, const std::string& kind);
int threads();
void set_threads(int n);
// Write back and drop every cache line of these evaluated arrays, so the next read comes from
// memory, as a decode step's weights do (x86: clflush); false where it cannot (nothing done)
bool evict(const std::vector<mx::array>& arrays);
// the opt-in int8-input path (compute.h: Settings::int8_inputs) for 4-bit matrices
bool int8_inputs();  // asked for and built for the row kernel in use
void set_int8_inputs(bool on);
bool has_int8_inputs();  // built for the row kernel in use

}  // namespace edge0

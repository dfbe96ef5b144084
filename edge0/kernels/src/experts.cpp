// The experts' fused FFN primitive: given (row, slot) pairs, or a whole routed MoE block.
//
// eval_cpu dispatches one task on the CPU stream's command encoder, like MLX's own CPU
// primitives; inputs stay alive until the stream has run it. This file is compiled with
// -ffp-contract=off: the routed block rounds each product as MLX's ops do.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <stdexcept>

#include "compute.h"
#include "cpu_primitive.h"
#include "dense.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/backend/cpu/simd/simd.h"
#include "mlx/primitives.h"
#include "operands.h"
#include "primitives.h"

namespace edge0 {

namespace {

struct ProjMeta {
  int bits, group, mode;
  bool biases, bias;
};

// The experts' FFN of given (row, slot) pairs; or, routed (route_k > 0), of each row's top-k
// experts by the softmax of its router logits (renormalized over the k when `norm`),
// summed with those weights: a whole sparse-MoE block after its router projection,
// equal bit for bit to mlx-lm's Qwen3-MoE block over the same expert kernel.
class ExpertFFN : public CpuPrimitive {
 public:
  ExpertFFN(mx::Stream s, std::vector<ProjMeta> meta, edge0k::Act act, float alpha, float limit,
            int route_k = 0, bool norm = false)
      : CpuPrimitive(s),
        meta_(std::move(meta)),
        act_(act),
        alpha_(alpha),
        limit_(limit),
        route_k_(route_k),
        norm_(norm) {}

  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    std::vector<mx::array> args;
    auto& enc = prepare(in, out, &args);
    enc.dispatch([args = std::move(args), o = mx::array::unsafe_weak_copy(out), meta = meta_,
                  act = act_, alpha = alpha_, limit = limit_, route_k = route_k_, norm = norm_]() {
      const Dense xd = dense(args[0]);
      const Dense id = dense(args[1]);
      edge0k::QStack st[3];
      size_t k = 2;
      for (int p = 0; p < 3; ++p) {
        const mx::array& w = args[k++];
        const mx::array& sc = args[k++];
        const mx::array* b = meta[p].biases ? &args[k++] : nullptr;
        st[p].m = matrix(w, sc, b, meta[p].group, meta[p].bits, meta[p].mode);
        st[p].w_slot = w.strides()[0] * 4;
        st[p].s_slot = sc.strides()[0];
        st[p].b_slot = b ? b->strides()[0] : 0;
        if (meta[p].bias) {
          const mx::array& bias = args[k++];
          if (bias.strides()[1] != 1)
            throw std::invalid_argument("edge0 expert_ffn: expert biases must be contiguous");
          st[p].bias = bias.data<void>();
          st[p].bias_dt = dtype_of(bias);
          st[p].bias_slot = bias.strides()[0];
        }
      }
      float* op = const_cast<float*>(o.data<float>());
      if (route_k == 0) {
        const int n = static_cast<int>(args[1].size());
        edge0k::expert_ffn(kernels(st[0].m.mode), settings(), st[0], st[1], st[2],
                           reinterpret_cast<const float*>(xd.ptr),
                           reinterpret_cast<const uint32_t*>(id.ptr), n, act, alpha, limit, op);
        return;
      }
      routed(st, reinterpret_cast<const float*>(xd.ptr), reinterpret_cast<const float*>(id.ptr),
             args[0], args[1], route_k, norm, act, alpha, limit, op);
    });
  }

  // each row's top-k experts and weights, computed as MLX's CPU ops compute mlx-lm's block
  // (softmax, argpartition, take, the renormalization), their FFN in one pass over the
  // pairs, and the weighted sum in that order: the resident block then equals the
  // streaming one bit for bit
  static void routed(const edge0k::QStack st[3], const float* x, const float* logits,
                     const mx::array& xa, const mx::array& la, int k, bool norm, edge0k::Act act,
                     float alpha, float limit, float* out) {
    const int64_t d = xa.shape(-1), E = la.shape(-1), N = int64_t(la.size()) / E;
    const int64_t dout = st[2].m.rows;
    std::vector<float> xr(N * k * d), w(N * k), y(N * k * dout);
    std::vector<uint32_t> idx(N * k);
    for (int64_t n = 0; n < N; ++n) {
      top_k(logits + n * E, E, k, norm, &idx[n * k], &w[n * k]);
      for (int j = 0; j < k; ++j) std::memcpy(&xr[(n * k + j) * d], x + n * d, d * sizeof(float));
    }
    edge0k::expert_ffn(kernels(st[0].m.mode), settings(), st[0], st[1], st[2], xr.data(), idx.data(),
                       int(N * k), act, alpha, limit, y.data());
    for (int64_t n = 0; n < N; ++n) {
      float* orow = out + n * dout;
      std::fill(orow, orow + dout, 0.0f);
      for (int j = 0; j < k; ++j) {
        const float wj = w[n * k + j];
        const float* yr = &y[(n * k + j) * dout];
        for (int64_t c = 0; c < dout; ++c) {
          const float prod = yr[c] * wj;
          orow[c] = orow[c] + prod;
        }
      }
    }
  }

  // softmax (max, MLX's exp, a sequential sum, times its reciprocal), then the last k of
  // MLX's argpartition (nth_element over an iota with its comparator), their gates, and
  // the division by their sequential sum when `norm`
  static void top_k(const float* l, int64_t E, int k, bool norm, uint32_t* idx, float* w) {
    std::vector<float> p(E);
    std::vector<uint32_t> order(E);
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t e = 0; e < E; ++e) top = std::max(top, l[e]);
    float total = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      p[e] = mx::simd::exp(mx::simd::Simd<float, 1>(l[e] - top)).value;
      total = total + p[e];
    }
    const float inv = 1 / total;
    for (int64_t e = 0; e < E; ++e) p[e] = p[e] * inv;
    std::iota(order.begin(), order.end(), uint32_t(0));
    std::nth_element(order.begin(), order.begin() + (E - k), order.end(),
                     [&p](uint32_t a, uint32_t b) {
                       const float v1 = p[a], v2 = p[b];
                       if (std::isnan(v1)) return false;
                       if (std::isnan(v2)) return true;
                       return v1 < v2 || (v1 == v2 && a < b);
                     });
    float picked = 0.0f;
    for (int j = 0; j < k; ++j) {
      idx[j] = order[E - k + j];
      w[j] = p[idx[j]];
      picked = picked + w[j];
    }
    if (norm)
      for (int j = 0; j < k; ++j) w[j] = w[j] / picked;
  }

  // Gradients to x only (training through frozen experts): the same FFN built from
  // MLX's own ops, differentiated by MLX.
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    if (route_k_ > 0) {  // to x and to the router logits
      for (int a : argnums)
        if (a > 1) throw std::invalid_argument("edge0 moe: gradients flow to x and the logits only");
      auto fun = [this, primals](const std::vector<mx::array>& in) {
        return std::vector<mx::array>{routed_reference(in[0], in[1], primals)};
      };
      auto grads = mx::vjp(fun, {primals[0], primals[1]}, {cotangents[0]}).second;
      std::vector<mx::array> out;
      for (int a : argnums) out.push_back(grads[a]);
      return out;
    }
    for (int a : argnums)
      if (a != 0)
        throw std::invalid_argument("edge0 expert_ffn: gradients flow to x only");
    auto fun = [this, primals](const std::vector<mx::array>& in) {
      return std::vector<mx::array>{reference(in[0], primals)};
    };
    auto grads = mx::vjp(fun, {primals[0]}, {cotangents[0]}).second;
    return std::vector<mx::array>(argnums.size(), grads[0]);
  }

  const char* name() const override { return "Edge0ExpertFFN"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const ExpertFFN&>(other);
    if (act_ != o.act_ || alpha_ != o.alpha_ || limit_ != o.limit_) return false;
    if (route_k_ != o.route_k_ || norm_ != o.norm_) return false;
    for (int p = 0; p < 3; ++p) {
      const ProjMeta &a = meta_[p], &b = o.meta_[p];
      if (a.bits != b.bits || a.group != b.group || a.mode != b.mode || a.biases != b.biases ||
          a.bias != b.bias)
        return false;
    }
    return true;
  }

 private:
  // the op's value from MLX's ops (gather_qmm per projection, the activation)
  // the routed block from MLX's ops (as mlx-lm's sparse-MoE blocks compute it)
  mx::array routed_reference(const mx::array& x, const mx::array& logits,
                             const std::vector<mx::array>& primals) const {
    const mx::Stream s = const_cast<ExpertFFN*>(this)->stream();
    const int k = route_k_;
    const mx::array gates = mx::softmax(logits, std::vector<int>{-1}, true, s);
    const int E = gates.shape(-1);
    mx::array inds = mx::stop_gradient(
        mx::slice(mx::argpartition(gates, E - k, -1, s), {0, E - k}, {gates.shape(0), E}, s), s);
    mx::array w = mx::take_along_axis(gates, inds, -1, s);
    if (norm_) w = mx::divide(w, mx::sum(w, -1, true, s), s);
    const int N = x.shape(0), d = x.shape(1);
    const mx::array xr = mx::reshape(
        mx::broadcast_to(mx::expand_dims(x, 1, s), {N, k, d}, s), {N * k, d}, s);
    const mx::array y = reference(xr, primals, mx::reshape(inds, {N * k}, s));
    const mx::array yw = mx::multiply(mx::reshape(y, {N, k, y.shape(-1)}, s),
                                      mx::expand_dims(w, -1, s), s);
    return mx::sum(yw, 1, false, s);
  }

  mx::array reference(const mx::array& x, const std::vector<mx::array>& primals,
                      std::optional<mx::array> pairs = std::nullopt) const {
    const mx::array idx = pairs ? *pairs : primals[1];
    const mx::Stream s = const_cast<ExpertFFN*>(this)->stream();
    size_t k = 2;
    auto proj = [&](int p, const mx::array& inp) {
      const mx::array& w = primals[k++];
      const mx::array& sc = primals[k++];
      std::optional<mx::array> b;
      if (meta_[p].biases) b = primals[k++];
      const char* mode = meta_[p].mode == 1 ? "mxfp4" : "affine";
      mx::array y = mx::gather_qmm(inp, w, sc, b, std::nullopt, idx, true, meta_[p].group,
                                   meta_[p].bits, mode, std::nullopt, false, s);
      if (meta_[p].bias) {
        mx::array bias = mx::take(primals[k++], idx, 0, s);  // (N, rows)
        y = mx::add(y, mx::expand_dims(bias, -2, s), s);
      }
      return y;
    };
    const mx::array h = mx::expand_dims(x, -2, s);  // (N, 1, d)
    mx::array g = proj(0, h), u = proj(1, h), a = g;
    if (act_ == edge0k::Act::SwiGLU) {
      a = mx::multiply(mx::multiply(g, mx::sigmoid(g, s), s), u, s);
    } else {
      g = mx::minimum(g, mx::array(limit_), s);
      u = mx::clip(u, mx::array(-limit_), mx::array(limit_), s);
      const mx::array glu = mx::multiply(g, mx::sigmoid(mx::multiply(g, mx::array(alpha_), s), s), s);
      a = mx::multiply(mx::add(u, mx::array(1.0f), s), glu, s);
    }
    return mx::squeeze(proj(2, a), -2, s);
  }

  std::vector<ProjMeta> meta_;
  edge0k::Act act_;
  float alpha_, limit_;
  int route_k_;
  bool norm_;
};


// the inputs and per-projection metadata of the three projections (gate, up, down)
std::vector<ProjMeta> projection_inputs(const mx::array& x,
                                        const std::vector<std::optional<mx::array>>& projections,
                                        const std::vector<int>& meta,
                                        std::vector<mx::array>& inputs) {
  if (projections.size() != 12 || meta.size() != 9)
    throw std::invalid_argument("edge0 expert_ffn: 3 projections of (weight, scales, biases, bias)");
  std::vector<ProjMeta> pm;
  int dims[3][2];
  for (int p = 0; p < 3; ++p) {
    const auto& w = projections[4 * p];
    const auto& sc = projections[4 * p + 1];
    const auto& b = projections[4 * p + 2];
    const auto& bias = projections[4 * p + 3];
    if (!w || !sc) throw std::invalid_argument("edge0 expert_ffn: a projection lacks weight or scales");
    const int bits = meta[3 * p], group = meta[3 * p + 1], mode = meta[3 * p + 2];
    check_quant(*w, *sc, b, group, bits, mode, 1);
    dims[p][0] = w->shape(1);
    dims[p][1] = w->shape(2) * 32 / bits;
    inputs.push_back(*w);
    inputs.push_back(*sc);
    if (b) inputs.push_back(*b);
    if (bias) {
      if (bias->ndim() != 2 || bias->shape(1) != w->shape(1) || bias->shape(0) != w->shape(0))
        throw std::invalid_argument("edge0 expert_ffn: an expert bias must be (S, rows)");
      inputs.push_back(*bias);
    }
    pm.push_back({bits, group, mode, bool(b), bool(bias)});
  }
  // gate and up: (ff, d); down: (d_out, ff)
  if (dims[0][0] != dims[1][0] || dims[0][1] != dims[1][1] || dims[2][1] != dims[0][0] ||
      dims[0][1] != x.shape(1))
    throw std::invalid_argument("edge0 expert_ffn: projection shapes do not chain");
  return pm;
}

edge0k::Act activation_of(const std::string& activation) {
  if (activation == "swiglu") return edge0k::Act::SwiGLU;
  if (activation == "swiglu_oai") return edge0k::Act::SwiGLU_OAI;
  throw std::invalid_argument("edge0 expert_ffn: activation must be swiglu or swiglu_oai");
}

}  // namespace

mx::array expert_ffn(const mx::array& x, const mx::array& idx,
                     const std::vector<std::optional<mx::array>>& projections,
                     const std::vector<int>& meta, const std::string& activation, float alpha,
                     float limit, mx::StreamOrDevice s) {
  if (x.dtype() != mx::float32 || x.ndim() != 2)
    throw std::invalid_argument("edge0 expert_ffn: x must be float32 (N, d)");
  if (idx.dtype() != mx::uint32 || idx.ndim() != 1 || idx.shape(0) != x.shape(0))
    throw std::invalid_argument("edge0 expert_ffn: idx must be uint32 (N,)");
  const edge0k::Act act = activation_of(activation);
  std::vector<mx::array> inputs{x, idx};
  std::vector<ProjMeta> pm = projection_inputs(x, projections, meta, inputs);
  const int d_out = projections[8]->shape(1);  // the down projection's rows
  return mx::array({x.shape(0), d_out}, mx::float32,
                   std::make_shared<ExpertFFN>(mx::to_stream(s), std::move(pm), act, alpha, limit),
                   std::move(inputs));
}

mx::array moe(const mx::array& x, const mx::array& logits,
              const std::vector<std::optional<mx::array>>& projections,
              const std::vector<int>& meta, const std::string& activation, float alpha,
              float limit, int k, bool norm, mx::StreamOrDevice s) {
  if (x.dtype() != mx::float32 || x.ndim() != 2)
    throw std::invalid_argument("edge0 moe: x must be float32 (N, d)");
  if (logits.dtype() != mx::float32 || logits.ndim() != 2 || logits.shape(0) != x.shape(0))
    throw std::invalid_argument("edge0 moe: logits must be float32 (N, experts)");
  if (k < 1 || k > logits.shape(1))
    throw std::invalid_argument("edge0 moe: k must be between 1 and the number of experts");
  const edge0k::Act act = activation_of(activation);
  std::vector<mx::array> inputs{x, logits};
  std::vector<ProjMeta> pm = projection_inputs(x, projections, meta, inputs);
  if (projections[0]->shape(0) != logits.shape(1))
    throw std::invalid_argument("edge0 moe: the logits do not have one column per expert");
  return mx::array({x.shape(0), projections[8]->shape(1)}, mx::float32,
                   std::make_shared<ExpertFFN>(mx::to_stream(s), std::move(pm), act, alpha, limit,
                                               k, norm),
                   std::move(inputs));
}

}  // namespace edge0

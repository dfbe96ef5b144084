// A Gated-DeltaNet layer between its projections, as one CPU primitive, bit for bit MLX's CPU.
//
// mlx-lm's Qwen3-Next / Qwen3.5 linear attention runs, after its input projections: the
// causal depthwise conv over the last tokens, SiLU, the L2 norms of q and k, the gates
// (beta = sigmoid(b), g = exp(-exp(A_log) * softplus(a + dt_bias))), the delta-rule
// recurrence over the (Dv, Dk) state of each value head, and the gated RMSNorm. On the CPU
// that is about 70 graph nodes a layer, the recurrence alone 27, each state pass a node of
// its own over 2 MiB (the 35B shape). Here it is one node. Every operation is MLX's CPU
// operation in MLX's order: on this backend its reductions sum sequentially, its
// elementwise ops round each result to float (its JIT-compiled kernels are built without
// FMA), and its exp, log1p and sigmoid are the functions of its installed SIMD header,
// which this file calls. The file is compiled with -ffp-contract=off. So the outputs
// equal MLX's path bit for bit (tests/test_kernels_gated_delta.py).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "dense.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/binary_ops.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/backend/cpu/simd/simd.h"
#include "mlx/backend/cpu/unary_ops.h"
#include "mlx/fast.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"
#include "operands.h"
#include "pool.h"
#include "primitives.h"

namespace edge0 {

namespace {

namespace simd = mx::simd;

float sigmoid(float x) { return mx::detail::Sigmoid{}(simd::Simd<float, 1>(x)).value; }
float exp_(float x) { return simd::exp(simd::Simd<float, 1>(x)).value; }
float softplus(float x) {  // mx.logaddexp(x, 0)
  return mx::detail::LogAddExp{}(simd::Simd<float, 1>(x), simd::Simd<float, 1>(0.0f)).value;
}
float silu(float x) {  // x * sigmoid(x)
  const float s = sigmoid(x);
  return x * s;
}

// a small float parameter (any float dtype, any strides) as float32 values
std::vector<float> floats(const mx::array& a) {
  const Dense d = dense(a);
  std::vector<float> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    switch (a.dtype()) {
      case mx::float32:
        out[i] = reinterpret_cast<const float*>(d.ptr)[i];
        break;
      case mx::float16:
        out[i] = static_cast<float>(reinterpret_cast<const mx::float16_t*>(d.ptr)[i]);
        break;
      case mx::bfloat16:
        out[i] = static_cast<float>(reinterpret_cast<const mx::bfloat16_t*>(d.ptr)[i]);
        break;
      default:
        throw std::invalid_argument("edge0 gated_delta: parameters must be float");
    }
  }
  return out;
}

// mx.fast.rms_norm's CPU fallback over one row of n, in place: x * rsqrt(mean(x^2) + eps)
// (the mean is the sequential sum times 1/n, 1/n computed in double), then times `scale`
// (a scalar multiplier, normalize_qk's) or `w` (a weight)
void rms_row(float* x, int64_t n, float eps, const float* w, float scale) {
  const float inv_n = static_cast<float>(1.0 / double(n));
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float sq = x[i] * x[i];
    ss += sq;
  }
  const float v = ss * inv_n + eps;
  const float r = 1.0f / std::sqrt(v);
  for (int64_t i = 0; i < n; ++i) {
    const float y = x[i] * r;
    x[i] = w ? y * w[i] : scale * y;
  }
}

struct Dims {
  int64_t B, T, Hk, Dk, Hv, Dv, K;  // K: the conv's kernel size
  int64_t key() const { return Hk * Dk; }
  int64_t conv() const { return 2 * Hk * Dk + Hv * Dv; }
};

constexpr int64_t R = 8;  // value rows of a head updated together (independent sums)

// Rows [0, n) of one head's state (rows of Dk, in place) for one token, as mlx-lm's
// _gated_delta_step_ops: s *= g; kv = sum_j s[i,j] k[j]; delta = (v - kv) * beta;
// s += k[j] * delta[i]; y[i] = sum_j s[i,j] q[j]. Each row's sums run sequentially over j
// (MLX's order); the n rows are independent chains (n a constant: unrolled, in registers).
// The first token reads the state from `from` (the input), the others from `s` itself.
template <int64_t n>
void rows(const float* from, float* s, int64_t Dk, const float* q, const float* k, const float* v,
          float g, float beta, float* y) {
  float acc[n] = {}, delta[n], out[n] = {};
  for (int64_t j = 0; j < Dk; ++j) {
    const float kj = k[j];
    for (int64_t r = 0; r < n; ++r) {
      const float sv = from[r * Dk + j] * g;
      s[r * Dk + j] = sv;
      const float p = sv * kj;
      acc[r] = acc[r] + p;
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    const float diff = v[r] - acc[r];
    delta[r] = diff * beta;
  }
  for (int64_t j = 0; j < Dk; ++j) {
    const float kj = k[j], qj = q[j];
    for (int64_t r = 0; r < n; ++r) {
      const float u = kj * delta[r];
      const float sv = s[r * Dk + j] + u;
      s[r * Dk + j] = sv;
      const float p = sv * qj;
      out[r] = out[r] + p;
    }
  }
  for (int64_t r = 0; r < n; ++r) y[r] = out[r];
}

// One value head's recurrence over T tokens from its (Dv, Dk) state `s0` into `s`.
void head(const Dims& d, int64_t b, int64_t h, const float* q, const float* k, const float* v,
          const float* g, const float* beta, const float* s0, float* s, float* y) {
  const int64_t kh = h / (d.Hv / d.Hk), Dk = d.Dk, Dv = d.Dv;
  for (int64_t t = 0; t < d.T; ++t) {
    const int64_t bt = b * d.T + t;
    const float* qt = q + (bt * d.Hk + kh) * Dk;
    const float* kt = k + (bt * d.Hk + kh) * Dk;
    const float* vt = v + (bt * d.Hv + h) * Dv;
    const float gt = g[bt * d.Hv + h], bb = beta[bt * d.Hv + h];
    float* yt = y + (bt * d.Hv + h) * Dv;
    const float* from = t == 0 ? s0 : s;
    int64_t i = 0;
    // the SIMD unit's rows where it has them (kernel.h: Kernels::delta, the same bits)
    if (const auto simd_rows = edge0::kernels(edge0k::Mode::Affine).delta;
        simd_rows != nullptr && Dk % 8 == 0 && Dv >= 8) {
      i = Dv / 8 * 8;
      simd_rows(from, s, i, Dk, qt, kt, vt, gt, bb, yt);
    }
    for (; i + R <= Dv; i += R)
      rows<R>(from + i * Dk, s + i * Dk, Dk, qt, kt, vt + i, gt, bb, yt + i);
    for (; i < Dv; ++i) rows<1>(from + i * Dk, s + i * Dk, Dk, qt, kt, vt + i, gt, bb, yt + i);
  }
}

class GatedDelta : public mx::Primitive {
 public:
  GatedDelta(mx::Stream s, Dims d, float q_scale, float k_scale, float qk_eps, float norm_eps)
      : mx::Primitive(s), d_(d), q_scale_(q_scale), k_scale_(k_scale), qk_eps_(qk_eps),
        norm_eps_(norm_eps) {}

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("edge0 kernels run on the CPU stream only");
  }

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    // in: qkv, z, b, a, conv_state, conv_w, state, A_log, dt_bias, norm_w
    // outs: y (B, T, Hv, Dv), conv state (B, K-1, C), state (B, Hv, Dv, Dk)
    for (auto& o : outs) o.set_data(mx::allocator::malloc(o.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    std::vector<mx::array> args;
    for (const auto& a : in) {
      enc.set_input_array(a);
      args.push_back(mx::array::unsafe_weak_copy(a));
    }
    for (auto& o : outs) enc.set_output_array(o);
    enc.dispatch([args = std::move(args), y = mx::array::unsafe_weak_copy(outs[0]),
                  cs = mx::array::unsafe_weak_copy(outs[1]),
                  so = mx::array::unsafe_weak_copy(outs[2]), d = d_, qs = q_scale_,
                  ks = k_scale_, qe = qk_eps_, ne = norm_eps_]() {
      run(args, y, cs, so, d, qs, ks, qe, ne);
    });
  }

  // Gradients (LoRA training through the layer) are MLX's own: the same computation as
  // mlx-lm's composed ops, differentiated.
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    const Dims d = d_;
    const float qs = q_scale_, ks = k_scale_, qe = qk_eps_, ne = norm_eps_;
    const mx::Stream s = stream();
    auto fun = [d, qs, ks, qe, ne, s](const std::vector<mx::array>& in) {
      return composed(in, d, qs, ks, qe, ne, s);
    };
    auto grads = mx::vjp(fun, primals, cotangents).second;
    std::vector<mx::array> out;
    for (int a : argnums) out.push_back(grads[a]);
    return out;
  }

  const char* name() const override { return "Edge0GatedDelta"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const GatedDelta&>(other);
    return std::memcmp(&d_, &o.d_, sizeof(Dims)) == 0 && q_scale_ == o.q_scale_ &&
           k_scale_ == o.k_scale_ && qk_eps_ == o.qk_eps_ && norm_eps_ == o.norm_eps_;
  }

 private:
  static void run(const std::vector<mx::array>& in, const mx::array& y_out,
                  const mx::array& conv_out, const mx::array& state_out, const Dims& d, float qs,
                  float ks, float qe, float ne) {
    const int64_t B = d.B, T = d.T, C = d.conv(), K = d.K, key = d.key();
    const int64_t V = d.Hv * d.Dv;
    const Dense qkv_d = dense(in[0]), z_d = dense(in[1]), b_d = dense(in[2]), a_d = dense(in[3]);
    const Dense cs_d = dense(in[4]);
    const auto* qkv = reinterpret_cast<const float*>(qkv_d.ptr);
    const auto* z = reinterpret_cast<const float*>(z_d.ptr);
    const auto* bin = reinterpret_cast<const float*>(b_d.ptr);
    const auto* ain = reinterpret_cast<const float*>(a_d.ptr);
    const auto* cs = reinterpret_cast<const float*>(cs_d.ptr);
    const std::vector<float> w = floats(in[5]), A_log = floats(in[7]), dt = floats(in[8]),
                             nw = floats(in[9]);
    float* y = const_cast<float*>(y_out.data<float>());
    float* cs_o = const_cast<float*>(conv_out.data<float>());
    float* s = const_cast<float*>(state_out.data<float>());
    const Dense st_d = dense(in[6]);
    const auto* s0 = reinterpret_cast<const float*>(st_d.ptr);
    // 1. the conv's input: the kept K-1 rows, then the T new ones; its last K-1 rows are kept
    std::vector<float> xin((T + K - 1) * C);
    std::vector<float> conv(B * T * C);
    for (int64_t b = 0; b < B; ++b) {
      float* xb = xin.data();
      std::memcpy(xb, cs + b * (K - 1) * C, (K - 1) * C * 4);
      std::memcpy(xb + (K - 1) * C, qkv + b * T * C, T * C * 4);
      std::memcpy(cs_o + b * (K - 1) * C, xb + T * C, (K - 1) * C * 4);
      // 2. the depthwise conv (out = sum_j in[t + j] * w[c, j], j ascending), then SiLU
      for (int64_t t = 0; t < T; ++t) {
        float* o = conv.data() + (b * T + t) * C;
        for (int64_t c = 0; c < C; ++c) {
          float acc = 0.0f;
          for (int64_t j = 0; j < K; ++j) {
            const float p = xb[(t + j) * C + c] * w[c * K + j];
            acc = acc + p;
          }
          o[c] = silu(acc);
        }
      }
    }
    // 3. q, k (L2-normalized per head, q's readout scale folded in) and v, split out
    std::vector<float> q(B * T * key), k(B * T * key), v(B * T * V);
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const float* row = conv.data() + bt * C;
      std::memcpy(&q[bt * key], row, key * 4);
      std::memcpy(&k[bt * key], row + key, key * 4);
      std::memcpy(&v[bt * V], row + 2 * key, V * 4);
      for (int64_t h = 0; h < d.Hk; ++h) {
        rms_row(&q[bt * key + h * d.Dk], d.Dk, qe, nullptr, qs);
        rms_row(&k[bt * key + h * d.Dk], d.Dk, qe, nullptr, ks);
      }
    }
    // 4. the gates: beta = sigmoid(b), g = exp(-exp(A_log) * softplus(a + dt_bias))
    std::vector<float> g(B * T * d.Hv), beta(B * T * d.Hv);
    for (int64_t i = 0; i < B * T * d.Hv; ++i) {
      const int64_t h = i % d.Hv;
      beta[i] = sigmoid(bin[i]);
      const float x = ain[i] + dt[h];
      const float e = -exp_(A_log[h]);
      const float p = e * softplus(x);
      g[i] = exp_(p);
    }
    // 5. the recurrence, one task per (row, value head): independent, so any thread count
    // gives the same bits
    const int threads = T > 1 ? settings().threads : 1;
    edge0k::Pool::get().run(
        int(B * d.Hv),
        [&](int task) {
          const int64_t b = task / d.Hv, h = task % d.Hv;
          const int64_t at = (b * d.Hv + h) * d.Dv * d.Dk;
          head(d, b, h, q.data(), k.data(), v.data(), g.data(), beta.data(), s0 + at, s + at, y);
        },
        threads);
    // 6. the gated RMSNorm: rms_norm(y, weight) * silu(z), per value head
    for (int64_t r = 0; r < B * T * d.Hv; ++r) {
      float* yr = y + r * d.Dv;
      rms_row(yr, d.Dv, ne, nw.data(), 1.0f);
      const float* zr = z + r * d.Dv;
      for (int64_t i = 0; i < d.Dv; ++i) {
        const float gate = silu(zr[i]);
        yr[i] = gate * yr[i];
      }
    }
  }

  // mlx-lm's composed layer (between its projections) in MLX ops: what the gradient follows
  static std::vector<mx::array> composed(const std::vector<mx::array>& in, const Dims& d,
                                         float qs, float ks, float qe, float ne, mx::Stream s) {
    const int B = int(d.B), T = int(d.T), K = int(d.K), C = int(d.conv()), key = int(d.key());
    const int Hk = int(d.Hk), Dk = int(d.Dk), Hv = int(d.Hv), Dv = int(d.Dv);
    const mx::array xin = mx::concatenate({in[4], in[0]}, 1, s);  // (B, T + K - 1, C)
    const mx::array kept = mx::slice(xin, {0, T, 0}, {B, T + K - 1, C}, s);
    mx::array conv = mx::conv1d(xin, mx::astype(in[5], mx::float32, s), 1, 0, 1, C, s);
    conv = mx::multiply(conv, mx::sigmoid(conv, s), s);
    auto part = [&](int a, int b, int h, int dim) {
      return mx::reshape(mx::slice(conv, {0, 0, a}, {B, T, b}, s), {B, T, h, dim}, s);
    };
    mx::array q = part(0, key, Hk, Dk), k = part(key, 2 * key, Hk, Dk);
    const mx::array v = part(2 * key, C, Hv, Dv);
    q = mx::multiply(mx::array(qs), mx::fast::rms_norm(q, std::nullopt, qe, s), s);
    k = mx::multiply(mx::array(ks), mx::fast::rms_norm(k, std::nullopt, qe, s), s);
    if (Hv / Hk > 1) {
      q = mx::repeat(q, Hv / Hk, 2, s);
      k = mx::repeat(k, Hv / Hk, 2, s);
    }
    const mx::array beta = mx::sigmoid(in[2], s);
    const mx::array A = mx::negative(mx::exp(mx::astype(in[7], mx::float32, s), s), s);
    const mx::array sp = mx::logaddexp(mx::add(in[3], in[8], s), mx::array(0.0f), s);
    const mx::array g = mx::exp(mx::multiply(A, sp, s), s);  // (B, T, Hv)
    mx::array state = in[6];
    std::vector<mx::array> ys;
    for (int t = 0; t < T; ++t) {
      auto at = [&](const mx::array& x) { return mx::take(x, mx::array(t), 1, s); };
      const mx::array qt = at(q), kt = mx::expand_dims(at(k), 2, s), vt = at(v);
      state = mx::multiply(state, mx::expand_dims(at(g), {2, 3}, s), s);
      const mx::array kv = mx::sum(mx::multiply(state, kt, s), -1, false, s);
      const mx::array delta =
          mx::multiply(mx::subtract(vt, kv, s), mx::expand_dims(at(beta), 2, s), s);
      state = mx::add(state, mx::multiply(kt, mx::expand_dims(delta, 3, s), s), s);
      ys.push_back(mx::sum(mx::multiply(state, mx::expand_dims(qt, 2, s), s), -1, false, s));
    }
    mx::array y = mx::stack(ys, 1, s);  // (B, T, Hv, Dv)
    const mx::array z = mx::reshape(in[1], {B, T, Hv, Dv}, s);
    y = mx::fast::rms_norm(y, mx::astype(in[9], mx::float32, s), ne, s);
    y = mx::multiply(mx::multiply(z, mx::sigmoid(z, s), s), y, s);
    return {y, kept, state};
  }

  Dims d_;
  float q_scale_, k_scale_, qk_eps_, norm_eps_;
};

void want(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("edge0 gated_delta: " + what);
}

}  // namespace

std::vector<mx::array> gated_delta(const mx::array& qkv, const mx::array& z, const mx::array& b,
                                   const mx::array& a, const mx::array& conv_state,
                                   const mx::array& conv_w, const mx::array& state,
                                   const mx::array& A_log, const mx::array& dt_bias,
                                   const mx::array& norm_w, int Hk, int Dk, int Hv, int Dv,
                                   float q_scale, float k_scale, float qk_eps, float norm_eps,
                                   mx::StreamOrDevice s) {
  for (const mx::array* x : {&qkv, &z, &b, &a, &conv_state, &state})
    want(x->dtype() == mx::float32, "activations and states must be float32");
  want(qkv.ndim() == 3, "qkv must be (B, T, 2 Hk Dk + Hv Dv)");
  want(Hk > 0 && Hv % Hk == 0 && Dk > 0 && Dv > 0, "value heads must be a multiple of key heads");
  Dims d{qkv.shape(0), qkv.shape(1), Hk, Dk, Hv, Dv, 0};
  want(qkv.shape(2) == d.conv(), "qkv's width is not 2 Hk Dk + Hv Dv");
  want(conv_w.ndim() == 3 && conv_w.shape(0) == d.conv() && conv_w.shape(2) == 1,
       "conv weight must be (C, K, 1)");
  d.K = conv_w.shape(1);
  want(d.K >= 1, "conv kernel size must be at least 1");
  want(z.size() == size_t(d.B * d.T * Hv * Dv), "z must be (B, T, Hv, Dv)");
  want(b.size() == size_t(d.B * d.T * Hv) && a.size() == b.size(), "a and b must be (B, T, Hv)");
  want(conv_state.ndim() == 3 && conv_state.shape(0) == d.B && conv_state.shape(1) == d.K - 1 &&
           conv_state.shape(2) == d.conv(),
       "conv state must be (B, K - 1, C)");
  want(state.ndim() == 4 && state.shape(0) == d.B && state.shape(1) == Hv &&
           state.shape(2) == Dv && state.shape(3) == Dk,
       "state must be (B, Hv, Dv, Dk)");
  want(A_log.size() == size_t(Hv) && dt_bias.size() == size_t(Hv) && norm_w.size() == size_t(Dv),
       "A_log and dt_bias need Hv values, the norm weight Dv");
  auto prim = std::make_shared<GatedDelta>(mx::to_stream(s), d, q_scale, k_scale, qk_eps, norm_eps);
  return mx::array::make_arrays(
      {{int(d.B), int(d.T), Hv, Dv}, conv_state.shape(), state.shape()},
      {mx::float32, mx::float32, mx::float32}, prim,
      {qkv, z, b, a, conv_state, conv_w, state, A_log, dt_bias, norm_w});
}

}  // namespace edge0

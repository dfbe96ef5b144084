// Scaled dot-product attention as one CPU primitive, for a decode step's queries or a prompt's.
//
// On the CPU, mx.fast.scaled_dot_product_attention runs its composed fallback: about 12
// graph nodes per call (scale, GQA reshapes, two matmuls, softmax). Here one node computes,
// per batch row, query head and query position, the scaled scores against the keys the
// mask allows, a precise (float32, max-subtracted) softmax and the weighted sum of the
// values; grouped-query heads read their shared key/value head in place. A prompt's
// queries (PROMPT_QUERIES or more) meet their keys transposed once per head, each query's
// scores vectorised over the keys instead of one dot product per key. A head's
// attention sink (gpt-oss) is one more logit in its softmax with no value: it takes a
// share of the weight and gives nothing back. Keys and values
// may be strided views (a KV cache's filled part). The sums are reassociated against
// MLX's BLAS matmuls, so results agree to float rounding, not bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_primitive.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/fast.h"
#include "mlx/transforms.h"
#include "primitives.h"

namespace edge0 {

namespace {

struct Strided4 {
  const float* p;
  int64_t s[4];
};

Strided4 strided(const mx::array& a) {
  return {a.data<float>(),
          {int64_t(a.strides()[0]), int64_t(a.strides()[1]), int64_t(a.strides()[2]),
           int64_t(a.strides()[3])}};
}

// The two inner loops, cloned for AVX2+FMA where the CPU has them (chosen at load by the
// dynamic linker; the default clone runs on any x86-64).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EDGE0_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define EDGE0_CLONES
#endif

EDGE0_CLONES float dot(const float* a, const float* b, int64_t sb, int64_t n) {
  float acc = 0.0f;
  if (sb == 1) {
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  } else {
    for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i * sb];
  }
  return acc;
}

EDGE0_CLONES void axpy(float w, const float* x, int64_t sx, float* y, int64_t n) {
  if (sx == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] += w * x[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] += w * x[i * sx];
  }
}

// out[j] = sum_d q[d] * kt[d * ld + j], j < n: a query's scores against keys stored
// transposed (a prompt's queries share them), vectorised over the keys
EDGE0_CLONES void scores_t(const float* q, const float* kt, int64_t D, int64_t ld, int64_t n,
                           float* out) {
  std::fill(out, out + n, 0.0f);
  for (int64_t d = 0; d < D; ++d) {
    const float qd = q[d];
    const float* row = kt + d * ld;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) out[j] += qd * row[j];
  }
}

constexpr int64_t PROMPT_QUERIES = 16;  // from this many queries the keys are transposed once

class SDPA : public CpuPrimitive {
 public:
  // inputs: q, k, v, then the mask if `masked`, then the sinks if `sinks`
  SDPA(mx::Stream s, float scale, bool causal, bool masked, bool sinks)
      : CpuPrimitive(s), scale_(scale), causal_(causal), masked_(masked), sinks_(sinks) {}

  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    auto& enc = prepare(in, out);
    const bool masked = masked_, sinks = sinks_;
    const size_t at_sinks = masked ? 4 : 3;
    enc.dispatch([q = mx::array::unsafe_weak_copy(in[0]), k = mx::array::unsafe_weak_copy(in[1]),
                  v = mx::array::unsafe_weak_copy(in[2]), o = mx::array::unsafe_weak_copy(out),
                  m = mx::array::unsafe_weak_copy(masked ? in[3] : in[0]),
                  sk = mx::array::unsafe_weak_copy(sinks ? in[at_sinks] : in[0]), masked, sinks,
                  scale = scale_, causal = causal_]() {
      run(q, k, v, masked ? &m : nullptr, sinks ? &sk : nullptr, o, scale, causal);
    });
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    const float scale = scale_;
    const std::string mode = causal_ ? "causal" : "";
    const mx::Stream s = stream();
    std::optional<mx::array> mask, sinks;
    if (masked_) mask = primals[3];
    if (sinks_) sinks = primals[masked_ ? 4 : 3];
    auto fun = [scale, mode, mask, sinks, s](const std::vector<mx::array>& in) {
      return std::vector<mx::array>{mx::fast::scaled_dot_product_attention(
          in[0], in[1], in[2], scale, mask ? "array" : mode, mask, sinks, false, s)};
    };
    const std::vector<mx::array> qkv(primals.begin(), primals.begin() + 3);
    auto grads = mx::vjp(fun, qkv, cotangents).second;
    std::vector<mx::array> out;
    for (int a : argnums) {
      if (a > 2) throw std::invalid_argument("edge0 sdpa: no gradient flows to the mask or sinks");
      out.push_back(grads[a]);
    }
    return out;
  }

  const char* name() const override { return "Edge0SDPA"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const SDPA&>(other);
    return scale_ == o.scale_ && causal_ == o.causal_ && masked_ == o.masked_ &&
           sinks_ == o.sinks_;
  }

 private:
  // a boolean mask (broadcast to (B, Hq, Lq, Lk) by its strides) hides keys: the visible
  // ones are summed in the same order as without a mask, so a left-padded row of a batch
  // gets exactly the result it gets alone
  static void run(const mx::array& q, const mx::array& k, const mx::array& v, const mx::array* m,
                  const mx::array* sk, const mx::array& o, float scale, bool causal) {
    const int64_t B = q.shape(0), Hq = q.shape(1), Lq = q.shape(2), D = q.shape(3);
    const int64_t Hk = k.shape(1), Lk = k.shape(2), Dv = v.shape(3);
    const int64_t rep = Hq / Hk;
    const Strided4 Q = strided(q), K = strided(k), V = strided(v);
    int64_t M[4] = {0, 0, 0, 0};
    if (m)
      for (int d = 0; d < 4; ++d) M[d] = m->strides()[d];
    float* op = const_cast<float*>(o.data<float>());
    const float* sinks = sk ? sk->data<float>() : nullptr;  // read in place: (Hq,) strided
    const int64_t sink_step = sk ? sk->strides()[0] : 0;
    // the query heads that share a key/value head read each key and value row once
    std::vector<float> qs(rep * D), p(rep * Lk), acc(rep * Dv), inv(rep);
    const bool prompt = Lq >= PROMPT_QUERIES;
    std::vector<float> kt(prompt ? D * Lk : 0);  // a prompt's keys, transposed (D, Lk)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t hk = 0; hk < Hk; ++hk) {
        const float* kb = K.p + b * K.s[0] + hk * K.s[1];
        const float* vb = V.p + b * V.s[0] + hk * V.s[1];
        if (prompt)
          for (int64_t j = 0; j < Lk; ++j)
            for (int64_t d = 0; d < D; ++d) kt[d * Lk + j] = kb[j * K.s[2] + d * K.s[3]];
        for (int64_t i = 0; i < Lq; ++i) {
          for (int64_t r = 0; r < rep; ++r) {
            const float* qr = Q.p + b * Q.s[0] + (hk * rep + r) * Q.s[1] + i * Q.s[2];
            for (int64_t d = 0; d < D; ++d) qs[r * D + d] = scale * qr[d * Q.s[3]];
          }
          // keys this query may see: all, or up to its own position (causal)
          const int64_t n = causal ? std::min(Lk, Lk - Lq + i + 1) : Lk;
          if (prompt) {
            for (int64_t r = 0; r < rep; ++r) scores_t(&qs[r * D], kt.data(), D, Lk, n, &p[r * Lk]);
          } else {
            for (int64_t j = 0; j < n; ++j) {
              const float* kr = kb + j * K.s[2];
              for (int64_t r = 0; r < rep; ++r) p[r * Lk + j] = dot(&qs[r * D], kr, K.s[3], D);
            }
          }
          for (int64_t r = 0; r < rep; ++r) {  // a precise softmax over the visible keys
            float* pr = &p[r * Lk];
            const bool* mr = m ? m->data<bool>() + b * M[0] + (hk * rep + r) * M[1] + i * M[2]
                               : nullptr;
            const float sink = sinks ? sinks[(hk * rep + r) * sink_step] : 0.0f;
            float top = sinks ? sink : -std::numeric_limits<float>::infinity();
            for (int64_t j = 0; j < n; ++j)
              if (!mr || mr[j * M[3]]) top = std::max(top, pr[j]);
            float sum = sinks ? std::exp(sink - top) : 0.0f;
            for (int64_t j = 0; j < n; ++j) {
              if (mr && !mr[j * M[3]]) {
                pr[j] = 0.0f;  // hidden: no share of the sum or of the values
                continue;
              }
              pr[j] = std::exp(pr[j] - top);
              sum += pr[j];
            }
            inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
          }
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t j = 0; j < n; ++j) {
            const float* vr = vb + j * V.s[2];
            for (int64_t r = 0; r < rep; ++r) {
              const float w = p[r * Lk + j];
              if (w != 0.0f || !m) axpy(w * inv[r], vr, V.s[3], &acc[r * Dv], Dv);
            }
          }
          for (int64_t r = 0; r < rep; ++r) {
            float* orow = op + ((b * Hq + hk * rep + r) * Lq + i) * Dv;
            std::copy(acc.begin() + r * Dv, acc.begin() + (r + 1) * Dv, orow);
          }
        }
      }
    }
  }

  float scale_;
  bool causal_, masked_, sinks_;
};

}  // namespace

mx::array sdpa(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
               bool causal, const std::optional<mx::array>& mask,
               const std::optional<mx::array>& sinks, mx::StreamOrDevice s) {
  for (const mx::array* a : {&q, &k, &v})
    if (a->dtype() != mx::float32 || a->ndim() != 4)
      throw std::invalid_argument("edge0 sdpa: queries, keys and values must be float32 4-D");
  if (k.shape(0) != q.shape(0) || v.shape(0) != q.shape(0) || k.shape(1) != v.shape(1) ||
      k.shape(2) != v.shape(2) || k.shape(3) != q.shape(3) || k.shape(1) == 0 ||
      q.shape(1) % k.shape(1) != 0)
    throw std::invalid_argument("edge0 sdpa: keys and values do not match the queries' shape");
  if (causal && q.shape(2) > k.shape(2))
    throw std::invalid_argument("edge0 sdpa: a causal mask needs at least as many keys as queries");
  std::vector<mx::array> inputs{q, k, v};
  if (mask) {
    if (causal) throw std::invalid_argument("edge0 sdpa: a mask array or the causal mask, not both");
    if (mask->dtype() != mx::bool_ || mask->ndim() > 4)
      throw std::invalid_argument("edge0 sdpa: the mask must be boolean with at most 4 dimensions");
    const mx::Shape full{q.shape(0), q.shape(1), q.shape(2), k.shape(2)};
    inputs.push_back(mx::broadcast_to(*mask, full, s));  // a view: strides 0 where broadcast
  }
  if (sinks) {
    if (sinks->dtype() != mx::float32 || sinks->ndim() != 1 || sinks->shape(0) != q.shape(1))
      throw std::invalid_argument("edge0 sdpa: sinks must be float32 with one value per query head");
    inputs.push_back(*sinks);  // no copy node: the kernel reads its stride
  }
  return mx::array({q.shape(0), q.shape(1), q.shape(2), v.shape(3)}, mx::float32,
                   std::make_shared<SDPA>(mx::to_stream(s), scale, causal, mask.has_value(),
                                          sinks.has_value()),
                   std::move(inputs));
}

}  // namespace edge0

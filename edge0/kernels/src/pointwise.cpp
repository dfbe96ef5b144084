// RMSNorm and RoPE as single CPU primitives, bit-identical to MLX's own CPU results.
//
// On the CPU, mx.fast.rms_norm and mx.fast.rope run as their composed fallbacks: 11 and
// 29 graph nodes per call, each paying MLX's dispatch cost, which on a small model is
// most of a decode step. These primitives do the same arithmetic in one node, in the
// same order and with MLX's own float sin/cos/exp (its simd math header), so their
// outputs equal MLX's bit for bit. This file is compiled with -ffp-contract=off: no
// product may be fused into an FMA where MLX rounds it first.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cpu_primitive.h"
#include "dense.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/backend/cpu/simd/simd.h"
#include "mlx/fast.h"
#include "mlx/transforms.h"
#include "primitives.h"

namespace edge0 {

namespace {

namespace simd = mx::simd;

float to_float(const mx::array& a, size_t i) {
  switch (a.dtype()) {
    case mx::float32:
      return a.data<float>()[i];
    case mx::float16:
      return static_cast<float>(a.data<mx::float16_t>()[i]);
    case mx::bfloat16:
      return static_cast<float>(a.data<mx::bfloat16_t>()[i]);
    default:
      throw std::invalid_argument("edge0 rms_norm: weight must be float32, float16 or bfloat16");
  }
}

// Element offsets of a (B, N, T, D) view of x (3-D x: N = 1); the last axis may be strided.
struct View4 {
  int64_t shape[4];
  int64_t stride[4];
};

View4 view4(const mx::array& x) {
  View4 v;
  if (x.ndim() == 3) {
    v = {{x.shape(0), 1, x.shape(1), x.shape(2)},
         {int64_t(x.strides()[0]), 0, int64_t(x.strides()[1]), int64_t(x.strides()[2])}};
  } else {
    for (int k = 0; k < 4; ++k) {
      v.shape[k] = x.shape(k);
      v.stride[k] = x.strides()[k];
    }
  }
  return v;
}

class RMSNorm : public CpuPrimitive {
 public:
  RMSNorm(mx::Stream s, float eps) : CpuPrimitive(s), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    auto& enc = prepare(in, out);
    enc.dispatch([x = mx::array::unsafe_weak_copy(in[0]), w = mx::array::unsafe_weak_copy(in[1]),
                  o = mx::array::unsafe_weak_copy(out), eps = eps_]() {
      const int64_t d = x.shape(-1);
      const int64_t rows = d ? int64_t(x.size()) / d : 0;
      std::vector<float> wf(d);
      const int64_t ws = w.strides()[0];
      for (int64_t i = 0; i < d; ++i) wf[i] = to_float(w, i * ws);
      // MLX's mean multiplies the sum by 1/d, computed in double and stored as float
      const float inv_d = static_cast<float>(1.0 / double(d));
      const Dense xd = dense(x);
      const float* xp = reinterpret_cast<const float*>(xd.ptr);
      float* op = const_cast<float*>(o.data<float>());
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xp + r * d;
        float ss = 0.0f;  // sequential, as MLX's CPU reduction
        for (int64_t i = 0; i < d; ++i) {
          const float sq = xr[i] * xr[i];
          ss += sq;
        }
        const float v = ss * inv_d + eps;
        const float scale = 1.0f / std::sqrt(v);
        float* orow = op + r * d;
        for (int64_t i = 0; i < d; ++i) {
          const float n = xr[i] * scale;
          orow[i] = n * wf[i];
        }
      }
    });
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    const float eps = eps_;
    const mx::Stream s = stream();
    auto fun = [eps, s](const std::vector<mx::array>& in) {
      return std::vector<mx::array>{mx::fast::rms_norm(in[0], in[1], eps, s)};
    };
    auto grads = mx::vjp(fun, primals, cotangents).second;
    std::vector<mx::array> out;
    for (int a : argnums) out.push_back(grads[a]);
    return out;
  }

  const char* name() const override { return "Edge0RMSNorm"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return eps_ == static_cast<const RMSNorm&>(other).eps_;
  }

 private:
  float eps_;
};

class RoPE : public CpuPrimitive {
 public:
  RoPE(mx::Stream s, int dims, bool traditional, float base, float scale, bool forward)
      : CpuPrimitive(s),
        dims_(dims),
        traditional_(traditional),
        base_(base),
        scale_(scale),
        forward_(forward) {}

  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    std::vector<mx::array> args;
    auto& enc = prepare(in, out, &args);
    enc.dispatch([args = std::move(args), o = mx::array::unsafe_weak_copy(out), dims = dims_,
                  trad = traditional_, base = base_, scale = scale_, fwd = forward_]() {
      run(args, o, dims, trad, base, scale, fwd);
    });
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    for (int a : argnums)
      if (a != 0) throw std::invalid_argument("edge0 rope: gradients flow to x only");
    std::vector<mx::array> inputs{cotangents[0], primals[1]};
    if (primals.size() == 3) inputs.push_back(primals[2]);
    auto prim = std::make_shared<RoPE>(stream(), dims_, traditional_, base_, scale_, !forward_);
    return {mx::array(cotangents[0].shape(), mx::float32, prim, std::move(inputs))};
  }

  const char* name() const override { return "Edge0RoPE"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RoPE&>(other);
    return dims_ == o.dims_ && traditional_ == o.traditional_ && base_ == o.base_ &&
           scale_ == o.scale_ && forward_ == o.forward_;
  }

 private:
  static void run(const std::vector<mx::array>& args, const mx::array& o, int dims, bool trad,
                  float base, float scale, bool fwd) {
    const mx::array& x = args[0];
    const mx::array& offset = args[1];
    const View4 v = view4(x);
    const int half = dims / 2;
    // inverse frequencies as MLX's fallback computes them: exp(-i * log(base) / half), or
    // 1 / freqs[i] when the frequencies are given
    std::vector<float> inv(half);
    if (args.size() == 3) {
      const float* f = args[2].data<float>();
      const int64_t fs = args[2].strides()[0];
      for (int i = 0; i < half; ++i) inv[i] = 1.0f / f[i * fs];
    } else {
      const float step = std::log(base) / half;
      for (int i = 0; i < half; ++i) {
        const float e = float(-i) * step;
        inv[i] = simd::exp(simd::Simd<float, 1>(e)).value;
      }
    }
    std::vector<float> c(half), s(half);
    const int64_t D = v.shape[3];
    const float* xp = x.data<float>();
    float* op = const_cast<float*>(o.data<float>());
    const bool per_row = offset.size() > 1;
    for (int64_t b = 0; b < v.shape[0]; ++b) {
      const int32_t off = offset.data<int32_t>()[per_row ? b * offset.strides()[0] : 0];
      for (int64_t t = 0; t < v.shape[2]; ++t) {
        const float pos = (float(t) + float(off)) * scale;
        for (int i = 0; i < half; ++i) {
          const float theta = pos * inv[i];
          c[i] = simd::cos(simd::Simd<float, 1>(theta)).value;
          s[i] = simd::sin(simd::Simd<float, 1>(theta)).value;
        }
        for (int64_t n = 0; n < v.shape[1]; ++n) {
          const float* xr = xp + b * v.stride[0] + n * v.stride[1] + t * v.stride[2];
          float* orow = op + ((b * v.shape[1] + n) * v.shape[2] + t) * D;
          const int64_t sd = v.stride[3];
          for (int i = 0; i < half; ++i) {
            const int64_t i1 = trad ? 2 * i : i, i2 = trad ? 2 * i + 1 : i + half;
            const float x1 = xr[i1 * sd], x2 = xr[i2 * sd];
            float o1, o2;
            if (fwd) {
              const float a = x1 * c[i], bb = x2 * s[i];
              o1 = a - bb;
              const float e = x1 * s[i], f = x2 * c[i];
              o2 = e + f;
            } else {
              const float a = x2 * s[i], bb = x1 * c[i];
              o1 = a + bb;
              const float e = x2 * c[i], f = x1 * s[i];
              o2 = e - f;
            }
            orow[i1] = o1;
            orow[i2] = o2;
          }
          for (int64_t j = dims; j < D; ++j) orow[j] = xr[j * sd];
        }
      }
    }
  }

  int dims_;
  bool traditional_;
  float base_, scale_;
  bool forward_;
};

}  // namespace

mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps, mx::StreamOrDevice s) {
  if (x.dtype() != mx::float32 || x.ndim() < 1)
    throw std::invalid_argument("edge0 rms_norm: x must be float32 with at least one dimension");
  if (weight.ndim() != 1 || weight.shape(0) != x.shape(-1))
    throw std::invalid_argument("edge0 rms_norm: weight must be 1-D with x's last dimension");
  if (weight.dtype() != mx::float32 && weight.dtype() != mx::float16 &&
      weight.dtype() != mx::bfloat16)
    throw std::invalid_argument("edge0 rms_norm: weight must be float32, float16 or bfloat16");
  return mx::array(x.shape(), mx::float32, std::make_shared<RMSNorm>(mx::to_stream(s), eps),
                   {x, weight});
}

mx::array rope(const mx::array& x, const mx::array& offset, const std::optional<mx::array>& freqs,
               int dims, bool traditional, float base, float scale, bool forward,
               mx::StreamOrDevice s) {
  if (x.dtype() != mx::float32 || (x.ndim() != 3 && x.ndim() != 4))
    throw std::invalid_argument("edge0 rope: x must be float32 with 3 or 4 dimensions");
  if (dims <= 0 || dims % 2 != 0 || dims > x.shape(-1))
    throw std::invalid_argument("edge0 rope: dims must be even, positive and at most x's last "
                                "dimension, got " + std::to_string(dims));
  if (offset.dtype() != mx::int32 || offset.ndim() > 1 ||
      (offset.size() != 1 && int64_t(offset.size()) != x.shape(0)))
    throw std::invalid_argument("edge0 rope: offset must be int32, a scalar or one per batch row");
  std::vector<mx::array> inputs{x, offset};
  if (freqs) {
    if (freqs->dtype() != mx::float32 || freqs->ndim() != 1 || freqs->shape(0) != dims / 2)
      throw std::invalid_argument("edge0 rope: freqs must be float32 of shape (dims / 2,)");
    inputs.push_back(*freqs);
  } else if (!(base > 0.0f)) {
    throw std::invalid_argument("edge0 rope: base must be positive when no freqs are given");
  }
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<RoPE>(mx::to_stream(s), dims, traditional, base, scale, forward),
                   std::move(inputs));
}

}  // namespace edge0

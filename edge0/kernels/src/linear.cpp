// A float linear layer (x @ w.T + bias, weights float32, float16 or bfloat16) as one CPU node.
//
// MLX's CPU matmul calls the wheel's bundled reference BLAS, whose product of one row by
// a float32 matrix reads the weights at about 2 GB/s: the prerouter heads (a dequantized
// copy of a router, or a trained head of several MiB) cost more than their layer's int4
// experts. Here each output is a dot product over the row, vectorised eight lanes at a
// time (AVX2+FMA where the CPU has it), rows split over the kernel threads when the call
// is large. The sums are reassociated against BLAS's, so results agree to float rounding.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_primitive.h"
#include "dense.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/transforms.h"
#include "operands.h"
#include "pool.h"
#include "primitives.h"

namespace edge0 {

namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EDGE0_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define EDGE0_CLONES
#endif

constexpr int64_t ROWS = 4;  // weight rows a pass over x meets

inline float widen(uint16_t h, bool bf16) {
  if (bf16) {
    const uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  return static_cast<float>(*reinterpret_cast<const mx::float16_t*>(&h));
}

// out[m * ldo + r] = sum_c x[m][c] w[r][c] for rows [r0, r1), float32 weights
EDGE0_CLONES void rows_f32(const float* w, int64_t cols, const float* x, int64_t M, int64_t r0,
                           int64_t r1, float* out, int64_t ldo) {
  int64_t r = r0;
  for (; r + ROWS <= r1; r += ROWS) {
    const float* w0 = w + r * cols;
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * cols;
      float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
      for (int64_t c = 0; c < cols; ++c) {
        const float xc = xm[c];
        a0 += w0[c] * xc;
        a1 += w0[cols + c] * xc;
        a2 += w0[2 * cols + c] * xc;
        a3 += w0[3 * cols + c] * xc;
      }
      float* o = out + m * ldo + r;
      o[0] = a0, o[1] = a1, o[2] = a2, o[3] = a3;
    }
  }
  for (; r < r1; ++r) {
    const float* wr = w + r * cols;
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * cols;
      float a = 0.0f;
#pragma omp simd reduction(+ : a)
      for (int64_t c = 0; c < cols; ++c) a += wr[c] * xm[c];
      out[m * ldo + r] = a;
    }
  }
}

// the same for 16-bit weights, each row widened once into `buf`
EDGE0_CLONES void rows_16(const uint16_t* w, bool bf16, int64_t cols, const float* x, int64_t M,
                          int64_t r0, int64_t r1, float* out, int64_t ldo, float* buf) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* wr = w + r * cols;
    if (bf16) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) {
        const uint32_t bits = uint32_t(wr[c]) << 16;
        std::memcpy(&buf[c], &bits, 4);
      }
    } else {
      for (int64_t c = 0; c < cols; ++c) buf[c] = widen(wr[c], false);
    }
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * cols;
      float a = 0.0f;
#pragma omp simd reduction(+ : a)
      for (int64_t c = 0; c < cols; ++c) a += buf[c] * xm[c];
      out[m * ldo + r] = a;
    }
  }
}

class Linear : public CpuPrimitive {
 public:
  Linear(mx::Stream s, bool bias) : CpuPrimitive(s), bias_(bias) {}

  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    auto& enc = prepare(in, out);
    enc.dispatch([x = mx::array::unsafe_weak_copy(in[0]), w = mx::array::unsafe_weak_copy(in[1]),
                  b = mx::array::unsafe_weak_copy(bias_ ? in[2] : in[0]), bias = bias_,
                  o = mx::array::unsafe_weak_copy(out)]() { run(x, w, bias ? &b : nullptr, o); });
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    const bool bias = bias_;
    const mx::Stream s = stream();
    auto fun = [bias, s](const std::vector<mx::array>& in) {
      mx::array y = mx::matmul(in[0], mx::transpose(in[1], s), s);
      return std::vector<mx::array>{bias ? mx::add(y, in[2], s) : y};
    };
    auto grads = mx::vjp(fun, primals, cotangents).second;
    std::vector<mx::array> got;
    for (int a : argnums) got.push_back(grads[a]);
    return got;
  }

  const char* name() const override { return "Edge0Linear"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return bias_ == static_cast<const Linear&>(other).bias_;
  }

 private:
  static void run(const mx::array& x, const mx::array& w, const mx::array* b, const mx::array& o) {
    const int64_t cols = w.shape(1), rows = w.shape(0);
    const int64_t M = cols ? int64_t(x.size()) / cols : 0;
    const Dense xd = dense(x), wd = dense(w);
    const auto* xp = reinterpret_cast<const float*>(xd.ptr);
    float* op = const_cast<float*>(o.data<float>());
    // rows per task: 256 KiB of weights or more, as the quantized kernels split
    const int64_t item = w.itemsize();
    const int64_t per = std::max<int64_t>(ROWS, (256 * 1024) / std::max<int64_t>(1, cols * item));
    const int64_t chunk = (per + ROWS - 1) / ROWS * ROWS;
    const int tasks = int((rows + chunk - 1) / chunk);
    const bool is16 = item == 2, bf16 = w.dtype() == mx::bfloat16;
    edge0k::Pool::get().run(
        tasks,
        [&](int t) {
          const int64_t r0 = t * chunk, r1 = std::min(rows, r0 + chunk);
          if (is16) {
            std::vector<float> buf(cols);
            rows_16(reinterpret_cast<const uint16_t*>(wd.ptr), bf16, cols, xp, M, r0, r1, op, rows,
                    buf.data());
          } else {
            rows_f32(reinterpret_cast<const float*>(wd.ptr), cols, xp, M, r0, r1, op, rows);
          }
        },
        settings().threads);
    if (b != nullptr) {
      const Dense bd = dense(*b);
      for (int64_t r = 0; r < rows; ++r) {
        float bv;
        if (b->dtype() == mx::float32)
          bv = reinterpret_cast<const float*>(bd.ptr)[r];
        else
          bv = widen(reinterpret_cast<const uint16_t*>(bd.ptr)[r], b->dtype() == mx::bfloat16);
        for (int64_t m = 0; m < M; ++m) op[m * rows + r] += bv;
      }
    }
  }

  bool bias_;
};

}  // namespace

mx::array linear(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                 mx::StreamOrDevice s) {
  if (x.dtype() != mx::float32) throw std::invalid_argument("edge0 linear: x must be float32");
  if (w.ndim() != 2 || (w.dtype() != mx::float32 && w.dtype() != mx::bfloat16 &&
                        w.dtype() != mx::float16))
    throw std::invalid_argument("edge0 linear: the weight must be a float matrix (rows, cols)");
  if (x.ndim() < 1 || x.shape(-1) != w.shape(1))
    throw std::invalid_argument("edge0 linear: x's last dimension " +
                                std::to_string(x.ndim() ? x.shape(-1) : 0) +
                                " does not match the weight's " + std::to_string(w.shape(1)));
  if (bias && (bias->ndim() != 1 || bias->shape(0) != w.shape(0)))
    throw std::invalid_argument("edge0 linear: the bias must have one value per output row");
  auto shape = x.shape();
  shape.back() = w.shape(0);
  std::vector<mx::array> inputs{x, w};
  if (bias) inputs.push_back(*bias);
  return mx::array(shape, mx::float32, std::make_shared<Linear>(mx::to_stream(s), bias.has_value()),
                   std::move(inputs));
}

}  // namespace edge0

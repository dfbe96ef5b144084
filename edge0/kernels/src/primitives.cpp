// The quantized matmul primitive over the row kernels.
//
// eval_cpu dispatches one task on the CPU stream's command encoder, like MLX's own CPU
// primitives; inputs stay alive until the stream has run it. On a GPU stream these
// primitives refuse: the Python face never builds them there.
#include "primitives.h"

#include <memory>
#include <stdexcept>

#include "compute.h"
#include "cpu_primitive.h"
#include "dense.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "operands.h"

namespace edge0 {

namespace {

class QuantMatmul : public CpuPrimitive {
 public:
  QuantMatmul(mx::Stream s, int group, int bits, int mode)
      : CpuPrimitive(s), group_(group), bits_(bits), mode_(mode) {}

  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    auto& enc = prepare(in, out);
    const bool has_b = in.size() > 3;
    enc.dispatch([x = mx::array::unsafe_weak_copy(in[0]), w = mx::array::unsafe_weak_copy(in[1]),
                  sc = mx::array::unsafe_weak_copy(in[2]),
                  b = has_b ? std::optional<mx::array>(mx::array::unsafe_weak_copy(in[3]))
                            : std::nullopt,
                  o = mx::array::unsafe_weak_copy(out), g = group_, bits = bits_, mode = mode_]() {
      const Dense xd = dense(x);
      const edge0k::QMat q = matrix(w, sc, b ? &*b : nullptr, g, bits, mode);
      const int M = static_cast<int>(x.size() / x.shape(-1));
      edge0k::qmm(kernels(q.mode), settings(), q, reinterpret_cast<const float*>(xd.ptr), M,
                  const_cast<float*>(o.data<float>()));
    });
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    std::vector<mx::array> grads;
    for (int a : argnums) {
      if (a != 0)
        throw std::invalid_argument("edge0 qmm: gradients flow to x only (the weights are quantized)");
      std::optional<mx::array> b;
      if (primals.size() > 3) b = primals[3];
      const char* mode = mode_ == 1 ? "mxfp4" : "affine";
      grads.push_back(mx::quantized_matmul(cotangents[0], primals[1], primals[2], b, false,
                                           group_, bits_, mode, stream()));
    }
    return grads;
  }

  const char* name() const override { return "Edge0QuantMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const QuantMatmul&>(other);
    return group_ == o.group_ && bits_ == o.bits_ && mode_ == o.mode_;
  }

 private:
  int group_, bits_, mode_;
};

}  // namespace

mx::array qmm(const mx::array& x, const mx::array& w, const mx::array& scales,
              const std::optional<mx::array>& biases, int group_size, int bits,
              const std::string& mode, mx::StreamOrDevice s) {
  const int m = mode_code(mode);
  check_quant(w, scales, biases, group_size, bits, m, 0);
  if (x.dtype() != mx::float32) throw std::invalid_argument("edge0 qmm: x must be float32");
  const int cols = w.shape(-1) * 32 / bits;
  if (x.ndim() < 1 || x.shape(-1) != cols)
    throw std::invalid_argument("edge0 qmm: x's last dimension " + std::to_string(x.shape(-1)) +
                                " does not match the weight's " + std::to_string(cols));
  auto shape = x.shape();
  shape.back() = w.shape(0);
  std::vector<mx::array> inputs{x, w, scales};
  if (biases) inputs.push_back(*biases);
  return mx::array(shape, mx::float32,
                   std::make_shared<QuantMatmul>(mx::to_stream(s), group_size, bits, m),
                   std::move(inputs));
}

}  // namespace edge0

// Two MLX CPU primitives (quantized matmul, fused expert FFN) over the row kernels.
//
// eval_cpu dispatches one task on the CPU stream's command encoder, like MLX's own CPU
// primitives; inputs stay alive until the stream has run it. On a GPU stream these
// primitives refuse: the Python face never builds them there.
#include "primitives.h"

#include <cstring>
#include <memory>
#include <stdexcept>

#include "compute.h"
#include "pool.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

namespace edge0 {

namespace {

const edge0k::Kernels* g_kernels = edge0k::select_kernels(nullptr);
edge0k::Settings g_settings;

edge0k::DType dtype_of(const mx::array& a) {
  switch (a.dtype()) {
    case mx::float32:
      return edge0k::DType::F32;
    case mx::float16:
      return edge0k::DType::F16;
    case mx::bfloat16:
      return edge0k::DType::BF16;
    case mx::uint8:
      return edge0k::DType::U8;
    default:
      throw std::invalid_argument("edge0 kernels: scales must be float32, float16, bfloat16 or uint8");
  }
}

// A contiguous copy of a strided array when it is not row-contiguous (broadcasts,
// transposed views); the array's own bytes otherwise.
struct Dense {
  std::vector<uint8_t> copy;
  const uint8_t* ptr = nullptr;
};

Dense dense(const mx::array& a) {
  Dense d;
  const size_t item = a.itemsize();
  if (a.flags().row_contiguous || a.ndim() == 0) {
    d.ptr = a.data<uint8_t>();
    return d;
  }
  d.copy.resize(a.size() * item);
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  const int nd = static_cast<int>(a.ndim());
  std::vector<int64_t> pos(nd, 0);
  const uint8_t* base = a.data<uint8_t>();
  for (size_t i = 0; i < a.size(); ++i) {
    int64_t off = 0;
    for (int k = 0; k < nd; ++k) off += pos[k] * strides[k];
    std::memcpy(d.copy.data() + i * item, base + off * int64_t(item), item);
    for (int k = nd - 1; k >= 0; --k) {
      if (++pos[k] < shape[k]) break;
      pos[k] = 0;
    }
  }
  d.ptr = d.copy.data();
  return d;
}

// The matrix view of a 2-D (rows, packed) array, or of one slot of a 3-D stack.
edge0k::QMat matrix(const mx::array& w, const mx::array& scales, const mx::array* biases,
                    int group, int bits, int mode) {
  const int nd = static_cast<int>(w.ndim());
  if (w.strides()[nd - 1] != 1 || scales.strides()[nd - 1] != 1 ||
      (biases != nullptr && biases->strides()[nd - 1] != 1))
    throw std::invalid_argument("edge0 kernels: quantized operands must be contiguous along rows");
  edge0k::QMat q;
  q.w = w.data<uint8_t>();
  q.w_row = w.strides()[nd - 2] * 4;
  q.scales = scales.data<void>();
  q.s_row = scales.strides()[nd - 2];
  q.sdt = dtype_of(scales);
  if (biases != nullptr) {
    q.biases = biases->data<void>();
    q.b_row = biases->strides()[nd - 2];
  }
  q.rows = w.shape(nd - 2);
  q.cols = w.shape(nd - 1) * 32 / bits;
  q.bits = bits;
  q.group = group;
  q.mode = mode == 1 ? edge0k::Mode::Mxfp4 : edge0k::Mode::Affine;
  return q;
}

int mode_code(const std::string& mode) {
  if (mode == "affine") return 0;
  if (mode == "mxfp4") return 1;
  throw std::invalid_argument("edge0 kernels: mode must be affine or mxfp4, got " + mode);
}

void check_quant(const mx::array& w, const mx::array& scales,
                 const std::optional<mx::array>& biases, int group, int bits, int mode,
                 int stack_dims) {
  const int nd = stack_dims + 2;
  if (w.ndim() != size_t(nd) || scales.ndim() != size_t(nd))
    throw std::invalid_argument("edge0 kernels: weight and scales must have " +
                                std::to_string(nd) + " dimensions");
  if (w.dtype() != mx::uint32) throw std::invalid_argument("edge0 kernels: weight must be uint32");
  if (mode == 0 && bits != 4 && bits != 8)
    throw std::invalid_argument("edge0 kernels: affine bits must be 4 or 8");
  if (mode == 1 && (bits != 4 || group != 32 || scales.dtype() != mx::uint8 || biases))
    throw std::invalid_argument("edge0 kernels: mxfp4 needs bits 4, group 32, uint8 scales, no biases");
  if (mode == 0 && (!biases || scales.dtype() == mx::uint8))
    throw std::invalid_argument("edge0 kernels: affine needs float scales and biases");
  if (group != 32 && group != 64 && group != 128)
    throw std::invalid_argument("edge0 kernels: group size must be 32, 64 or 128");
  const int cols = w.shape(-1) * 32 / bits;
  if (cols % group != 0 || scales.shape(-1) != cols / group || scales.shape(-2) != w.shape(-2))
    throw std::invalid_argument("edge0 kernels: scales do not match the weight's shape");
  if (biases && biases->shape() != scales.shape())
    throw std::invalid_argument("edge0 kernels: biases do not match the scales' shape");
  if (biases && biases->dtype() != scales.dtype())
    throw std::invalid_argument("edge0 kernels: biases and scales differ in dtype");
}

// A one-output primitive that runs on the CPU stream only (the Python face never builds
// one for a GPU stream).
class CpuPrimitive : public mx::UnaryPrimitive {
 public:
  using mx::UnaryPrimitive::UnaryPrimitive;
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("edge0 kernels run on the CPU stream only");
  }
};

class QuantMatmul : public CpuPrimitive {
 public:
  QuantMatmul(mx::Stream s, int group, int bits, int mode)
      : CpuPrimitive(s), group_(group), bits_(bits), mode_(mode) {}

  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (auto& a : in) enc.set_input_array(a);
    enc.set_output_array(out);
    const bool has_b = in.size() > 3;
    enc.dispatch([x = mx::array::unsafe_weak_copy(in[0]), w = mx::array::unsafe_weak_copy(in[1]),
                  sc = mx::array::unsafe_weak_copy(in[2]),
                  b = has_b ? std::optional<mx::array>(mx::array::unsafe_weak_copy(in[3]))
                            : std::nullopt,
                  o = mx::array::unsafe_weak_copy(out), g = group_, bits = bits_, mode = mode_]() {
      const Dense xd = dense(x);
      const edge0k::QMat q = matrix(w, sc, b ? &*b : nullptr, g, bits, mode);
      const int M = static_cast<int>(x.size() / x.shape(-1));
      edge0k::qmm(*g_kernels, g_settings, q, reinterpret_cast<const float*>(xd.ptr), M,
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

struct ProjMeta {
  int bits, group, mode;
  bool biases, bias;
};

class ExpertFFN : public CpuPrimitive {
 public:
  ExpertFFN(mx::Stream s, std::vector<ProjMeta> meta, edge0k::Act act, float alpha, float limit)
      : CpuPrimitive(s), meta_(std::move(meta)), act_(act), alpha_(alpha), limit_(limit) {}

  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    std::vector<mx::array> args;
    for (auto& a : in) {
      enc.set_input_array(a);
      args.push_back(mx::array::unsafe_weak_copy(a));
    }
    enc.set_output_array(out);
    enc.dispatch([args = std::move(args), o = mx::array::unsafe_weak_copy(out), meta = meta_,
                  act = act_, alpha = alpha_, limit = limit_]() {
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
      const int n = static_cast<int>(args[1].size());
      edge0k::expert_ffn(*g_kernels, g_settings, st[0], st[1], st[2],
                         reinterpret_cast<const float*>(xd.ptr),
                         reinterpret_cast<const uint32_t*>(id.ptr), n, act, alpha, limit,
                         const_cast<float*>(o.data<float>()));
    });
  }

  // Gradients to x only (training through frozen experts): the same FFN built from
  // MLX's own ops, differentiated by MLX.
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
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
  mx::array reference(const mx::array& x, const std::vector<mx::array>& primals) const {
    const mx::array& idx = primals[1];
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

mx::array expert_ffn(const mx::array& x, const mx::array& idx,
                     const std::vector<std::optional<mx::array>>& projections,
                     const std::vector<int>& meta, const std::string& activation, float alpha,
                     float limit, mx::StreamOrDevice s) {
  if (projections.size() != 12 || meta.size() != 9)
    throw std::invalid_argument("edge0 expert_ffn: 3 projections of (weight, scales, biases, bias)");
  if (x.dtype() != mx::float32 || x.ndim() != 2)
    throw std::invalid_argument("edge0 expert_ffn: x must be float32 (N, d)");
  if (idx.dtype() != mx::uint32 || idx.ndim() != 1 || idx.shape(0) != x.shape(0))
    throw std::invalid_argument("edge0 expert_ffn: idx must be uint32 (N,)");
  edge0k::Act act;
  if (activation == "swiglu") {
    act = edge0k::Act::SwiGLU;
  } else if (activation == "swiglu_oai") {
    act = edge0k::Act::SwiGLU_OAI;
  } else {
    throw std::invalid_argument("edge0 expert_ffn: activation must be swiglu or swiglu_oai");
  }
  std::vector<mx::array> inputs{x, idx};
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
  return mx::array({x.shape(0), dims[2][0]}, mx::float32,
                   std::make_shared<ExpertFFN>(mx::to_stream(s), std::move(pm), act, alpha, limit),
                   std::move(inputs));
}

std::string isa() { return g_kernels->name; }

bool use_isa(const std::string& name) {
  const edge0k::Kernels* k = edge0k::select_kernels(name.c_str());
  if (k == nullptr) return false;
  g_kernels = k;
  return true;
}

int threads() { return g_settings.threads; }

void set_threads(int n) {
  g_settings.threads = n < 1 ? 1 : n;
  edge0k::Pool::get().set_threads(g_settings.threads);
}

}  // namespace edge0

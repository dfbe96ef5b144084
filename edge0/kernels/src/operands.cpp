// The chosen row kernel and settings, the reading and checking of quantized operands, and
// dropping arrays from the caches (the first-use timings read their weights from memory).
#include "operands.h"

#include <stdexcept>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

#include "pool.h"
#include "primitives.h"

namespace edge0 {

namespace {

// the row kernel of each mode (edge0k::Mode: affine, MXFP4): every unit computes both, and
// the fastest unit for one need not be the fastest for the other (edge0/kernels/isa.py)
const edge0k::Kernels* g_kernels[2] = {edge0k::select_kernels(nullptr),
                                       edge0k::select_kernels(nullptr)};
edge0k::Settings g_settings;

int kind_index(const std::string& kind) {  // -1: both
  if (kind.empty()) return -1;
  if (kind == "affine") return 0;
  if (kind == "mxfp4") return 1;
  throw std::invalid_argument("edge0 kernels: kind must be 'affine' or 'mxfp4', not '" + kind + "'");
}

}  // namespace

const edge0k::Kernels& kernels(edge0k::Mode mode) {
  return *g_kernels[mode == edge0k::Mode::Mxfp4 ? 1 : 0];
}

edge0k::Settings& settings() { return g_settings; }

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

std::string isa(const std::string& kind) {
  const int i = kind_index(kind);
  return g_kernels[i < 0 ? 0 : i]->name;
}

bool use_isa(const std::string& name, const std::string& kind) {
  const int i = kind_index(kind);
  const edge0k::Kernels* k = edge0k::select_kernels(name.c_str());
  if (k == nullptr) return false;
  if (i != 1) g_kernels[0] = k;
  if (i != 0) g_kernels[1] = k;
  return true;
}

int threads() { return g_settings.threads; }

void set_threads(int n) {
  g_settings.threads = n < 1 ? 1 : n;
  edge0k::Pool::get().reserve(g_settings.threads);  // workers are kept: switching is cheap
}

bool has_int8_inputs() { return g_kernels[0]->rows_q8 != nullptr; }  // affine 4-bit only

bool int8_inputs() { return g_settings.int8_inputs && has_int8_inputs(); }

void set_int8_inputs(bool on) { g_settings.int8_inputs = on; }

bool evict(const std::vector<mx::array>& arrays) {
#if defined(__x86_64__) || defined(_M_X64)
  for (const auto& a : arrays) {
    if (a.data_shared_ptr() == nullptr)
      throw std::invalid_argument("edge0 evict: evaluate the arrays first");
    const auto* p = static_cast<const char*>(a.data<void>());
    for (size_t off = 0; off < a.nbytes(); off += 64) _mm_clflush(p + off);
  }
  _mm_mfence();
  return true;
#else
  (void)arrays;
  return false;
#endif
}

}  // namespace edge0

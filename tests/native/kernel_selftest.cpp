// Checks every row-kernel variant built for this target against a plain double-precision
// reference (dequantize, then dot), with no MLX involved: this is how the NEON variant
// is tested on an x86 machine (cross-compiled, run under qemu; tests/test_kernels_native.py).
// `--emulated-avx512`: the avx512 unit was compiled over an emulation of its intrinsics
// (SIMDe, on AVX2): its table runs whatever the CPU reports.
// Prints one line per variant and exits non-zero on the first mismatch.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "compute.h"
#include "pool.h"

using namespace edge0k;

namespace {

const float FP4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}

float from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// a random quantized matrix (its codes, scales and biases kept alive here) and its QMat
struct Matrix {
  std::vector<uint8_t> w, e8;
  std::vector<float> sf, bf;
  std::vector<uint16_t> s16, b16;
  QMat q;
};

Matrix random_matrix(std::mt19937& rng, int rows, int cols, int bits, int group, Mode mode,
                     DType sdt) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int G = cols / group;
  Matrix a;
  a.w.resize(size_t(rows) * cols * bits / 8);
  for (auto& b : a.w) b = uint8_t(byte(rng));
  a.sf.resize(size_t(rows) * G);
  a.bf.resize(a.sf.size());
  a.s16.resize(a.sf.size());
  a.b16.resize(a.sf.size());
  a.e8.resize(a.sf.size());
  for (size_t i = 0; i < a.sf.size(); ++i) {
    a.sf[i] = 0.01f + 0.05f * std::fabs(normal(rng));
    a.bf[i] = -8.0f * a.sf[i] + 0.01f * normal(rng);
    if (sdt == DType::BF16) {
      a.s16[i] = to_bf16(a.sf[i]);
      a.b16[i] = to_bf16(a.bf[i]);
      a.sf[i] = from_bf16(a.s16[i]);
      a.bf[i] = from_bf16(a.b16[i]);
    }
    if (mode == Mode::Mxfp4) {
      a.e8[i] = uint8_t(120 + byte(rng) % 10);
      a.sf[i] = std::ldexp(1.0f, int(a.e8[i]) - 127);
    }
  }
  QMat& q = a.q;
  q.w = a.w.data();
  q.w_row = int64_t(cols) * bits / 8;
  q.rows = rows;
  q.cols = cols;
  q.bits = bits;
  q.group = group;
  q.mode = mode;
  q.s_row = q.b_row = G;
  q.sdt = mode == Mode::Mxfp4 ? DType::U8 : sdt;
  if (mode == Mode::Mxfp4) {
    q.scales = a.e8.data();
  } else if (sdt == DType::BF16) {
    q.scales = a.s16.data();
    q.biases = a.b16.data();
  } else {
    q.scales = a.sf.data();
    q.biases = a.bf.data();
  }
  return a;
}

// one case: returns the relative error of k's qmm against the reference; with `int8`,
// x goes through the int8-input path instead and the outputs are copied to *int8
double run_case(const Kernels& k, std::mt19937& rng, int rows, int cols, int bits, int group,
                Mode mode, DType sdt, int M, int threads, std::vector<float>* int8 = nullptr) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const Matrix a = random_matrix(rng, rows, cols, bits, group, mode, sdt);
  const QMat& q = a.q;
  const int G = cols / group;
  std::vector<float> x(size_t(M) * cols), out(size_t(M) * rows);
  for (auto& v : x) v = normal(rng);
  Settings st;
  st.threads = threads;
  st.min_bytes_per_thread = 1024;
  st.int8_inputs = int8 != nullptr;
  qmm(k, st, q, x.data(), M, out.data());
  if (int8 != nullptr) *int8 = out;
  double err = 0, mag = 0;
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < rows; ++r) {
      double ref = 0;
      for (int c = 0; c < cols; ++c) {
        const int bit = c * bits;
        const int code = (a.w[size_t(r) * q.w_row + bit / 8] >> (bit % 8)) & ((1 << bits) - 1);
        const int g = c / group;
        const double val = mode == Mode::Mxfp4 ? double(FP4[code]) * a.sf[size_t(r) * G + g]
                                               : double(a.sf[size_t(r) * G + g]) * code +
                                                     a.bf[size_t(r) * G + g];
        ref += double(x[size_t(m) * cols + c]) * val;
      }
      err = std::fmax(err, std::fabs(ref - out[size_t(m) * rows + r]));
      mag = std::fmax(mag, std::fabs(ref));
    }
  return err / (mag > 0 ? mag : 1);
}

// many input rows (the GEMM, gemm_impl.h) give each row the bits it gets alone (the row
// kernel): false, and the case printed, on the first difference
bool gemm_bits_case(const Kernels& k, std::mt19937& rng, int rows, int cols, int bits, int group,
                    Mode mode, DType sdt, int M, int threads) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const Matrix a = random_matrix(rng, rows, cols, bits, group, mode, sdt);
  std::vector<float> x(size_t(M) * cols), out(size_t(M) * rows), one(rows);
  for (auto& v : x) v = normal(rng);
  Settings st;
  st.threads = threads;
  st.min_bytes_per_thread = 1024;
  qmm(k, st, a.q, x.data(), M, out.data());
  for (int m = 0; m < M; ++m) {
    qmm(k, st, a.q, x.data() + size_t(m) * cols, 1, one.data());
    if (std::memcmp(one.data(), out.data() + size_t(m) * rows, rows * sizeof(float)) != 0) {
      std::printf("%s: GEMM row %d of %d differs from the row alone (bits %d, group %d, mode %d, "
                  "rows %d, cols %d)\n", k.name, m, M, bits, group, int(mode), rows, cols);
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const bool emulated = argc > 1 && std::strcmp(argv[1], "--emulated-avx512") == 0;
  Pool::get().reserve(2);  // the cases with two threads run on a worker too
  const char* names[] = {"avx512", "avx2", "neon", "portable"};
  std::mt19937 rng(7);
  int checked = 0;
  for (const char* name : names) {
    const Kernels* k = select_kernels(name);
#if defined(__x86_64__) || defined(_M_X64)
    if (emulated && std::strcmp(name, "avx512") == 0) k = kernels_avx512();
#endif
    if (k == nullptr) continue;
    double worst = 0;
    int cases = 0;
    for (int bits : {4, 8})
      for (int group : {32, 64, 128})
        for (DType sdt : {DType::F32, DType::BF16})
          for (int M : {1, 2, 3, 4, 5, 9})
            for (int rows : {1, 7, 12}) {
              const int threads = (rows == 12 && M == 2) ? 2 : 1;
              worst = std::fmax(worst, run_case(*k, rng, rows, group * 3, bits, group,
                                                Mode::Affine, sdt, M, threads));
              ++cases;
            }
    for (int M : {1, 4, 6}) {
      worst = std::fmax(worst, run_case(*k, rng, 9, 128, 4, 32, Mode::Mxfp4, DType::U8, M, 1));
      ++cases;
    }
    // two threads over rows: each reads the one permuted copy of x
    worst = std::fmax(worst, run_case(*k, rng, 40, 128, 4, 32, Mode::Mxfp4, DType::U8, 4, 2));
    ++cases;
    // the GEMM (from 8 input rows), one and two threads
    for (int bits : {4, 8})
      for (int group : {32, 64, 128}) {
        worst = std::fmax(worst, run_case(*k, rng, 12, group * 3, bits, group, Mode::Affine,
                                          DType::BF16, 17, bits == 4 ? 2 : 1));
        ++cases;
      }
    worst = std::fmax(worst, run_case(*k, rng, 12, 128, 4, 32, Mode::Mxfp4, DType::U8, 17, 1));
    ++cases;
    std::printf("%s: %d cases, max relative error %.3g\n", name, cases, worst);
    if (!(worst <= 1e-5)) return 1;
    ++checked;
    // many input rows: the same bits as each row alone (11 weight rows: whole register
    // tiles and a rest; 13 and 20 input rows: whole tiles of 2, 3 or 4 and rests; 3 and 13
    // groups: the bias terms' tail alone, and their eight partial sums with a tail)
    int gemm_cases = 0;
    for (int bits : {4, 8})
      for (int group : {32, 64, 128})
        for (DType sdt : {DType::F32, DType::BF16})
          for (int M : {13, 20}) {
            const int threads = M == 20 ? 2 : 1;
            const int cols = group * (M == 13 ? 3 : 13);
            if (!gemm_bits_case(*k, rng, 11, cols, bits, group, Mode::Affine, sdt, M, threads))
              return 1;
            ++gemm_cases;
          }
    for (int M : {13, 20}) {
      if (!gemm_bits_case(*k, rng, 11, 256, 4, 32, Mode::Mxfp4, DType::U8, M, 1)) return 1;
      ++gemm_cases;
    }
    std::printf("%s: %d many-row cases, each row's bits as alone\n", name, gemm_cases);
    if (k->rows_q8 == nullptr) continue;
    // int8 inputs: the same bits as the portable unit's, case by case (the same seed)
    int q8_cases = 0;
    double q8_worst = 0;  // against the reference: the quantization's error, not float's
    for (Mode mode : {Mode::Affine, Mode::Mxfp4})
      for (int group : {32, 64, 128})
        for (DType sdt : {DType::F32, DType::BF16})
          for (int M : {1, 2, 3, 4, 5, 9})
            for (int cols : {group * 3, group * 5}) {  // an odd number of blocks at group 32
              if (mode == Mode::Mxfp4 && (group != 32 || sdt != DType::F32)) continue;
              std::vector<float> got, want;
              std::mt19937 r1(unsigned(1000 + q8_cases)), r2(unsigned(1000 + q8_cases));
              const int threads = M == 2 ? 2 : 1;
              q8_worst = std::fmax(
                  q8_worst, run_case(*k, r1, 12, cols, 4, group, mode, sdt, M, threads, &got));
              run_case(*select_kernels("portable"), r2, 12, cols, 4, group, mode, sdt, M, 1,
                       &want);
              if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0) {
                std::printf("%s: int8 inputs differ from portable's (mode %d, group %d, M %d, "
                            "cols %d)\n", name, int(mode), group, M, cols);
                return 1;
              }
              ++q8_cases;
            }
    std::printf("%s: %d int8-input cases, the same bits as portable, max relative error "
                "%.3g\n", name, q8_cases, q8_worst);
    if (!(q8_worst > 1e-5 && q8_worst < 0.05)) return 1;  // int8 ran, and within its bound
  }
  std::printf("variants checked: %d\n", checked);
  return checked > 0 ? 0 : 1;
}

// Two builds of one row-kernel unit, interleaved on the same matrices: CPU time per call.
//
// Built by tools/bench/row_kernel_ab.py, which compiles the unit twice (a base revision and
// the working tree) with its entry renamed to edge0_ab_base / edge0_ab_new. Arguments:
//   KIND ROWS COLS GROUP M FOOTPRINT_MIB ROUNDS STRETCH_MIB BASE_HAS_FP4_PERM INT8
// (KIND: a4, a8 or mxfp4; BASE_HAS_FP4_PERM is 1 when the base's Kernels table has
// `fp4_perm`, so that an older table is never read past its end; INT8 1 times both builds'
// int8-input path, rows_q8, with x quantized once by the working tree's inputs.cpp). Each
// build gets x in its own layout.
// Prints one JSON object: GB of quantized weights per CPU-second (this thread) for each
// build, the median and range of the per-round ratio new/base, and the largest relative
// difference between the two builds' outputs (over the largest output's magnitude).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ctime>
#include <random>
#include <vector>

#include "kernel.h"

namespace edge0k {
const Kernels* edge0_ab_base();
const Kernels* edge0_ab_new();
}  // namespace edge0k

using namespace edge0k;

namespace {

double thread_cpu() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Copy {
  std::vector<uint8_t> w, scales, biases;  // scales/biases: bf16 (affine) or e8m0 (mxfp4)
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 11) {
    std::fprintf(stderr,
                 "usage: %s KIND ROWS COLS GROUP M FOOTPRINT_MIB ROUNDS STRETCH_MIB "
                 "BASE_HAS_FP4_PERM INT8\n",
                 argv[0]);
    return 2;
  }
  const std::string kind = argv[1];
  const int rows = std::atoi(argv[2]), cols = std::atoi(argv[3]), group = std::atoi(argv[4]);
  const int M = std::atoi(argv[5]), rounds = std::atoi(argv[7]);
  const int64_t footprint = std::atoll(argv[6]) << 20;
  const int64_t stretch = std::atoll(argv[8]) << 20;
  const bool base_perm = std::atoi(argv[9]) != 0;
  const bool int8 = std::atoi(argv[10]) != 0;
  const bool fp4 = kind == "mxfp4";
  const int bits = kind == "a8" ? 8 : 4;
  if (int8 && bits != 4) {
    std::fprintf(stderr, "int8 inputs meet 4-bit matrices only (a4, mxfp4)\n");
    return 2;
  }
  const int G = cols / group;
  const int64_t w_row = int64_t(cols) * bits / 8;
  const int64_t s_bytes = int64_t(rows) * G * (fp4 ? 1 : 2);
  const int64_t per = w_row * rows + s_bytes * (fp4 ? 1 : 2);
  const int copies = int(std::max<int64_t>(1, footprint / per));

  std::mt19937 rng(7);
  std::vector<Copy> mats(copies);
  for (Copy& c : mats) {
    c.w.resize(size_t(w_row) * rows);
    for (uint8_t& b : c.w) b = uint8_t(rng());
    c.scales.resize(size_t(s_bytes));
    c.biases.resize(fp4 ? 0 : size_t(s_bytes));
    for (size_t i = 0; i < c.scales.size(); ++i)  // e8m0 near 2^-5, or bf16 in [2^-8, 2^-6)
      c.scales[i] = fp4 ? uint8_t(118 + rng() % 8) : uint8_t(i % 2 ? 0x3c : rng());
    for (size_t i = 0; i < c.biases.size(); ++i) c.biases[i] = uint8_t(i % 2 ? 0xbc : rng());
  }
  // inputs, their group sums (the same in every layout: a layout permutes within a group)
  std::vector<float> x(size_t(M) * cols), xs(size_t(M) * G);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (float& v : x) v = unit(rng);
  for (int m = 0; m < M; ++m)
    for (int g = 0; g < G; ++g) {
      float s = 0.0f;
      for (int c = 0; c < group; ++c) s += x[size_t(m) * cols + g * group + c];
      xs[size_t(m) * G + g] = s;
    }

  const Kernels* ks[2] = {edge0_ab_base(), edge0_ab_new()};
  if (int8 && (ks[0]->rows_q8 == nullptr || ks[1]->rows_q8 == nullptr)) {
    std::fprintf(stderr, "a build has no int8 path for %s\n", ks[1]->name);
    return 2;
  }
  // int8 x: one quantization serves both builds (kernel.h: XQ8), 32-byte aligned as the
  // extension allocates it (the kernels load it aligned)
  auto aligned = [](size_t bytes) {
    return std::unique_ptr<void, void (*)(void*)>(std::aligned_alloc(64, (bytes + 63) / 64 * 64),
                                                  std::free);
  };
  const int64_t np = q8_pairs(cols);
  auto q8 = aligned(size_t(M * np) * 64), q8s = aligned(size_t(M * np) * 8 * sizeof(float)),
       q8f = aligned(size_t(M * np) * 16 * sizeof(int16_t));
  XQ8 xq;
  if (int8) {
    quantize_inputs(x.data(), M, cols, fp4, static_cast<int8_t*>(q8.get()),
                    static_cast<float*>(q8s.get()), static_cast<int16_t*>(q8f.get()));
    xq = {static_cast<const int8_t*>(q8.get()), static_cast<const float*>(q8s.get()),
          static_cast<const int16_t*>(q8f.get()), xs.data()};
  }
  const uint8_t* perms[2] = {fp4 && base_perm ? ks[0]->fp4_perm : nullptr,
                             fp4 ? ks[1]->fp4_perm : nullptr};
  // each build's x 64-byte aligned: two heap blocks of different alignment measured up to
  // 1.25x apart at M=4 with the same code (cache-line-split loads), which is not the code's
  const size_t xbytes = (x.size() * sizeof(float) + 63) / 64 * 64;
  std::unique_ptr<float, void (*)(void*)> xp[2] = {
      {static_cast<float*>(std::aligned_alloc(64, xbytes)), std::free},
      {static_cast<float*>(std::aligned_alloc(64, xbytes)), std::free}};
  for (int v = 0; v < 2; ++v)
    lay_out_inputs(x.data(), M, cols, bits, ks[v]->lanes, perms[v], xp[v].get());
  std::vector<float> out[2] = {std::vector<float>(size_t(M) * rows),
                               std::vector<float>(size_t(M) * rows)};
  auto call = [&](int v, const Copy& c) {
    QMat q;
    q.w = c.w.data();
    q.w_row = w_row;
    q.scales = c.scales.data();
    q.s_row = G;
    q.rows = rows;
    q.cols = cols;
    q.bits = bits;
    q.group = group;
    if (fp4) {
      q.mode = Mode::Mxfp4;
      q.sdt = DType::U8;
    } else {
      q.sdt = DType::BF16;
      q.biases = c.biases.data();
      q.b_row = G;
    }
    if (int8) {
      ks[v]->rows_q8(q, xq, M, 0, rows, out[v].data(), rows);
    } else {
      ks[v]->rows(q, xp[v].get(), xs.data(), M, 0, rows, out[v].data(), rows);
    }
  };
  call(0, mats[0]);
  call(1, mats[0]);
  double diff = 0.0, mag = 0.0;  // relative to the largest output, as the kernels' tests
  for (size_t i = 0; i < out[0].size(); ++i) {
    diff = std::fmax(diff, std::fabs(double(out[0][i]) - double(out[1][i])));
    mag = std::fmax(mag, std::fabs(double(out[0][i])));
  }
  diff /= std::fmax(mag, 1e-30);

  // STRETCH_MIB of weights per timed stretch; the order of the two builds alternates by round
  const int passes = int(std::max<int64_t>(1, stretch / (per * copies)));
  std::vector<double> rate[2], ratio;
  for (int r = 0; r < rounds; ++r) {
    double sec[2];
    for (int j = 0; j < 2; ++j) {
      const int v = (j + r) % 2;
      const double t0 = thread_cpu();
      for (int p = 0; p < passes; ++p)
        for (const Copy& c : mats) call(v, c);
      sec[v] = (thread_cpu() - t0) / double(passes * copies);
      rate[v].push_back(double(per) / sec[v] / 1e9);
    }
    ratio.push_back(sec[0] / sec[1]);
  }
  std::printf(
      "{\"kind\": \"%s\", \"rows\": %d, \"cols\": %d, \"group\": %d, \"m\": %d, "
      "\"copies\": %d, \"base_gb_per_cpu_s\": %.3f, \"new_gb_per_cpu_s\": %.3f, "
      "\"ratio_median\": %.3f, \"ratio_min\": %.3f, \"ratio_max\": %.3f, "
      "\"max_rel_diff\": %.3g, \"isa\": \"%s\", \"int8\": %s}\n",
      kind.c_str(), rows, cols, group, M, copies, median(rate[0]), median(rate[1]),
      median(ratio), *std::min_element(ratio.begin(), ratio.end()),
      *std::max_element(ratio.begin(), ratio.end()), diff, ks[1]->name, int8 ? "true" : "false");
  return 0;
}

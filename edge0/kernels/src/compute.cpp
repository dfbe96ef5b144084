// The quantized matmul and the fused expert FFN, over whichever row kernel was chosen.
#include "compute.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <new>
#include <vector>

#include "pool.h"

namespace edge0k {

namespace {

int dtype_size(DType dt) {
  switch (dt) {
    case DType::F32:
      return 4;
    case DType::F16:
    case DType::BF16:
      return 2;
    case DType::U8:
      return 1;
  }
  return 4;
}

float to_float(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::BF16: {
      const uint32_t bits = uint32_t(static_cast<const uint16_t*>(p)[i]) << 16;
      float out;
      std::memcpy(&out, &bits, 4);
      return out;
    }
    case DType::F16: {
      const uint16_t h = static_cast<const uint16_t*>(p)[i];
      const uint32_t sign = uint32_t(h & 0x8000u) << 16;
      const uint32_t exp = (h >> 10) & 0x1fu;
      const uint32_t mant = h & 0x3ffu;
      if (exp == 0) {
        const float sub = float(mant) * 5.9604644775390625e-8f;
        return sign ? -sub : sub;
      }
      const uint32_t bits =
          exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp + 112u) << 23) | (mant << 13));
      float out;
      std::memcpy(&out, &bits, 4);
      return out;
    }
    case DType::U8:
      return float(static_cast<const uint8_t*>(p)[i]);
  }
  return 0.0f;
}

// Cache-line-aligned floats for the row kernel's x: its vector loads then never straddle
// two lines (the same kernel on an x that was not 64-byte aligned measured 0.80-0.88x at
// four input rows, tools/bench/row_kernel_ab.py; a row of x is a multiple of 128 bytes)
template <class T>
struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <class U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const LineAligned<U>&) const { return true; }
};
using Inputs = std::vector<float, LineAligned<float>>;

// x prepared for one matrix layout: float32 in the table's order, or int8 (XQ8) where the
// int8-input path is on, the table has it and the codes are 4-bit; the group sums for affine
struct Prepared {
  Inputs xp;
  std::vector<float> xs;
  std::vector<int8_t, LineAligned<int8_t>> q;
  std::vector<float, LineAligned<float>> scale;
  std::vector<int16_t, LineAligned<int16_t>> fix;
  bool int8 = false;
};

constexpr int GEMM_MIN_ROWS = 8;  // input rows from which a product runs as the GEMM

void prep(const Kernels& k, const Settings& st, const QMat& q, const float* x, int M,
          Prepared& p) {
  const int cols = q.cols, G = q.cols / q.group;
  p.xs.resize(size_t(M) * G);
  for (int m = 0; m < M && q.mode == Mode::Affine; ++m) {  // MXFP4 has no bias term
    const float* xm = x + int64_t(m) * cols;
    for (int g = 0; g < G; ++g) {
      float s = 0.0f;
      for (int c = 0; c < q.group; ++c) s += xm[g * q.group + c];
      p.xs[size_t(m) * G + g] = s;
    }
  }
  p.int8 = st.int8_inputs && k.rows_q8 != nullptr && q.bits == 4;
  if (p.int8) {
    const bool fp4 = q.mode == Mode::Mxfp4;
    const size_t np = size_t(M) * q8_pairs(cols);
    p.q.resize(np * 2 * Q8_BLOCK);
    p.scale.resize(np * 8);
    p.fix.resize(np * 16);
    quantize_inputs(x, M, cols, fp4, p.q.data(), p.scale.data(), p.fix.data());
    return;
  }
  p.xp.resize(size_t(M) * cols);
  lay_out_inputs(x, M, cols, q.bits, k.lanes, q.mode == Mode::Mxfp4 ? k.fp4_perm : nullptr,
                 p.xp.data());
}

// rows [r0, r1) of `q` against every prepared input row: the GEMM from GEMM_MIN_ROWS input
// rows on (each weight row decoded once, the same bits), the row kernel below
void run_rows(const Kernels& k, const QMat& q, const Prepared& p, int M, int r0, int r1,
              float* out, int64_t ldo) {
  if (p.int8) {
    const XQ8 x{p.q.data(), p.scale.data(), p.fix.data(), p.xs.data()};
    k.rows_q8(q, x, M, r0, r1, out, ldo);
  } else if (M >= GEMM_MIN_ROWS && k.gemm != nullptr) {
    thread_local Inputs scratch;  // per thread: a call split over rows runs on several
    scratch.resize(size_t(gemm_scratch(k.gemm_rows, q.cols, q.group, M)));
    k.gemm(q, p.xp.data(), p.xs.data(), M, r0, r1, out, ldo, scratch.data());
  } else {
    k.rows(q, p.xp.data(), p.xs.data(), M, r0, r1, out, ldo);
  }
}

int64_t matrix_bytes(const QMat& q) { return int64_t(q.rows) * q.cols * q.bits / 8; }

// whether a call reading `bytes` of weights for `macs` multiply-adds is worth two threads or
// more: enough bytes to stream (decode) or enough products (a prompt chunk's GEMM)
bool worth_threads(const Settings& st, int64_t bytes, int64_t macs) {
  return bytes >= st.min_bytes_per_thread * 2 || macs >= st.min_macs_per_thread * 2;
}

QMat slot_matrix(const QStack& st, uint32_t s) {
  QMat q = st.m;
  q.w += int64_t(s) * st.w_slot;
  q.scales = static_cast<const char*>(q.scales) + int64_t(s) * st.s_slot * dtype_size(q.sdt);
  if (q.biases != nullptr)
    q.biases = static_cast<const char*>(q.biases) + int64_t(s) * st.b_slot * dtype_size(q.sdt);
  return q;
}

void add_bias(const QStack& st, uint32_t s, float* y, int M, int rows) {
  if (st.bias == nullptr) return;
  const int64_t base = int64_t(s) * st.bias_slot;
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < rows; ++r) y[int64_t(m) * rows + r] += to_float(st.bias, st.bias_dt, base + r);
}

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

void activate(Act act, float alpha, float limit, const float* gate, const float* up, float* a,
              int64_t n) {
  if (act == Act::SwiGLU) {
    for (int64_t i = 0; i < n; ++i) a[i] = (gate[i] * sigmoid(gate[i])) * up[i];
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float g = std::fmin(gate[i], limit);
      const float u = std::fmax(std::fmin(up[i], limit), -limit);
      a[i] = (u + 1.0f) * (g * sigmoid(alpha * g));
    }
  }
}

struct Scratch {
  Prepared in;
  std::vector<float> x, g, u, a, y;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// every pair of slot `s` at once: from GEMM_MIN_ROWS rows each weight row is decoded once
// for all of them (a prompt chunk's rows routed to one expert)
void one_slot(const Kernels& k, const Settings& st, const QStack& gate, const QStack& up,
              const QStack& down, const float* x, const std::vector<int>& pairs, uint32_t s,
              Act act, float alpha, float limit, float* out) {
  Scratch& sc = scratch();
  const QMat gq = slot_matrix(gate, s), uq = slot_matrix(up, s), dq = slot_matrix(down, s);
  const int d = gq.cols, ff = gq.rows, dout = dq.rows;
  const int M = int(pairs.size());
  sc.x.resize(size_t(M) * d);
  for (int m = 0; m < M; ++m)
    std::memcpy(sc.x.data() + int64_t(m) * d, x + int64_t(pairs[m]) * d, sizeof(float) * d);
  sc.g.resize(size_t(M) * ff);
  sc.u.resize(size_t(M) * ff);
  sc.a.resize(size_t(M) * ff);
  prep(k, st, gq, sc.x.data(), M, sc.in);
  run_rows(k, gq, sc.in, M, 0, ff, sc.g.data(), ff);
  if (uq.bits != gq.bits || uq.group != gq.group || uq.mode != gq.mode)
    prep(k, st, uq, sc.x.data(), M, sc.in);
  run_rows(k, uq, sc.in, M, 0, ff, sc.u.data(), ff);
  add_bias(gate, s, sc.g.data(), M, ff);
  add_bias(up, s, sc.u.data(), M, ff);
  activate(act, alpha, limit, sc.g.data(), sc.u.data(), sc.a.data(), int64_t(M) * ff);
  prep(k, st, dq, sc.a.data(), M, sc.in);
  sc.y.resize(size_t(M) * dout);
  run_rows(k, dq, sc.in, M, 0, dout, sc.y.data(), dout);
  add_bias(down, s, sc.y.data(), M, dout);
  for (int m = 0; m < M; ++m)
    std::memcpy(out + int64_t(pairs[m]) * dout, sc.y.data() + int64_t(m) * dout,
                sizeof(float) * dout);
}

}  // namespace

void qmm(const Kernels& k, const Settings& st, const QMat& q, const float* x, int M, float* out) {
  Prepared& in = scratch().in;  // reused per thread: no allocation per call
  prep(k, st, q, x, M, in);
  int tasks = st.threads;
  if (!worth_threads(st, matrix_bytes(q), int64_t(q.rows) * q.cols * M) || q.rows < 8 * tasks)
    tasks = 1;
  if (tasks <= 1) {
    run_rows(k, q, in, M, 0, q.rows, out, q.rows);
    return;
  }
  // row ranges in multiples of 4 (the kernel's row block)
  const int per = ((q.rows + tasks - 1) / tasks + 3) / 4 * 4;
  Pool::get().run(
      tasks,
      [&](int t) {
        const int r0 = t * per, r1 = std::min(q.rows, r0 + per);
        if (r0 < r1) run_rows(k, q, in, M, r0, r1, out, q.rows);
      },
      tasks);
}

void expert_ffn(const Kernels& k, const Settings& st, const QStack& gate, const QStack& up,
                const QStack& down, const float* x, const uint32_t* idx, int n, Act act,
                float alpha, float limit, float* out) {
  std::map<uint32_t, std::vector<int>> by_slot;  // slot -> the pairs that use it, in order
  for (int i = 0; i < n; ++i) by_slot[idx[i]].push_back(i);
  std::vector<std::pair<uint32_t, const std::vector<int>*>> work;
  work.reserve(by_slot.size());
  for (auto& [s, pairs] : by_slot) work.emplace_back(s, &pairs);
  const int64_t per_slot =
      matrix_bytes(gate.m) + matrix_bytes(up.m) + matrix_bytes(down.m);
  const int64_t macs =
      (int64_t(gate.m.rows) * gate.m.cols * 2 + int64_t(down.m.rows) * down.m.cols) * n;
  const bool spread = st.threads > 1 && work.size() > 1 &&
                      worth_threads(st, per_slot * int64_t(work.size()), macs);
  auto task = [&](int i) {
    one_slot(k, st, gate, up, down, x, *work[i].second, work[i].first, act, alpha, limit, out);
  };
  if (!spread) {
    for (size_t i = 0; i < work.size(); ++i) task(int(i));
    return;
  }
  Pool::get().run(int(work.size()), task, st.threads);
}

}  // namespace edge0k

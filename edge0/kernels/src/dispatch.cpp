// Picks the row kernel this CPU runs: AVX-512, AVX2+FMA, NEON or portable C++.
#include <cstring>

#include "kernel.h"

namespace edge0k {

namespace {

#if defined(__x86_64__) || defined(_M_X64)
bool avx2_ok() {  // the avx2 unit's flags: -mavx2 -mfma
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// AVX-512's table with the avx2 unit's int8-input path (kernel.h: rows_q8, 256-bit
// registers) and Gated-DeltaNet rows (kernel.h: delta): every CPU that reports AVX-512F has AVX2 and FMA, and it is checked. The
// int8 path gives the same bits on every variant that has it.
const Kernels* avx512() {
  static const Kernels k = [] {
    Kernels t = *kernels_avx512();
    if (avx2_ok()) {
      t.rows_q8 = kernels_avx2()->rows_q8;
      t.delta = kernels_avx2()->delta;  // the Gated-DeltaNet rows: 8 lanes are enough
    }
    return t;
  }();
  return &k;
}
#endif

const Kernels* by_name(const char* name) {
  if (std::strcmp(name, "portable") == 0) return kernels_portable();
#if defined(__x86_64__) || defined(_M_X64)
  if (std::strcmp(name, "avx2") == 0 && avx2_ok())
    return kernels_avx2();
  if (std::strcmp(name, "avx512") == 0 && __builtin_cpu_supports("avx512f"))
    return avx512();
#endif
#if defined(__aarch64__)
  if (std::strcmp(name, "neon") == 0) return kernels_neon();
#endif
  return nullptr;
}

const Kernels* best() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return avx512();
  if (avx2_ok()) return kernels_avx2();
#endif
#if defined(__aarch64__)
  return kernels_neon();
#endif
  return kernels_portable();
}

}  // namespace

const Kernels* select_kernels(const char* force) {
  if (force != nullptr && force[0] != '\0') {
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
#endif
    return by_name(force);  // nullptr: that variant is not built or not supported here
  }
  return best();
}

}  // namespace edge0k

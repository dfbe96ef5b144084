// SIMDe's emulation of AVX-512 (on AVX2), with what its 0.8.2 release lacks and the
// avx512 kernel unit uses: included first when that unit is compiled for a CPU without
// AVX-512 (tests/test_kernels_native.py).
#pragma once

#include <simde/x86/avx512.h>

#if !defined(_mm512_cvtepu8_epi32) && !defined(SIMDE_X86_AVX512F_NATIVE)
// sixteen bytes zero-extended to sixteen 32-bit lanes: two AVX2 widenings, one per half
static inline simde__m512i edge0_emulated_cvtepu8_epi32(simde__m128i a) {
  const simde__m256i lo = simde_mm256_cvtepu8_epi32(a);
  const simde__m256i hi = simde_mm256_cvtepu8_epi32(simde_mm_srli_si128(a, 8));
  return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(lo), hi, 1);
}
#define _mm512_cvtepu8_epi32(a) edge0_emulated_cvtepu8_epi32(a)
#endif

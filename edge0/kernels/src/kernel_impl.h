// The quantized row kernel, written once over a SIMD traits type `V`.
//
// Included by each ISA translation unit inside an anonymous namespace, after that
// unit defines `V` (lanes W, a float vector `f`, zero/load/set1/fma/sum, the unpacking
// of W packed bytes, prefetch). Nothing here may use a header's inline or template
// code: every ISA unit is compiled with its own flags, and a shared inline symbol
// could be linked from the widest one.
//
// Arithmetic (as MLX's affine dequantization, w = scale * q + bias, regrouped): per
// output row and input row, sum_g scale_g * (sum_{c in g} q_c x_c) + bias_g * xsum_g,
// in float32. The order of every sum is fixed by the layout alone (not by the tile,
// the thread or the number of input rows), so a row's result never depends on M.

constexpr int64_t PREFETCH_BYTES = 8192;  // rows are ~1 KiB: run well ahead of the loads

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    const float sub = float(mant) * 5.9604644775390625e-8f;  // mant * 2^-24
    return sign ? -sub : sub;
  }
  if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float out;
  __builtin_memcpy(&out, &bits, 4);
  return out;
}

template <DType D>
inline float scalar_of(const void* p, int64_t i) {
  if constexpr (D == DType::F32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (D == DType::BF16) {
    const uint32_t bits = uint32_t(static_cast<const uint16_t*>(p)[i]) << 16;
    float out;
    __builtin_memcpy(&out, &bits, 4);
    return out;
  } else if constexpr (D == DType::F16) {
    return half_to_float(static_cast<const uint16_t*>(p)[i]);
  } else {  // an e8m0 exponent: 2^(e - 127)
    const uint32_t e = static_cast<const uint8_t*>(p)[i];
    const uint32_t bits = e == 0 ? 0x00400000u : (e == 255 ? 0x7fc00000u : e << 23);
    float out;
    __builtin_memcpy(&out, &bits, 4);
    return out;
  }
}

enum Kind { A4, A8, FP4 };

// R output rows from `r` for MT input rows: out[m * ldo + r + i]
template <Kind K, DType D, int R, int MT>
void tile(const QMat& q, const float* xp, const float* xs, int r, float* out, int64_t ldo) {
  const int64_t cols = q.cols;
  const int gs = q.group;
  const int G = q.cols / gs;
  const int gbytes = gs * (K == A8 ? 8 : 4) / 8;
  typename V::f acc[R][MT];
  float bsum[R][MT];
  const uint8_t* wp[R];
  for (int i = 0; i < R; ++i) {
    wp[i] = q.w + int64_t(r + i) * q.w_row;
    for (int m = 0; m < MT; ++m) {
      acc[i][m] = V::zero();
      bsum[i][m] = 0.0f;
    }
  }
  for (int g = 0; g < G; ++g) {
    typename V::f ga[R][MT];
    for (int i = 0; i < R; ++i)
      for (int m = 0; m < MT; ++m) ga[i][m] = V::zero();
    const int64_t e0 = int64_t(g) * gs;
    const int64_t b0 = int64_t(g) * gbytes;
    if constexpr (K == A8) {
      for (int c = 0; c < gs; c += V::W) {
        const int64_t b = b0 + c;
        for (int i = 0; i < R; ++i) {
          if ((b & 63) == 0) V::prefetch(wp[i] + b + PREFETCH_BYTES);
          const typename V::f v = V::bytes(wp[i] + b);
          for (int m = 0; m < MT; ++m)
            ga[i][m] = V::fma(v, V::load(xp + m * cols + e0 + c), ga[i][m]);
        }
      }
    } else {
      for (int c = 0; c < gs; c += 2 * V::W) {
        const int64_t b = b0 + c / 2;
        for (int i = 0; i < R; ++i) {
          if ((b & 63) == 0) V::prefetch(wp[i] + b + PREFETCH_BYTES);
          typename V::f lo, hi;
          if constexpr (K == FP4) {
            V::fp4(wp[i] + b, lo, hi);
          } else {
            V::nibbles(wp[i] + b, lo, hi);
          }
          for (int m = 0; m < MT; ++m) {
            const float* xm = xp + m * cols + e0 + c;
            ga[i][m] = V::fma(lo, V::load(xm), ga[i][m]);
            ga[i][m] = V::fma(hi, V::load(xm + V::W), ga[i][m]);
          }
        }
      }
    }
    for (int i = 0; i < R; ++i) {
      const float s = scalar_of<D>(q.scales, int64_t(r + i) * q.s_row + g);
      const typename V::f sv = V::set1(s);
      for (int m = 0; m < MT; ++m) acc[i][m] = V::fma(ga[i][m], sv, acc[i][m]);
      if constexpr (K != FP4) {
        if (q.biases != nullptr) {
          const float bb = scalar_of<D>(q.biases, int64_t(r + i) * q.b_row + g);
          for (int m = 0; m < MT; ++m) bsum[i][m] += bb * xs[m * G + g];
        }
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int m = 0; m < MT; ++m) out[m * ldo + r + i] = V::sum(acc[i][m]) + bsum[i][m];
}

// every input row of `xp` (M of them) against rows [r0, r1), four rows at a time
template <Kind K, DType D>
void rows_kind(const QMat& q, const float* xp, const float* xs, int M, int r0, int r1,
               float* out, int64_t ldo) {
  const int64_t cols = q.cols;
  const int G = q.cols / q.group;
  int r = r0;
  for (; r + 4 <= r1; r += 4) {
    for (int m0 = 0; m0 < M; m0 += 4) {
      const int mt = M - m0 < 4 ? M - m0 : 4;
      const float* x = xp + m0 * cols;
      const float* s = xs + m0 * G;
      float* o = out + m0 * ldo;
      switch (mt) {
        case 1:
          tile<K, D, 4, 1>(q, x, s, r, o, ldo);
          break;
        case 2:
          tile<K, D, 2, 2>(q, x, s, r, o, ldo);
          tile<K, D, 2, 2>(q, x, s, r + 2, o, ldo);
          break;
        case 3:
          for (int i = 0; i < 4; ++i) tile<K, D, 1, 3>(q, x, s, r + i, o, ldo);
          break;
        default:
          for (int i = 0; i < 4; ++i) tile<K, D, 1, 4>(q, x, s, r + i, o, ldo);
          break;
      }
    }
  }
  for (; r < r1; ++r) {
    for (int m = 0; m < M; ++m) tile<K, D, 1, 1>(q, xp + m * cols, xs + m * G, r, out + m * ldo, ldo);
  }
}

void rows_entry(const QMat& q, const float* xp, const float* xs, int M, int r0, int r1,
                float* out, int64_t ldo) {
  if (q.mode == Mode::Mxfp4) {
    rows_kind<FP4, DType::U8>(q, xp, xs, M, r0, r1, out, ldo);
    return;
  }
  switch (q.sdt) {  // affine: float scales and biases of one dtype
    case DType::BF16:
      if (q.bits == 8) return rows_kind<A8, DType::BF16>(q, xp, xs, M, r0, r1, out, ldo);
      return rows_kind<A4, DType::BF16>(q, xp, xs, M, r0, r1, out, ldo);
    case DType::F16:
      if (q.bits == 8) return rows_kind<A8, DType::F16>(q, xp, xs, M, r0, r1, out, ldo);
      return rows_kind<A4, DType::F16>(q, xp, xs, M, r0, r1, out, ldo);
    default:
      if (q.bits == 8) return rows_kind<A8, DType::F32>(q, xp, xs, M, r0, r1, out, ldo);
      return rows_kind<A4, DType::F32>(q, xp, xs, M, r0, r1, out, ldo);
  }
}

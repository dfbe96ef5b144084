// The quantized matrix product for many input rows, written once over the unit's `V`.
//
// Included by each ISA translation unit after kernel_impl.h (same rules: no inline or
// template code from headers). `tile` (kernel_impl.h) decodes a weight row's codes again for
// every four input rows; here each block of V::GEMM_R weight rows is decoded once, to its
// codes as float32 (unscaled, in the order `tile` meets them: each vector of W codes
// against the same W consecutive floats of the prepared x), into the caller's scratch, and
// then every input row meets it, GEMM_R weight rows x GEMM_M input rows a step.
//
// Each (weight row, input row) goes through the operations `tile` gives it, in the same
// order: per group, a lane vector of FMAs over the group's code vectors, scaled into the
// accumulator by one FMA; the lanes summed by V::sum; the bias term by bias_dots. So the
// product equals the row kernel's bit for bit, whatever the number of input rows.

// rows [r, r + R) of `q` as float codes: R x q.cols floats at `dst`, row after row
template <Kind K, int GS>
void decode_rows(const QMat& q, int r, int R, float* dst) {
  const int64_t cols = q.cols;
  for (int i = 0; i < R; ++i) {
    const uint8_t* wp = q.w + int64_t(r + i) * q.w_row;
    float* d = dst + i * cols;
    if constexpr (K == A8) {
      for (int64_t c = 0; c < cols; c += V::W) V::store(d + c, V::bytes(wp + c));
    } else if constexpr (K == FP4 && V::FP4_WIDE) {
      for (int64_t c = 0; c < cols; c += 4 * V::W) {
        typename V::f w[4];
        fp4_wide<V>(wp + c / 2, w);
        for (int j = 0; j < 4; ++j) V::store(d + c + j * V::W, w[j]);
      }
    } else {
      for (int64_t c = 0; c < cols; c += 2 * V::W) {
        typename V::f lo, hi;
        if constexpr (K == FP4) {
          fp4_narrow<V>(wp + c / 2, lo, hi);
        } else {
          V::nibbles(wp + c / 2, lo, hi);
        }
        V::store(d + c, lo);
        V::store(d + c + V::W, hi);
      }
    }
  }
}

// R decoded weight rows (`dec`, from weight row `r`) against MT input rows of `in`:
// out[m * ldo + r + i], as tile<K, D, R, MT, GS> computes it
template <Kind K, DType D, int R, int MT, int GS>
void gemm_tile(const QMat& q, const float* dec, const InF& in, int r, float* out, int64_t ldo) {
  const int64_t cols = q.cols;
  const int G = q.cols / GS;
  typename V::f acc[R][MT];
  float bsum[R][MT];
  for (int i = 0; i < R; ++i)
    for (int m = 0; m < MT; ++m) {
      acc[i][m] = V::zero();
      bsum[i][m] = 0.0f;
    }
  for (int g = 0; g < G; ++g) {
    typename V::f ga[R][MT];
    for (int i = 0; i < R; ++i)
      for (int m = 0; m < MT; ++m) ga[i][m] = V::zero();
    const int64_t e0 = int64_t(g) * GS;
    for (int c = 0; c < GS; c += V::W) {
      typename V::f w[R];
      for (int i = 0; i < R; ++i) w[i] = V::load(dec + i * cols + e0 + c);
      for (int m = 0; m < MT; ++m) {
        const typename V::f x = V::load(in.xp + m * cols + e0 + c);
        for (int i = 0; i < R; ++i) ga[i][m] = V::fma(w[i], x, ga[i][m]);
      }
    }
    for (int i = 0; i < R; ++i) {
      const typename V::f sv = V::set1(scalar_of<D>(q.scales, int64_t(r + i) * q.s_row + g));
      for (int m = 0; m < MT; ++m) acc[i][m] = V::fma(ga[i][m], sv, acc[i][m]);
    }
  }
  if constexpr (K != FP4) {
    if (q.biases != nullptr)
      for (int i = 0; i < R; ++i) bias_dots<D, MT, false>(q, r + i, in.xs, G, bsum[i]);
  }
  for (int i = 0; i < R; ++i)
    for (int m = 0; m < MT; ++m) out[m * ldo + r + i] = V::sum(acc[i][m]) + bsum[i][m];
}

// R decoded weight rows against every input row: GEMM_M at a time, then the rest
template <Kind K, DType D, int R, int GS>
void gemm_block(const QMat& q, const float* dec, const InF& in, int M, int r, float* out,
                int64_t ldo) {
  constexpr int MT = V::GEMM_M;
  int m0 = 0;
  for (; m0 + MT <= M; m0 += MT)
    gemm_tile<K, D, R, MT, GS>(q, dec, in.from(m0, q), r, out + m0 * ldo, ldo);
  for (; m0 < M; ++m0) gemm_tile<K, D, R, 1, GS>(q, dec, in.from(m0, q), r, out + m0 * ldo, ldo);
}

template <Kind K, DType D, int GS>
void gemm_gs(const QMat& q, const InF& in, int M, int r0, int r1, float* out, int64_t ldo,
             float* dec) {
  constexpr int R = V::GEMM_R;
  int r = r0;
  for (; r + R <= r1; r += R) {
    for (int i = R; i < 2 * R && r + i < r1; ++i)  // the next block's bytes, while this one runs
      for (int64_t b = 0; b < q.w_row; b += 64) V::prefetch(q.w + int64_t(r + i) * q.w_row + b);
    decode_rows<K, GS>(q, r, R, dec);
    gemm_block<K, D, R, GS>(q, dec, in, M, r, out, ldo);
  }
  for (; r < r1; ++r) {
    decode_rows<K, GS>(q, r, 1, dec);
    gemm_block<K, D, 1, GS>(q, dec, in, M, r, out, ldo);
  }
}

template <Kind K, DType D>
void gemm_kind(const QMat& q, const InF& in, int M, int r0, int r1, float* out, int64_t ldo,
               float* dec) {
  switch (q.group) {
    case 32:
      return gemm_gs<K, D, 32>(q, in, M, r0, r1, out, ldo, dec);
    case 128:
      return gemm_gs<K, D, 128>(q, in, M, r0, r1, out, ldo, dec);
    default:
      return gemm_gs<K, D, 64>(q, in, M, r0, r1, out, ldo, dec);
  }
}

template <DType D>
void gemm_affine(const QMat& q, const InF& in, int M, int r0, int r1, float* out, int64_t ldo,
                 float* dec) {
  if (q.bits == 8) return gemm_kind<A8, D>(q, in, M, r0, r1, out, ldo, dec);
  gemm_kind<A4, D>(q, in, M, r0, r1, out, ldo, dec);
}

// the table's `gemm` (kernel.h): `dec` holds V::GEMM_R x q.cols floats
void gemm_entry(const QMat& q, const float* xp, const float* xs, int M, int r0, int r1,
                float* out, int64_t ldo, float* dec) {
  const InF in{xp, xs};
  if (q.mode == Mode::Mxfp4) return gemm_gs<FP4, DType::U8, 32>(q, in, M, r0, r1, out, ldo, dec);
  switch (q.sdt) {
    case DType::BF16:
      return gemm_affine<DType::BF16>(q, in, M, r0, r1, out, ldo, dec);
    case DType::F16:
      return gemm_affine<DType::F16>(q, in, M, r0, r1, out, ldo, dec);
    default:
      return gemm_affine<DType::F32>(q, in, M, r0, r1, out, ldo, dec);
  }
}

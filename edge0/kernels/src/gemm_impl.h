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

// The bias terms of weight row `row` (affine) for input rows [0, M): bias_dots' operations
// in its order, with the input rows in the inner loop (a vector of them at a time) instead
// of one call per tile; `xst` holds x's group sums transposed (G x M)
// for input rows [0, M) of an `xst` whose rows are `ldx` apart
template <DType D>
void bias_terms(const QMat& q, int row, const float* xst, int64_t ldx, int G, int M, float* dot) {
  constexpr int B = 16;
  const int64_t bb = int64_t(row) * q.b_row;
  for (int m0 = 0; m0 < M; m0 += B) {
    const int n = M - m0 < B ? M - m0 : B;
    float part[8][B] = {};
    float tail[B] = {};
    int g = 0;
    for (; g + 8 <= G; g += 8)
      for (int j = 0; j < 8; ++j) {
        const float b = scalar_of<D>(q.biases, bb + g + j);
        const float* xs = xst + int64_t(g + j) * ldx + m0;
        for (int m = 0; m < n; ++m) part[j][m] = part[j][m] + b * xs[m];
      }
    for (int t = g; t < G; ++t) {
      const float b = scalar_of<D>(q.biases, bb + t);
      const float* xs = xst + int64_t(t) * ldx + m0;
      for (int m = 0; m < n; ++m) tail[m] = tail[m] + b * xs[m];
    }
    if (G < 8) {  // every part is +0, and so is their sum: the same bits as below
      for (int m = 0; m < n; ++m) dot[m0 + m] = 0.0f + tail[m];
      continue;
    }
    for (int m = 0; m < n; ++m) {
      const float s0 = (part[0][m] + part[4][m]) + (part[2][m] + part[6][m]);
      const float s1 = (part[1][m] + part[5][m]) + (part[3][m] + part[7][m]);
      dot[m0 + m] = (s0 + s1) + tail[m];
    }
  }
}

// R decoded weight rows (`dec`, from weight row `r`) against MT input rows of `in`:
// out[m * ldo + r + i] = the lanes' sum + bt[i * ldb + m], as tile<K, D, R, MT, GS>
// computes it (`bt`: the bias terms, from bias_terms)
template <DType D, int R, int MT, int GS>
void gemm_tile(const QMat& q, const float* dec, const float* xp, const float* bt, int64_t ldb,
               int r, float* out, int64_t ldo) {
  const int64_t cols = q.cols;
  const int G = q.cols / GS;
  typename V::f acc[R * MT];
  for (int i = 0; i < R * MT; ++i) acc[i] = V::zero();
  for (int g = 0; g < G; ++g) {
    typename V::f ga[R * MT];
    for (int i = 0; i < R * MT; ++i) ga[i] = V::zero();
    const int64_t e0 = int64_t(g) * GS;
    for (int c = 0; c < GS; c += V::W) {
      typename V::f w[R];
      for (int i = 0; i < R; ++i) w[i] = V::load(dec + i * cols + e0 + c);
      for (int m = 0; m < MT; ++m) {
        const typename V::f x = V::load(xp + m * cols + e0 + c);
        for (int i = 0; i < R; ++i) ga[i * MT + m] = V::fma(w[i], x, ga[i * MT + m]);
      }
    }
    for (int i = 0; i < R; ++i) {
      const typename V::f sv = V::set1(scalar_of<D>(q.scales, int64_t(r + i) * q.s_row + g));
      for (int m = 0; m < MT; ++m) acc[i * MT + m] = V::fma(ga[i * MT + m], sv, acc[i * MT + m]);
    }
  }
  float sum[R * MT];
  V::template sums<R * MT>(acc, sum);
  for (int i = 0; i < R; ++i)
    for (int m = 0; m < MT; ++m)
      out[m * ldo + r + i] = sum[i * MT + m] + (bt != nullptr ? bt[i * ldb + m] : 0.0f);
}

// R decoded weight rows against every input row: GEMM_M at a time, then a tile of the rest
template <DType D, int R, int GS>
void gemm_block(const QMat& q, const float* dec, const float* xp, const float* bt, int M, int r,
                float* out, int64_t ldo) {
  constexpr int MT = V::GEMM_M;
  const int64_t cols = q.cols;
  auto at = [&](int m0) { return bt != nullptr ? bt + m0 : nullptr; };
  int m0 = 0;
  for (; m0 + MT <= M; m0 += MT)
    gemm_tile<D, R, MT, GS>(q, dec, xp + m0 * cols, at(m0), M, r, out + m0 * ldo, ldo);
  if (M - m0 >= 2) {
    gemm_tile<D, R, 2, GS>(q, dec, xp + m0 * cols, at(m0), M, r, out + m0 * ldo, ldo);
    m0 += 2;
  }
  if (M - m0 == 1) gemm_tile<D, R, 1, GS>(q, dec, xp + m0 * cols, at(m0), M, r, out + m0 * ldo, ldo);
}

// `scratch` (kernel.h, gemm_scratch): GEMM_R decoded rows, their bias terms, x's group sums
// transposed. The input rows go in chunks of about 256 KiB of x, which stay in the L2
// cache while every block of weight rows meets them (each block decoded once a chunk).
template <Kind K, DType D, int GS>
void gemm_gs(const QMat& q, const InF& in, int M, int r0, int r1, float* out, int64_t ldo,
             float* scratch) {
  constexpr int R = V::GEMM_R;
  constexpr int64_t CHUNK_BYTES = 256 * 1024;
  const int G = q.cols / GS;
  const int64_t cols = q.cols;
  float* dec = scratch;
  float* bt = dec + int64_t(R) * q.cols;
  float* xst = bt + int64_t(R) * M;
  const bool biased = K != FP4 && q.biases != nullptr;
  if (biased)
    for (int m = 0; m < M; ++m)
      for (int g = 0; g < G; ++g) xst[int64_t(g) * M + m] = in.xs[int64_t(m) * G + g];
  int chunk = int(CHUNK_BYTES / (cols * 4)) / V::GEMM_M * V::GEMM_M;
  chunk = chunk < 4 * V::GEMM_M ? 4 * V::GEMM_M : chunk;
  for (int mc = 0; mc < M; mc += chunk) {
    const int mn = M - mc < chunk ? M - mc : chunk;
    const float* xp = in.xp + mc * cols;
    float* o = out + mc * ldo;
    auto block = [&](int r, int n) {
      decode_rows<K, GS>(q, r, n, dec);
      if (biased)
        for (int i = 0; i < n; ++i)
          bias_terms<D>(q, r + i, xst + mc, M, G, mn, bt + int64_t(i) * mn);
    };
    int r = r0;
    for (; r + R <= r1; r += R) {
      for (int i = R; i < 2 * R && r + i < r1; ++i)  // the next block's bytes, while this one runs
        for (int64_t b = 0; b < q.w_row; b += 64) V::prefetch(q.w + int64_t(r + i) * q.w_row + b);
      block(r, R);
      gemm_block<D, R, GS>(q, dec, xp, biased ? bt : nullptr, mn, r, o, ldo);
    }
    for (; r < r1; ++r) {
      block(r, 1);
      gemm_block<D, 1, GS>(q, dec, xp, biased ? bt : nullptr, mn, r, o, ldo);
    }
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

// the table's `gemm` (kernel.h)
void gemm_entry(const QMat& q, const float* xp, const float* xs, int M, int r0, int r1,
                float* out, int64_t ldo, float* scratch) {
  const InF in{xp, xs};
  if (q.mode == Mode::Mxfp4) return gemm_gs<FP4, DType::U8, 32>(q, in, M, r0, r1, out, ldo, scratch);
  switch (q.sdt) {
    case DType::BF16:
      return gemm_affine<DType::BF16>(q, in, M, r0, r1, out, ldo, scratch);
    case DType::F16:
      return gemm_affine<DType::F16>(q, in, M, r0, r1, out, ldo, scratch);
    default:
      return gemm_affine<DType::F32>(q, in, M, r0, r1, out, ldo, scratch);
  }
}

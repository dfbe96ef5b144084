// The quantized row kernel, written once over a SIMD traits type `V`.
//
// Included by each ISA translation unit inside an anonymous namespace, after that
// unit defines `V` (lanes W, a float vector `f`, zero/load/set1/fma/sum, the unpacking
// of W packed bytes, prefetch; FP4_WIDE when it decodes 4W FP4 codes at once with
// fp4x2; Q8 when it has the int8-input path: q8_codes/q8_fp4 decode 64 codes (_half: 32,
// the rest zero), q8_dot gives eight lanes of exact integer sums as floats, q8_halves and
// q8_mul make the lanes' scales, q8_fma rounds once; a unit with fewer than eight lanes
// also brings q8f, eight float lanes, with q8_zero, q8_set1 and q8_sum).
// Nothing here may use a header's inline or template
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

// e8m0 scale bytes as float bits: one load per group instead of two compares (measured
// 1.2x on the MXFP4 row kernel). Built at compile time: a static initializer in the
// AVX-512 unit would run, with its flags, on every CPU.
struct E8M0Bits {
  uint32_t v[256];
  constexpr E8M0Bits() : v() {
    for (uint32_t e = 0; e < 256; ++e) v[e] = e == 0 ? 0x00400000u : (e == 255 ? 0x7fc00000u : e << 23);
  }
};
constexpr E8M0Bits E8M0{};

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
    const uint32_t bits = E8M0.v[static_cast<const uint8_t*>(p)[i]];
    float out;
    __builtin_memcpy(&out, &bits, 4);
    return out;
  }
}

enum Kind { A4, A8, FP4 };

// sum_g bias_g * xsum_g of one row for MT inputs, after the row's groups instead of inside
// their loop (a scalar load, conversion and FMA per group there): eight independent
// partial sums per input, which the compiler turns into vector lanes (not inlined: it runs
// once per row, away from the group loop's registers). CENTRED, for int8 inputs, whose
// affine codes meet x as q - 8: bias_g + 8 scale_g instead of bias_g (8 * scale_g is
// exact), each product rounded once (fmaf) so that every unit gives the same bits.
template <DType D, int MT, bool CENTRED>
__attribute__((noinline)) void bias_dots(const QMat& q, int row, const float* xs, int G,
                                         float* dot) {
  const int64_t sb = int64_t(row) * q.s_row, bb = int64_t(row) * q.b_row;
  auto bias = [&](int g) {
    const float b = q.biases != nullptr ? scalar_of<D>(q.biases, bb + g) : 0.0f;
    if constexpr (CENTRED) return b + float(Q8_AFFINE_OFFSET) * scalar_of<D>(q.scales, sb + g);
    return b;
  };
  auto add = [](float acc, float b, float x) {
    if constexpr (CENTRED) return __builtin_fmaf(b, x, acc);
    return acc + b * x;
  };
  float part[MT][8] = {};
  int g = 0;
  for (; g + 8 <= G; g += 8)
    for (int j = 0; j < 8; ++j) {
      const float b = bias(g + j);
      for (int m = 0; m < MT; ++m) part[m][j] = add(part[m][j], b, xs[m * G + g + j]);
    }
  for (int m = 0; m < MT; ++m) {
    float tail = 0.0f;
    for (int t = g; t < G; ++t) tail = add(tail, bias(t), xs[m * G + t]);
    const float* p = part[m];
    dot[m] = (((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]))) + tail;
  }
}

// V::fp4x2 for the units that have it (FP4_WIDE), V::fp4 for the others: named through a
// template parameter so that each unit defines only the one it uses
template <class VV>
void fp4_wide(const uint8_t* p, typename VV::f* w) {
  VV::fp4x2(p, w);
}
template <class VV>
void fp4_narrow(const uint8_t* p, typename VV::f& lo, typename VV::f& hi) {
  VV::fp4(p, lo, hi);
}

// A tile's inputs: float32 x in the table's layout and its group sums (kernel.h), for the
// input rows from one on
struct InF {
  static constexpr bool INT8 = false;
  const float* xp;
  const float* xs;
  InF from(int m, const QMat& q) const {
    return {xp + int64_t(m) * q.cols, xs + int64_t(m) * (q.cols / q.group)};
  }
};
// ... or int8 x (XQ8)
struct InQ {
  static constexpr bool INT8 = true;
  XQ8 x;
  InQ from(int m, const QMat& q) const {
    const int64_t np = q8_pairs(q.cols);
    XQ8 y = x;
    y.q += int64_t(m) * np * 2 * Q8_BLOCK;
    y.scale += int64_t(m) * np * 8;
    y.fix += int64_t(m) * np * 16;
    y.xs += int64_t(m) * (q.cols / q.group);
    return {y};
  }
};

// R output rows from `r` for MT input rows: out[m * ldo + r + i]. The group size GS is a
// constant, so a group's loop unrolls (1.2x at group 32 and 64, measured).
template <Kind K, DType D, int R, int MT, int GS>
void tile(const QMat& q, const InF& in, int r, float* out, int64_t ldo) {
  const float* xp = in.xp;
  const float* xs = in.xs;
  const int64_t cols = q.cols;
  constexpr int gs = GS;
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
    } else if constexpr (K == FP4 && V::FP4_WIDE) {
      static_assert(gs % (4 * V::W) == 0, "a group holds whole wide FP4 steps");
      for (int c = 0; c < gs; c += 4 * V::W) {  // two chunks: the same sums, in the same order
        const int64_t b = b0 + c / 2;
        for (int i = 0; i < R; ++i) {
          if ((b & 63) == 0) V::prefetch(wp[i] + b + PREFETCH_BYTES);
          typename V::f w[4];
          fp4_wide<V>(wp[i] + b, w);
          for (int m = 0; m < MT; ++m) {
            const float* xm = xp + m * cols + e0 + c;
            for (int j = 0; j < 4; ++j) ga[i][m] = V::fma(w[j], V::load(xm + j * V::W), ga[i][m]);
          }
        }
      }
    } else {
      for (int c = 0; c < gs; c += 2 * V::W) {
        const int64_t b = b0 + c / 2;
        for (int i = 0; i < R; ++i) {
          if ((b & 63) == 0) V::prefetch(wp[i] + b + PREFETCH_BYTES);
          typename V::f lo, hi;
          if constexpr (K == FP4) {
            fp4_narrow<V>(wp[i] + b, lo, hi);
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
    }
  }
  if constexpr (K != FP4) {
    if (q.biases != nullptr)
      for (int i = 0; i < R; ++i) bias_dots<D, MT, false>(q, r + i, xs, G, bsum[i]);
  }
  for (int i = 0; i < R; ++i)
    for (int m = 0; m < MT; ++m) out[m * ldo + r + i] = V::sum(acc[i][m]) + bsum[i][m];
}

// The int8 tile's eight float lanes: V's own vector where it has eight (avx2, portable),
// else the unit's q8f (neon: two registers), summed in V::sum's eight-lane order
template <class VV>
auto lanes8_zero() {
  if constexpr (VV::W == 8) return VV::zero(); else return VV::q8_zero();
}
template <class VV>
using Lanes8 = decltype(lanes8_zero<VV>());
template <class VV>
Lanes8<VV> lanes8_set1(float a) {
  if constexpr (VV::W == 8) return VV::set1(a); else return VV::q8_set1(a);
}
template <class VV>
float lanes8_sum(Lanes8<VV> a) {
  if constexpr (VV::W == 8) return VV::sum(a); else return VV::q8_sum(a);
}

// The same from int8 inputs, 4-bit codes only (kernel.h: XQ8), a pair of blocks (32 code
// bytes) a step: eight lanes of exact integer sums (VV::q8_dot), times the weights' scale
// of each block times its x scale, accumulated in float32 (one rounding, VV::q8_fma); the
// affine bias term as above. VV is V, a template parameter only so that the units without
// Q8 never compile this.
template <Kind K, DType D, int R, int MT, int GS, class VV = V>
void tile(const QMat& q, const InQ& in, int r, float* out, int64_t ldo) {
  static_assert(K != A8, "int8 inputs meet 4-bit codes only");
  const int G = q.cols / GS, nb = q.cols / Q8_BLOCK, np = q8_pairs(q.cols);
  Lanes8<VV> acc[R][MT];
  float bsum[R][MT];
  const uint8_t* wp[R];
  for (int i = 0; i < R; ++i) {
    wp[i] = q.w + int64_t(r + i) * q.w_row;
    for (int m = 0; m < MT; ++m) {
      acc[i][m] = lanes8_zero<VV>();
      bsum[i][m] = 0.0f;
    }
  }
  auto sw_of = [&](int i, int g) { return scalar_of<D>(q.scales, int64_t(r + i) * q.s_row + g); };
  auto step = [&](int p, const Lanes8<VV>* sw) {
    const int64_t b = int64_t(p) * Q8_BLOCK;  // code bytes
    const bool whole = 2 * p + 1 < nb;
    for (int i = 0; i < R; ++i) {
      if ((b & 63) == 0) VV::prefetch(wp[i] + b + PREFETCH_BYTES);
      typename VV::q8w w;
      if constexpr (K == FP4) {
        w = whole ? VV::q8_fp4(wp[i] + b) : VV::q8_fp4_half(wp[i] + b);
      } else {
        w = whole ? VV::q8_codes(wp[i] + b) : VV::q8_codes_half(wp[i] + b);
      }
      for (int m = 0; m < MT; ++m) {
        const int64_t xp = m * int64_t(np) + p;
        const Lanes8<VV> d = VV::q8_dot(w, in.x.q + xp * 2 * Q8_BLOCK, in.x.fix + xp * 16);
        acc[i][m] = VV::q8_fma(d, VV::q8_mul(sw[i], in.x.scale + xp * 8), acc[i][m]);
      }
    }
  };
  if constexpr (GS == Q8_BLOCK) {  // a pair spans two groups (the second absent at a lone end)
    for (int p = 0; p < np; ++p) {
      Lanes8<VV> sw[R];
      for (int i = 0; i < R; ++i)
        sw[i] = VV::q8_halves(sw_of(i, 2 * p), 2 * p + 1 < nb ? sw_of(i, 2 * p + 1) : 0.0f);
      step(p, sw);
    }
  } else {  // a group holds whole pairs
    constexpr int PAIRS = GS / (2 * Q8_BLOCK);
    for (int g = 0; g < G; ++g) {
      Lanes8<VV> sw[R];
      for (int i = 0; i < R; ++i) sw[i] = lanes8_set1<VV>(sw_of(i, g));
      for (int p = g * PAIRS; p < (g + 1) * PAIRS; ++p) step(p, sw);
    }
  }
  if constexpr (K != FP4) {
    for (int i = 0; i < R; ++i) bias_dots<D, MT, true>(q, r + i, in.x.xs, G, bsum[i]);
  }
  for (int i = 0; i < R; ++i)
    for (int m = 0; m < MT; ++m) out[m * ldo + r + i] = lanes8_sum<VV>(acc[i][m]) + bsum[i][m];
}

// every input row of `in` (M of them) against rows [r0, r1), four rows at a time
template <Kind K, DType D, int GS, class In>
void rows_gs(const QMat& q, const In& in, int M, int r0, int r1, float* out, int64_t ldo) {
  int r = r0;
  for (; r + 4 <= r1; r += 4) {
    for (int m0 = 0; m0 < M; m0 += 4) {
      const int mt = M - m0 < 4 ? M - m0 : 4;
      const In x = in.from(m0, q);
      float* o = out + m0 * ldo;
      switch (mt) {
        case 1:
          tile<K, D, 4, 1, GS>(q, x, r, o, ldo);
          break;
        case 2:
          tile<K, D, 2, 2, GS>(q, x, r, o, ldo);
          tile<K, D, 2, 2, GS>(q, x, r + 2, o, ldo);
          break;
        case 3:
          for (int i = 0; i < 4; ++i) tile<K, D, 1, 3, GS>(q, x, r + i, o, ldo);
          break;
        default:
          for (int i = 0; i < 4; ++i) tile<K, D, 1, 4, GS>(q, x, r + i, o, ldo);
          break;
      }
    }
  }
  for (; r < r1; ++r) {
    for (int m = 0; m < M; ++m) tile<K, D, 1, 1, GS>(q, in.from(m, q), r, out + m * ldo, ldo);
  }
}

// the group sizes operands.cpp admits: 32, 64, 128
template <Kind K, DType D, class In>
void rows_kind(const QMat& q, const In& in, int M, int r0, int r1, float* out, int64_t ldo) {
  switch (q.group) {
    case 32:
      return rows_gs<K, D, 32>(q, in, M, r0, r1, out, ldo);
    case 128:
      return rows_gs<K, D, 128>(q, in, M, r0, r1, out, ldo);
    default:
      return rows_gs<K, D, 64>(q, in, M, r0, r1, out, ldo);
  }
}

// an affine matrix of 4 or 8 bits (int8 inputs: 4 only)
template <DType D, class In>
void rows_affine(const QMat& q, const In& in, int M, int r0, int r1, float* out, int64_t ldo) {
  if constexpr (!In::INT8) {
    if (q.bits == 8) return rows_kind<A8, D>(q, in, M, r0, r1, out, ldo);
  }
  rows_kind<A4, D>(q, in, M, r0, r1, out, ldo);
}

// an affine matrix by its scales' dtype, or MXFP4 (always group 32)
template <class In>
void rows_any(const QMat& q, const In& in, int M, int r0, int r1, float* out, int64_t ldo) {
  if (q.mode == Mode::Mxfp4) {
    rows_gs<FP4, DType::U8, 32>(q, in, M, r0, r1, out, ldo);
    return;
  }
  switch (q.sdt) {  // affine: float scales and biases of one dtype
    case DType::BF16:
      return rows_affine<DType::BF16>(q, in, M, r0, r1, out, ldo);
    case DType::F16:
      return rows_affine<DType::F16>(q, in, M, r0, r1, out, ldo);
    default:
      return rows_affine<DType::F32>(q, in, M, r0, r1, out, ldo);
  }
}

void rows_entry(const QMat& q, const float* xp, const float* xs, int M, int r0, int r1,
                float* out, int64_t ldo) {
  rows_any(q, InF{xp, xs}, M, r0, r1, out, ldo);
}

using RowsQ8 = void (*)(const QMat&, const XQ8&, int, int, int, float*, int64_t);

template <class VV>
void rows_q8_entry(const QMat& q, const XQ8& x, int M, int r0, int r1, float* out,
                   int64_t ldo) {  // 4-bit matrices only (compute.cpp asks for no other)
  rows_any(q, InQ{x}, M, r0, r1, out, ldo);
}

// the table's rows_q8 (q8_rows<V>()): this unit's, or nullptr where V has no int8 path
template <class VV>
constexpr RowsQ8 q8_rows() {
  if constexpr (VV::Q8) {
    return &rows_q8_entry<VV>;
  } else {
    return nullptr;
  }
}

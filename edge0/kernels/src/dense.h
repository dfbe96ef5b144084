// A dense (row-contiguous) reading of an evaluated MLX array, copying only when strided.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "mlx/array.h"

namespace edge0 {

// A contiguous copy of a strided array when it is not row-contiguous (broadcasts,
// transposed views); the array's own bytes otherwise.
struct Dense {
  std::vector<uint8_t> copy;
  const uint8_t* ptr = nullptr;
};

inline Dense dense(const mlx::core::array& a) {
  Dense d;
  const size_t item = a.itemsize();
  if (a.flags().row_contiguous || a.ndim() == 0) {
    d.ptr = a.data<uint8_t>();
    return d;
  }
  d.copy.resize(a.size() * item);
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  const int nd = static_cast<int>(a.ndim());
  std::vector<int64_t> pos(nd, 0);
  const uint8_t* base = a.data<uint8_t>();
  for (size_t i = 0; i < a.size(); ++i) {
    int64_t off = 0;
    for (int k = 0; k < nd; ++k) off += pos[k] * strides[k];
    std::memcpy(d.copy.data() + i * item, base + off * int64_t(item), item);
    for (int k = nd - 1; k >= 0; --k) {
      if (++pos[k] < shape[k]) break;
      pos[k] = 0;
    }
  }
  d.ptr = d.copy.data();
  return d;
}

}  // namespace edge0

// Host-side helpers shared by the fused ops (csrc/fused_*.cpp): the 16-byte vector their
// kernels load, the aligned contiguous copy those loads need, the grid of the grid-stride
// elementwise kernels and that of the column sums.

#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cstdint>

namespace bench_fused {

// Elements of one 16-byte vector: 8 in bf16, 4 in fp32.
inline int vec_width(at::ScalarType t) { return t == at::kBFloat16 ? 8 : 4; }

// `t` contiguous and 16-byte aligned (copied only when it is not), for vector loads.
inline at::Tensor aligned_contiguous(const at::Tensor& t) {
  auto c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

// Enough blocks of 256 threads to cover nvec vectors, at most 64 per multiprocessor (the
// kernels stride over the rest).
inline unsigned grid_for(uint64_t nvec, int device) {
  const int64_t sms = at::cuda::getDeviceProperties(device)->multiProcessorCount;
  return static_cast<unsigned>(std::min<uint64_t>((nvec + 255) / 256, 64 * sms));
}

// The launch shape of a column-sum kernel over [rows, cols] (the bias+GELU backward's and the
// fused linear's): a block per 32 vectors of columns and per chunk of rows, about four
// blocks per multiprocessor in all, the rows split evenly among the chunks. Each block
// writes one fp32 partial row of its chunk.
struct ColSumGrid {
  int64_t col_tiles;
  int64_t chunks;
  int64_t rows_per_chunk;
};

inline ColSumGrid col_sum_grid(int64_t rows, int64_t cols, at::ScalarType t, int device) {
  const int64_t col_tiles = (cols / vec_width(t) + 31) / 32;
  const int64_t sms = at::cuda::getDeviceProperties(device)->multiProcessorCount;
  const int64_t chunks = std::max<int64_t>(
      1, std::min<int64_t>((rows + 7) / 8, (4 * sms + col_tiles - 1) / col_tiles));
  return {col_tiles, chunks, (rows + chunks - 1) / chunks};
}

}  // namespace bench_fused

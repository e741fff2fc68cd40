// kernels/views.hpp — non-owning views every op takes: a destination-major CSR and row-major
// matrices. A kernel knows nothing of stores or training; it takes views, sizes and a stream.
#pragma once

#include <cstdint>

// For the small helpers that host code and kernels share: host and device under nvcc, plain inline
// elsewhere.
#ifdef __CUDACC__
#define GALE_HD __host__ __device__ __forceinline__
#else
#define GALE_HD inline
#endif

namespace gale::kernels {

// Destination-major CSR: row r lists the in-neighbours (sources) of destination r.
// indptr has rows + 1 entries; indices are local source ids in [0, cols).
// weights (optional, may be null) holds one value per entry.
struct CsrView {
  int64_t rows = 0;
  int64_t cols = 0;
  const int64_t* indptr = nullptr;
  const int32_t* indices = nullptr;
  const float* weights = nullptr;

  int64_t nnz() const { return rows == 0 ? 0 : indptr[rows] - indptr[0]; }
  int64_t degree(int64_t r) const { return indptr[r + 1] - indptr[r]; }
};

// Row-major matrix of floats with a leading dimension (row stride, in elements).
struct MatrixView {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;

  float* row(int64_t r) const { return data + r * ld; }
};

struct ConstMatrixView {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;

  ConstMatrixView() = default;
  ConstMatrixView(const float* d, int64_t r, int64_t c, int64_t l) : data(d), rows(r), cols(c), ld(l) {}
  ConstMatrixView(const MatrixView& m) : data(m.data), rows(m.rows), cols(m.cols), ld(m.ld) {}  // NOLINT
  const float* row(int64_t r) const { return data + r * ld; }
};

// Whether p is 16-byte aligned, and whether rows from p, ld floats apart, all are (float4 access).
GALE_HD bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
GALE_HD bool float4_rows(const void* p, int64_t ld) { return aligned16(p) && ld % 4 == 0; }

inline MatrixView matrix(float* data, int64_t rows, int64_t cols) { return {data, rows, cols, cols}; }
inline ConstMatrixView matrix(const float* data, int64_t rows, int64_t cols) {
  return {data, rows, cols, cols};
}

}  // namespace gale::kernels

#include <tbb/parallel_for.h>

#include <cstring>

#include "kernels/error.hpp"
#include "kernels/gather.hpp"

namespace gale::kernels {

std::string gather_rows_cannot(ConstMatrixView src, int64_t n, MatrixView out) {
  if (n < 0) return "negative row count " + std::to_string(n);
  if (out.rows != n)
    return "out has " + std::to_string(out.rows) + " rows, expected one per id (" + std::to_string(n) + ")";
  if (out.cols != src.cols)
    return "out is " + std::to_string(out.cols) + " wide, src " + std::to_string(src.cols);
  if (src.cols < 0 || src.ld < src.cols || out.ld < out.cols)
    return "a leading dimension is below the width " + std::to_string(src.cols);
  if (n > 0 && src.cols > 0 && (src.data == nullptr || out.data == nullptr)) return "null matrix data";
  return "";
}

void gather_rows(ConstMatrixView src, const int64_t* ids, int64_t n, MatrixView out) {
  const std::string why = gather_rows_cannot(src, n, out);
  if (!why.empty()) throw InputError("gather_rows: " + why);
  if (n == 0 || src.cols == 0) return;
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= src.rows)
      throw InputError("gather_rows: id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                       " is out of range [0, " + std::to_string(src.rows) + ")");
  }
  const size_t row_bytes = static_cast<size_t>(src.cols) * sizeof(float);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 256), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) std::memcpy(out.row(i), src.row(ids[i]), row_bytes);
  });
}

}  // namespace gale::kernels

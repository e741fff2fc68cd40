// gather_rows (kernels/gather_cpu.cpp), the CPU reference of the row gather: exact copies at odd
// widths and padded leading dimensions, repeated ids, untouched padding, and input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/error.hpp"
#include "kernels/gather.hpp"
#include "kernels/random.hpp"

namespace gale::kernels {
namespace {

TEST(GatherRows, CopiesEachListedRowExactly) {
  for (int64_t width : {1, 3, 4, 33, 257}) {
    const int64_t rows = 97, src_ld = width + 2, out_ld = width + 1, n = 301;
    std::vector<float> src(static_cast<size_t>(rows * src_ld));
    for (size_t i = 0; i < src.size(); ++i) {
      const uint32_t bits = static_cast<uint32_t>(random_bits(5, i) >> 32);  // any pattern, NaNs too
      std::memcpy(&src[i], &bits, sizeof(float));
    }
    std::vector<int64_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int64_t>(random_below(6, static_cast<uint64_t>(i), rows));
    ids[1] = ids[0];
    std::vector<float> out(static_cast<size_t>(n * out_ld), std::numeric_limits<float>::quiet_NaN());
    gather_rows(ConstMatrixView{src.data(), rows, width, src_ld}, ids.data(), n, MatrixView{out.data(), n, width, out_ld});
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(std::memcmp(out.data() + i * out_ld, src.data() + ids[i] * src_ld, width * sizeof(float)), 0)
          << "width " << width << " row " << i;
      EXPECT_TRUE(std::isnan(out[static_cast<size_t>(i * out_ld + width)])) << "padding written, row " << i;
    }
  }
}

TEST(GatherRows, BadShapesAndIdsAreInputErrors) {
  std::vector<float> src(12), out(8);
  const int64_t ids[2] = {0, 3};
  const int64_t good[2] = {0, 2};
  const ConstMatrixView s{src.data(), 3, 4, 4};
  EXPECT_THROW(gather_rows(s, ids, 2, MatrixView{out.data(), 2, 4, 4}), InputError);   // id 3 of 3 rows
  EXPECT_THROW(gather_rows(s, good, 2, MatrixView{out.data(), 2, 3, 4}), InputError);  // width
  EXPECT_THROW(gather_rows(s, good, 2, MatrixView{out.data(), 1, 4, 4}), InputError);  // rows
  EXPECT_THROW(gather_rows(ConstMatrixView{src.data(), 3, 4, 3}, good, 2, MatrixView{out.data(), 2, 4, 4}),
               InputError);  // ld below the width
  EXPECT_NO_THROW(gather_rows(s, good, 0, MatrixView{out.data(), 0, 4, 4}));
}

}  // namespace
}  // namespace gale::kernels

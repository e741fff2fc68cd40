// csr_transpose_cuda (kernels/transpose.cu) against csr_transpose: indptr, indices and perm equal
// exactly on random graphs with empty rows, empty columns, hub rows, repeated entries (which only a
// stable sort keeps in row order), one column, many columns (more radix passes), and a row slice
// whose indptr does not start at 0. Outputs are poisoned first. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/fill.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "kernels/spmm.hpp"
#include "tests/gpu/cuda_fixture.hpp"

namespace gale::kernels {
namespace {

using cuda::DeviceBuffer;
using cuda::MemoryPool;
using cuda::Stream;

struct Graph {
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> indptr;
  std::vector<int32_t> indices;
  CsrView csr() const { return {rows, cols, indptr.data(), indices.data(), nullptr}; }
};

// Every fifth row empty, row 2 a hub of `hub` entries, the rest 1 to 20 entries drawn from the
// first 3/4 of the columns (so the last quarter of columns is empty), repeats allowed.
Graph random_graph(int64_t rows, int64_t cols, int64_t hub, uint64_t key) {
  Graph g;
  g.rows = rows;
  g.cols = cols;
  g.indptr.push_back(0);
  CounterRng rng(key);
  const uint64_t used_cols = static_cast<uint64_t>(std::max<int64_t>(1, cols * 3 / 4));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t degree = 1 + static_cast<int64_t>(rng.below(20));
    if (r % 5 == 0) degree = 0;
    if (r == 2) degree = hub;
    for (int64_t k = 0; k < degree; ++k) g.indices.push_back(static_cast<int32_t>(rng.below(used_cols)));
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  return g;
}

class CsrTransposeCudaTest : public gale::testing::CudaFixture<> {
 protected:
  // Transposes rows [first, first + rows) of g (a slice: indptr starts at g.indptr[first]).
  void check(const Graph& g, int64_t first, int64_t rows, const std::string& what) {
    const CsrView host{rows, g.cols, g.indptr.data() + first, g.indices.data(), nullptr};
    const int64_t nnz = host.nnz();
    std::vector<int64_t> indptr(static_cast<size_t>(g.cols + 1));
    std::vector<int32_t> indices(static_cast<size_t>(nnz));
    std::vector<int64_t> perm(static_cast<size_t>(nnz));
    csr_transpose(host, indptr.data(), indices.data(), perm.data());

    auto d_indptr = cuda::to_device(*pool_, g.indptr, *stream_);
    auto d_indices = cuda::to_device(*pool_, g.indices, *stream_);
    DeviceBuffer<int64_t> out_indptr(*pool_, indptr.size(), *stream_);
    DeviceBuffer<int32_t> out_indices(*pool_, indices.size(), *stream_);
    DeviceBuffer<int64_t> out_perm(*pool_, perm.size(), *stream_);
    cuda::fill<int64_t>(out_indptr.data(), out_indptr.size(), -7, *stream_);
    cuda::fill<int32_t>(out_indices.data(), out_indices.size(), -7, *stream_);
    cuda::fill<int64_t>(out_perm.data(), out_perm.size(), -7, *stream_);
    const size_t bytes = csr_transpose_cuda_workspace_bytes(rows, g.cols, nnz);
    DeviceBuffer<unsigned char> workspace(*pool_, bytes, *stream_);
    const CsrView device{rows, g.cols, d_indptr.data() + first, d_indices.data(), nullptr};
    csr_transpose_cuda(device, nnz, out_indptr.data(), out_indices.data(), out_perm.data(), workspace.data(), bytes,
                       *stream_);
    EXPECT_EQ(cuda::to_host_and_wait(out_indptr.view(), *stream_), indptr) << what;
    EXPECT_EQ(cuda::to_host_and_wait(out_indices.view(), *stream_), indices) << what;
    EXPECT_EQ(cuda::to_host_and_wait(out_perm.view(), *stream_), perm) << what;
  }
};

TEST_F(CsrTransposeCudaTest, RandomGraphsMatchTheCpuTransposeExactly) {
  const struct {
    int64_t rows, cols, hub;
  } cases[] = {{1, 1, 3}, {7, 1, 50}, {37, 53, 40}, {1001, 999, 3000}, {4099, 70001, 20000}, {20011, 3, 100000},
               {3000, (int64_t{1} << 20) + 3, 5000}};
  uint64_t key = 1;
  for (const auto& c : cases) {
    const Graph g = random_graph(c.rows, c.cols, c.hub, key++);
    check(g, 0, g.rows, std::to_string(c.rows) + " x " + std::to_string(c.cols));
  }
}

TEST_F(CsrTransposeCudaTest, RowSliceKeepsInputPositions) {
  const Graph g = random_graph(500, 300, 800, 9);
  check(g, 3, 200, "rows 3..203");
  check(g, 499, 1, "last row");
}

TEST_F(CsrTransposeCudaTest, EmptyGraphsGiveZeroIndptr) {
  Graph no_edges;
  no_edges.rows = 5;
  no_edges.cols = 9;
  no_edges.indptr.assign(6, 0);
  check(no_edges, 0, 5, "5 x 9 without entries");
  Graph no_rows;
  no_rows.cols = 4;
  no_rows.indptr = {0};
  check(no_rows, 0, 0, "0 x 4");
}

TEST_F(CsrTransposeCudaTest, ShortWorkspaceIsAnInputError) {
  const Graph g = random_graph(30, 30, 10, 3);
  auto d_indptr = cuda::to_device(*pool_, g.indptr, *stream_);
  auto d_indices = cuda::to_device(*pool_, g.indices, *stream_);
  const int64_t nnz = g.indptr.back();
  DeviceBuffer<int64_t> out_indptr(*pool_, 31, *stream_);
  DeviceBuffer<int32_t> out_indices(*pool_, static_cast<size_t>(nnz), *stream_);
  DeviceBuffer<int64_t> out_perm(*pool_, static_cast<size_t>(nnz), *stream_);
  const size_t bytes = csr_transpose_cuda_workspace_bytes(30, 30, nnz);
  DeviceBuffer<unsigned char> workspace(*pool_, bytes, *stream_);
  const CsrView device{30, 30, d_indptr.data(), d_indices.data(), nullptr};
  EXPECT_THROW(csr_transpose_cuda(device, nnz, out_indptr.data(), out_indices.data(), out_perm.data(),
                                  workspace.data(), bytes - 1, *stream_),
               InputError);
  stream_->synchronize();
}

}  // namespace
}  // namespace gale::kernels

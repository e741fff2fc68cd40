// tests/common/owned_csr.hpp — a CSR that owns its arrays, for tests that build graphs by hand.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/views.hpp"

namespace gale::testing {

// Square, destination-major, unweighted: row v lists v's sources.
struct OwnedCsr {
  std::vector<int64_t> indptr;
  std::vector<int32_t> indices;
  kernels::CsrView view() const {
    const auto n = static_cast<int64_t>(indptr.size()) - 1;
    return {n, n, indptr.data(), indices.data(), nullptr};
  }
};

}  // namespace gale::testing

// tests/common/aggregation_options.hpp — the optional inputs of an aggregation test case (row and
// column scales, edge weights, a self term, a bias), enumerated so that a loop over
// [0, kCombos) covers every combination; the CPU and GPU MaxK suites share it.
#pragma once

#include <string>

namespace gale::testing {

struct AggregationOptions {
  bool row_scale = false, col_scale = false, edge_weight = false, bias = false;
  int self = 0;  // 0 none, 1 self_scale, 2 self_coefs, 3 both
  static constexpr int kCombos = 2 * 2 * 2 * 4 * 2;
  static AggregationOptions from(int combo) {
    AggregationOptions o;
    o.row_scale = combo & 1;
    o.col_scale = combo & 2;
    o.edge_weight = combo & 4;
    o.self = (combo >> 3) & 3;
    o.bias = combo & 32;
    return o;
  }
  std::string describe() const {
    return "row_scale=" + std::to_string(row_scale) + " col_scale=" + std::to_string(col_scale) +
           " weight=" + std::to_string(edge_weight) + " self=" + std::to_string(self) + " bias=" + std::to_string(bias);
  }
};

}  // namespace gale::testing

// Tensors packed in one storage (Tensor::packed_zeros): aligned, zero, found adjacent in order and
// spanned with their padding; a model's gradients packed in the order backward finishes them, so a
// data-parallel bucket of consecutive layers is one sum.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/model.hpp"
#include "engine/tensor.hpp"

namespace gale::engine {
namespace {

uintptr_t address(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data<unsigned char>()); }

TEST(PackedTensors, AlignedZeroAdjacentInOrderAndSpannedWithTheirPadding) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{3, 5}, {1, 47}, {2, 2}, {0, 4}, {64, 1}};
  std::vector<Tensor> t = Tensor::packed_zeros(shapes, DType::kF32, Device::cpu());
  ASSERT_EQ(t.size(), shapes.size());
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].rows(), shapes[i].first);
    EXPECT_EQ(t[i].cols(), shapes[i].second);
    EXPECT_EQ((address(t[i]) - address(t[0])) % Tensor::kPackAlign, 0u) << i;
    for (float v : t[i].to_vector()) EXPECT_EQ(v, 0.0f);
  }
  for (size_t i = 0; i + 1 < t.size(); ++i) {
    EXPECT_TRUE(t[i].packed_before(t[i + 1])) << i;
    EXPECT_FALSE(t[i + 1].packed_before(t[i])) << i;
  }
  EXPECT_FALSE(t[0].packed_before(t[2]));
  EXPECT_FALSE(t[0].packed_before(Tensor::zeros(1, 47)));  // another storage
  // 3 x 5 then 1 x 47: 60 bytes padded to 256, then 47 floats.
  Tensor span = t[0].packed_through(t[1]);
  EXPECT_EQ(span.numel(), 64 + 47);
  EXPECT_EQ(address(span), address(t[0]));
  // Written through the span, each view sees its own part; the padding stays between them.
  std::vector<float> all = span.to_vector();
  for (size_t k = 0; k < all.size(); ++k) span.data<float>()[k] = static_cast<float>(k);
  EXPECT_EQ(t[0].to_vector()[14], 14.0f);
  EXPECT_EQ(t[1].to_vector()[0], 64.0f);
  EXPECT_EQ(t[4].packed_through(t[4]).numel(), 64);
}

TEST(PackedTensors, AModelsGradientsArePackedLastLayerFirst) {
  for (const char* kind : {"sage", "gin", "gat"}) {
    ModelConfig c;
    c.model = kind;
    c.layers = 3;
    c.in_dim = 10;
    c.hidden = 6;
    c.out_dim = 3;
    c.heads = 2;
    c.norm = Norm::kBatch;
    Model m(c, 7);
    m.to(Device::cpu());
    std::vector<Parameter*> backward_order;
    const std::vector<std::vector<Parameter*>> by_layer = m.parameters_by_layer();
    for (size_t l = by_layer.size(); l-- > 0;)
      for (Parameter* p : by_layer[l]) backward_order.push_back(p);
    ASSERT_GT(backward_order.size(), 3u);
    for (size_t i = 0; i + 1 < backward_order.size(); ++i)
      EXPECT_TRUE(backward_order[i]->grad.packed_before(backward_order[i + 1]->grad)) << kind << " " << i;
    for (Parameter* p : backward_order) {
      EXPECT_EQ(p->grad.rows(), p->value.rows());
      EXPECT_EQ(p->grad.cols(), p->value.cols());
    }
  }
}

}  // namespace
}  // namespace gale::engine

// kernels/cuda/tc_plan.hpp — a translated graph (spmm_tc.hpp) on a device, for the tensor-core SpMM.
//
//   const SpmmTcTranslation t = spmm_tc_translate(host_csr);
//   const DeviceTcPlan plan(pool, t, stream);  // t may go once this returns
//   args.tc = plan.plan();
#pragma once

#include <vector>

#include "kernels/cuda/buffer.hpp"
#include "kernels/spmm_tc.hpp"

namespace gale::kernels::cuda {

// The translation's arrays copied into buffers from `pool` (so charged against its budget), and
// the plan that points at them. Empty arrays stay null.
class DeviceTcPlan {
 public:
  DeviceTcPlan() = default;
  DeviceTcPlan(MemoryPool& pool, const SpmmTcTranslation& t, cudaStream_t stream) {
    plan_ = t.placed([&](const std::vector<int32_t>& v) {
      buffers_.push_back(to_device(pool, v, stream));
      return static_cast<const int32_t*>(buffers_.back().data());
    });
  }
  const SpmmTcPlan& plan() const { return plan_; }

 private:
  std::vector<DeviceBuffer<int32_t>> buffers_;  // moved, never copied: the plan's pointers stay valid
  SpmmTcPlan plan_;
};

}  // namespace gale::kernels::cuda

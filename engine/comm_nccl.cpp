// The NCCL communicator of engine/comm.hpp: one rank per GPU of this process (ncclCommInitAll),
// sums on a communication stream per device, ordered after the compute stream by events.
#include <nccl.h>

#include "engine/comm.hpp"
#include "engine/comm_group.hpp"
#include "engine/device_context.hpp"
#include "kernels/error.hpp"

namespace gale::engine {

namespace {

void check_nccl(ncclResult_t r, const char* call) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw DeviceError(std::string("NCCL: ") + call + ": " + ncclGetErrorString(r));
}
#define GALE_CHECK_NCCL(call) check_nccl((call), #call)

// The workers' NCCL communicators, one per rank; destroyed with the group unless aborted.
struct Group : WorkerGroup {
  explicit Group(int n) : WorkerGroup(n), comms(static_cast<size_t>(n)) {}
  std::vector<ncclComm_t> comms;
  ~Group() {
    for (ncclComm_t c : comms)
      if (c != nullptr) ncclCommDestroy(c);
  }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Group> group, int rank, const Device& device)
      : group_(std::move(group)), rank_(rank), device_(device), stream_(device.ordinal), ready_(device.ordinal),
        done_(device.ordinal) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  void all_reduce_sum(const std::vector<Tensor*>& tensors) override {
    group_->throw_if_aborted();
    DeviceContext& ctx = DeviceContext::get(device_.ordinal);
    kernels::cuda::DeviceGuard guard(device_.ordinal);
    ready_.record(ctx.stream());  // a wait takes the event's state when enqueued: one event serves every call
    stream_.wait(ready_);
    spans_.emplace_back(kernels::cuda::Event(device_.ordinal, kernels::cuda::Event::Timing::kEnabled),
                        kernels::cuda::Event(device_.ordinal, kernels::cuda::Event::Timing::kEnabled));
    spans_.back().first.record(stream_);
    GALE_CHECK_NCCL(ncclGroupStart());
    for (Tensor* t : tensors) {
      if (t->device() != device_ || t->dtype() != DType::kF32)
        throw InternalError("NCCL all-reduce: f32 tensors on the worker's GPU only");
      GALE_CHECK_NCCL(ncclAllReduce(t->f32(), t->f32(), static_cast<size_t>(t->numel()), ncclFloat, ncclSum,
                                    group_->comms[static_cast<size_t>(rank_)], stream_));
    }
    GALE_CHECK_NCCL(ncclGroupEnd());
    spans_.back().second.record(stream_);
  }

  void wait() override {
    done_.record(stream_);
    DeviceContext::get(device_.ordinal).stream().wait(done_);
  }

  std::vector<uint64_t> all_gather(uint64_t value) override { return group_->all_gather(rank_, value); }

  double take_seconds() override {
    double ms = 0;
    for (const auto& [a, b] : spans_) ms += kernels::cuda::elapsed_ms(a, b);
    spans_.clear();
    return ms * 1e-3;
  }

  void abort(const std::string& reason) override {
    // Ends every rank's NCCL kernels, so a worker blocked on a sum its failed peer never joined
    // sees an error instead of waiting forever.
    Group& g = *group_;
    g.abort(reason, [&g] {
      for (ncclComm_t& c : g.comms) {
        if (c != nullptr) ncclCommAbort(c);
        c = nullptr;
      }
    });
  }

 private:
  std::shared_ptr<Group> group_;
  int rank_;
  Device device_;
  kernels::cuda::Stream stream_;
  kernels::cuda::Event ready_, done_;  // compute -> communication and back; one worker thread uses them
  std::vector<std::pair<kernels::cuda::Event, kernels::cuda::Event>> spans_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<Device>& devices) {
  const int n = static_cast<int>(devices.size());
  if (n < 1) throw InternalError("make_nccl_group: at least one device");
  auto group = std::make_shared<Group>(n);
  std::vector<int> ordinals;
  for (const Device& d : devices) {
    if (!d.is_cuda()) throw InternalError("make_nccl_group: " + d.name() + " is not a GPU");
    ordinals.push_back(d.ordinal);
  }
  GALE_CHECK_NCCL(ncclCommInitAll(group->comms.data(), n, ordinals.data()));
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<NcclCommunicator>(group, r, devices[static_cast<size_t>(r)]));
  return out;
}

}  // namespace gale::engine

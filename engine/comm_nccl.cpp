// The NCCL communicator of engine/comm.hpp: one rank per GPU of this process (ncclCommInitAll),
// sums on a communication stream per device, ordered after the compute stream by events.
#include <nccl.h>

#include <condition_variable>
#include <mutex>

#include "engine/comm.hpp"
#include "engine/device_context.hpp"
#include "kernels/error.hpp"

namespace gale::engine {

namespace {

void check_nccl(ncclResult_t r, const char* call) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw DeviceError(std::string("NCCL: ") + call + ": " + ncclGetErrorString(r));
}
#define GALE_CHECK_NCCL(call) check_nccl((call), #call)

struct Group {
  explicit Group(int n) : workers(n), comms(static_cast<size_t>(n)), values(static_cast<size_t>(n)) {}
  const int workers;
  std::vector<ncclComm_t> comms;
  std::mutex mutex;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::string aborted;
  std::vector<uint64_t> values;

  void barrier() {
    std::unique_lock<std::mutex> lock(mutex);
    if (!aborted.empty()) throw ResourceError(aborted);
    const uint64_t gen = generation;
    if (++arrived == workers) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen || !aborted.empty(); });
    if (generation == gen) throw ResourceError(aborted);
  }
  ~Group() {
    for (ncclComm_t c : comms)
      if (c != nullptr) ncclCommDestroy(c);
  }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Group> group, int rank, const Device& device)
      : group_(std::move(group)), rank_(rank), device_(device), stream_(device.ordinal) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->workers; }

  void all_reduce_sum(const std::vector<Tensor*>& tensors) override {
    if (!group_->aborted.empty()) throw ResourceError(group_->aborted);
    DeviceContext& ctx = DeviceContext::get(device_.ordinal);
    kernels::cuda::DeviceGuard guard(device_.ordinal);
    kernels::cuda::Event ready(device_.ordinal);
    ready.record(ctx.stream());
    stream_.wait(ready);
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
    kernels::cuda::Event done(device_.ordinal);
    done.record(stream_);
    DeviceContext::get(device_.ordinal).stream().wait(done);
  }

  std::vector<uint64_t> all_gather(uint64_t value) override {
    Group& g = *group_;
    g.values[static_cast<size_t>(rank_)] = value;
    g.barrier();
    std::vector<uint64_t> out = g.values;
    g.barrier();
    return out;
  }

  double take_seconds() override {
    double ms = 0;
    for (const auto& [a, b] : spans_) ms += kernels::cuda::elapsed_ms(a, b);
    spans_.clear();
    return ms * 1e-3;
  }

  void abort(const std::string& reason) override {
    Group& g = *group_;
    std::lock_guard<std::mutex> lock(g.mutex);
    if (!g.aborted.empty()) return;
    g.aborted = reason;
    // Ends every rank's NCCL kernels, so a worker blocked on a sum its failed peer never joined
    // sees an error instead of waiting forever.
    for (ncclComm_t& c : g.comms) {
      if (c != nullptr) ncclCommAbort(c);
      c = nullptr;
    }
    g.cv.notify_all();
  }

 private:
  std::shared_ptr<Group> group_;
  int rank_;
  Device device_;
  kernels::cuda::Stream stream_;
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

// The NCCL communicator of engine/comm.hpp: one rank per GPU (ncclCommInitAll in one process;
// ncclCommInitRank with an id MPI hands out across processes), sums on a communication stream per
// device, ordered after the compute stream by events. The watchdog of engine/processes.hpp polls
// NCCL's asynchronous errors and ends a run whose sum has waited longer than --comm-timeout.
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/comm.hpp"
#include "engine/comm_group.hpp"
#include "engine/device_context.hpp"
#include "engine/processes.hpp"
#include "kernels/error.hpp"

namespace gale::engine {

namespace {

void check_nccl(ncclResult_t r, const char* call) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw DeviceError(std::string("NCCL: ") + call + ": " + ncclGetErrorString(r));
}
#define GALE_CHECK_NCCL(call) check_nccl((call), #call)

// GALE_SUMS, for measuring what the sums cost a step (never for training: the replicas diverge):
// "skip" enqueues no NCCL call, "nowait" sums but the compute stream does not wait for them.
enum class SumsMode { kNormal, kSkip, kNoWait };
SumsMode sums_mode() {
  static const SumsMode mode = [] {
    const char* env = std::getenv("GALE_SUMS");
    if (env == nullptr) return SumsMode::kNormal;
    const std::string v(env);
    if (v == "skip") return SumsMode::kSkip;
    if (v == "nowait") return SumsMode::kNoWait;
    return SumsMode::kNormal;
  }();
  return mode;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// This process's workers' NCCL communicators, one per local rank; destroyed with the group unless
// aborted. `issued_ns[w]` is when worker w's latest sum was enqueued (0: none yet) and `sent[w]`
// the event after it: the watchdog's view of a sum that never finishes.
struct Group : WorkerGroup {
  Group(int n, Processes* procs, const std::vector<Device>& devices)
      : WorkerGroup(n, procs), comms(static_cast<size_t>(n)), issued_ns(static_cast<size_t>(n)) {
    for (const Device& d : devices) sent.emplace_back(d.ordinal);
  }
  std::vector<ncclComm_t> comms;
  std::vector<std::atomic<int64_t>> issued_ns;
  std::vector<kernels::cuda::Event> sent;
  std::mutex comms_mutex;  // abort() against the watchdog's polling
  Processes* watcher = nullptr;
  int watch_id = -1;

  // Why the run cannot go on, or "": an asynchronous NCCL error, or a sum older than `timeout_s`.
  std::string check(double timeout_s) try {
    std::lock_guard<std::mutex> lock(comms_mutex);
    for (size_t w = 0; w < comms.size(); ++w) {
      if (comms[w] == nullptr) continue;
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comms[w], &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
        return std::string("NCCL reports an error on GPU ") + std::to_string(sent[w].device()) + ": " +
               ncclGetErrorString(async) + " (a peer was lost?)";
      const int64_t issued = issued_ns[w].load();
      if (issued != 0 && static_cast<double>(now_ns() - issued) * 1e-9 > timeout_s && !sent[w].ready()) {
        char secs[32];
        std::snprintf(secs, sizeof secs, "%g", timeout_s);
        return "a gradient sum on GPU " + std::to_string(sent[w].device()) + " got no answer from the other workers within --comm-timeout " +
               secs + " s (a peer was lost or stopped answering)";
      }
    }
    return "";
  } catch (const std::exception& e) {
    return std::string("checking the gradient sums: ") + e.what();
  }

  ~Group() {
    if (watcher) watcher->unwatch(watch_id);
    for (ncclComm_t c : comms)
      if (c != nullptr) ncclCommDestroy(c);
  }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Group> group, int local, const Device& device)
      : group_(std::move(group)), local_(local), device_(device), stream_(device.ordinal, compute_priority()), ready_(device.ordinal),
        done_(device.ordinal) {}
  int rank() const override { return group_->world_rank(local_); }
  int size() const override { return group_->world_size(); }

  void all_reduce_sum(const std::vector<Tensor*>& tensors) override {
    group_->throw_if_aborted();
    DeviceContext& ctx = DeviceContext::get(device_.ordinal);
    kernels::cuda::DeviceGuard guard(device_.ordinal);
    ready_.record(ctx.stream());  // a wait takes the event's state when enqueued: one event serves every call
    stream_.wait(ready_);
    if (used_ == spans_.size())  // the events of earlier epochs are reused: no creation per step
      spans_.emplace_back(kernels::cuda::Event(device_.ordinal, kernels::cuda::Event::Timing::kEnabled),
                          kernels::cuda::Event(device_.ordinal, kernels::cuda::Event::Timing::kEnabled));
    auto& span = spans_[used_++];
    span.first.record(stream_);
    if (sums_mode() != SumsMode::kSkip) {
      GALE_CHECK_NCCL(ncclGroupStart());
      for (Tensor* t : tensors) {
        if (t->device() != device_ || t->dtype() != DType::kF32)
          throw InternalError("NCCL all-reduce: f32 tensors on the worker's GPU only");
        GALE_CHECK_NCCL(ncclAllReduce(t->f32(), t->f32(), static_cast<size_t>(t->numel()), ncclFloat, ncclSum,
                                      group_->comms[static_cast<size_t>(local_)], stream_));
      }
      GALE_CHECK_NCCL(ncclGroupEnd());
    }
    span.second.record(stream_);
    group_->sent[static_cast<size_t>(local_)].record(stream_);
    group_->issued_ns[static_cast<size_t>(local_)].store(now_ns());
  }

  void wait() override {
    done_.record(stream_);
    kernels::cuda::Stream& compute = DeviceContext::get(device_.ordinal).stream();
    if (waited_ == stalls_.size())
      stalls_.emplace_back(kernels::cuda::Event(device_.ordinal, kernels::cuda::Event::Timing::kEnabled),
                           kernels::cuda::Event(device_.ordinal, kernels::cuda::Event::Timing::kEnabled));
    auto& stall = stalls_[waited_++];
    stall.first.record(compute);  // reached when the compute stream's earlier work is done
    if (sums_mode() != SumsMode::kNoWait) compute.wait(done_);
    stall.second.record(compute);  // ... and this one when the sums are done too
  }

  std::vector<uint64_t> all_gather(const std::vector<uint64_t>& values) override {
    return group_->all_gather(local_, values);
  }

  double take_seconds() override {
    double ms = 0;
    for (size_t i = 0; i < used_; ++i) ms += kernels::cuda::elapsed_ms(spans_[i].first, spans_[i].second);
    used_ = 0;
    return ms * 1e-3;
  }

  double take_wait_seconds() override {
    double ms = 0;
    for (size_t i = 0; i < waited_; ++i) ms += kernels::cuda::elapsed_ms(stalls_[i].first, stalls_[i].second);
    waited_ = 0;
    return ms * 1e-3;
  }

  void abort(const std::string& reason) override {
    // Ends every rank's NCCL kernels, so a worker blocked on a sum its failed peer never joined
    // sees an error instead of waiting forever.
    Group& g = *group_;
    g.abort(reason, [&g] {
      std::lock_guard<std::mutex> lock(g.comms_mutex);
      for (ncclComm_t& c : g.comms) {
        if (c != nullptr) ncclCommAbort(c);
        c = nullptr;
      }
    });
  }

 private:
  std::shared_ptr<Group> group_;
  int local_;
  Device device_;
  kernels::cuda::Stream stream_;
  kernels::cuda::Event ready_, done_;  // compute -> communication and back; one worker thread uses them
  std::vector<std::pair<kernels::cuda::Event, kernels::cuda::Event>> spans_;  // each sum's, timed
  size_t used_ = 0;                                                            // this epoch's
  std::vector<std::pair<kernels::cuda::Event, kernels::cuda::Event>> stalls_;  // around each wait(), on the compute stream
  size_t waited_ = 0;                                                          // this epoch's
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<Device>& devices, Processes* procs) {
  const int n = static_cast<int>(devices.size());
  if (n < 1) throw InternalError("make_nccl_group: at least one device");
  std::vector<int> ordinals;
  for (const Device& d : devices) {
    if (!d.is_cuda()) throw InternalError("make_nccl_group: " + d.name() + " is not a GPU");
    ordinals.push_back(d.ordinal);
  }
  auto group = std::make_shared<Group>(n, procs, devices);
  if (Processes* p = group->processes()) {
    // Rank 0 makes the run's id, MPI hands it to every process; each process then joins its GPUs
    // to the run in one NCCL group call.
    ncclUniqueId id{};
    if (p->rank() == 0) GALE_CHECK_NCCL(ncclGetUniqueId(&id));
    p->broadcast(&id, sizeof id, "handing out NCCL's unique id");
    GALE_CHECK_NCCL(ncclGroupStart());
    for (int w = 0; w < n; ++w) {
      kernels::cuda::DeviceGuard guard(ordinals[static_cast<size_t>(w)]);
      GALE_CHECK_NCCL(ncclCommInitRank(&group->comms[static_cast<size_t>(w)], group->world_size(), id, group->world_rank(w)));
    }
    GALE_CHECK_NCCL(ncclGroupEnd());
  } else {
    GALE_CHECK_NCCL(ncclCommInitAll(group->comms.data(), n, ordinals.data()));
  }
  // The watchdog polls NCCL's errors and stalled sums (it holds the group only while it lives).
  if (procs != nullptr) {
    Group* g = group.get();
    const double timeout = procs->timeout();
    group->watcher = procs;
    group->watch_id = procs->watch([g, timeout] { return g->check(timeout); });
  }
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<NcclCommunicator>(group, r, devices[static_cast<size_t>(r)]));
  return out;
}

}  // namespace gale::engine

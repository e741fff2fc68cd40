#include "engine/comm.hpp"
#include "engine/comm_group.hpp"

#include <chrono>
#include <cstring>

#include "kernels/error.hpp"

namespace gale::engine {

namespace {

// What the in-process workers share: the group, and each worker's posted tensors.
struct Shared : WorkerGroup {
  Shared(int n, Processes* procs) : WorkerGroup(n, procs), posted(static_cast<size_t>(n)) {}
  std::vector<const std::vector<Tensor*>*> posted;
  std::vector<float> across;  // with several processes: the run's sums, flattened (worker 0 fills it)
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Shared> shared, int local) : shared_(std::move(shared)), local_(local) {}
  int rank() const override { return shared_->world_rank(local_); }
  int size() const override { return shared_->world_size(); }

  void all_reduce_sum(const std::vector<Tensor*>& tensors) override {
    const auto t0 = std::chrono::steady_clock::now();
    for (Tensor* t : tensors) {
      if (!t->device().is_cpu() || t->dtype() != DType::kF32)
        throw InternalError("in-process all-reduce: f32 tensors on the CPU only");
    }
    Shared& s = *shared_;
    s.posted[static_cast<size_t>(local_)] = &tensors;
    s.barrier();  // every worker's tensors are posted
    // This process's sum, flattened, added in rank order so every worker adds the same way. With
    // several processes only worker 0 needs it: it adds the processes' sums in process order into
    // `across`, which every worker then copies, so every process ends with the same bits.
    Processes* procs = s.processes();
    std::vector<float> local;
    if (procs == nullptr || local_ == 0) {
      for (size_t i = 0; i < tensors.size(); ++i) {
        const int64_t n = tensors[i]->numel();
        const size_t at = local.size();
        local.resize(at + static_cast<size_t>(n), 0.0f);
        for (int r = 0; r < s.size(); ++r) {
          const Tensor* theirs = (*s.posted[static_cast<size_t>(r)])[i];
          if (theirs->numel() != n) throw InternalError("in-process all-reduce: workers' shapes differ");
          const float* src = theirs->f32();
          for (int64_t k = 0; k < n; ++k) local[at + static_cast<size_t>(k)] += src[k];
        }
      }
    }
    if (procs != nullptr && local_ == 0) {
      const std::vector<uint8_t> all = procs->all_gather(local.data(), local.size() * sizeof(float), "a gradient sum");
      s.across.assign(local.size(), 0.0f);
      const float* theirs = reinterpret_cast<const float*>(all.data());
      for (int p = 0; p < procs->size(); ++p, theirs += local.size())
        for (size_t k = 0; k < local.size(); ++k) s.across[k] += theirs[k];
    }
    // Everyone has read everyone's tensors (and the processes' sums are in). Worker 0 refills
    // `across` only after the next call's first barrier, which everyone reaches after copying.
    s.barrier();
    const float* src = procs != nullptr ? s.across.data() : local.data();
    for (Tensor* t : tensors) {
      const size_t n = static_cast<size_t>(t->numel());
      if (n > 0) std::memcpy(t->f32(), src, n * sizeof(float));
      src += n;
    }
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void wait() override {}

  std::vector<uint64_t> all_gather(const std::vector<uint64_t>& values) override {
    return shared_->all_gather(local_, values);
  }

  double take_seconds() override {
    const double out = seconds_;
    seconds_ = 0;
    return out;
  }

  void abort(const std::string& reason) override { shared_->abort(reason, [] {}); }

 private:
  std::shared_ptr<Shared> shared_;
  int local_;
  double seconds_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int workers, Processes* procs) {
  if (workers < 1) throw InternalError("make_in_process_group: at least one worker");
  auto shared = std::make_shared<Shared>(workers, procs);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < workers; ++r) out.push_back(std::make_unique<InProcessCommunicator>(shared, r));
  return out;
}

#if !GALE_WITH_CUDA
std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<Device>&, Processes*) {
  throw DeviceError("--gpus: this build has no CUDA backend");
}
#endif

}  // namespace gale::engine

#include "engine/comm.hpp"
#include "engine/comm_group.hpp"

#include <chrono>
#include <cstring>

#include "kernels/error.hpp"

namespace gale::engine {

namespace {

// What the in-process workers share: the group, and each worker's posted tensors.
struct Shared : WorkerGroup {
  explicit Shared(int n) : WorkerGroup(n), posted(static_cast<size_t>(n)) {}
  std::vector<const std::vector<Tensor*>*> posted;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Shared> shared, int rank) : shared_(std::move(shared)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return shared_->size(); }

  void all_reduce_sum(const std::vector<Tensor*>& tensors) override {
    const auto t0 = std::chrono::steady_clock::now();
    for (Tensor* t : tensors) {
      if (!t->device().is_cpu() || t->dtype() != DType::kF32)
        throw InternalError("in-process all-reduce: f32 tensors on the CPU only");
    }
    Shared& s = *shared_;
    s.posted[static_cast<size_t>(rank_)] = &tensors;
    s.barrier();  // every worker's tensors are posted
    std::vector<std::vector<float>> sums(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const int64_t n = tensors[i]->numel();
      sums[i].assign(static_cast<size_t>(n), 0.0f);
      for (int r = 0; r < s.size(); ++r) {  // rank order: every worker adds the same way
        const Tensor* theirs = (*s.posted[static_cast<size_t>(r)])[i];
        if (theirs->numel() != n) throw InternalError("in-process all-reduce: workers' shapes differ");
        const float* src = theirs->f32();
        for (int64_t k = 0; k < n; ++k) sums[i][static_cast<size_t>(k)] += src[k];
      }
    }
    s.barrier();  // everyone has read everyone's tensors
    for (size_t i = 0; i < tensors.size(); ++i)
      if (!sums[i].empty()) std::memcpy(tensors[i]->f32(), sums[i].data(), sums[i].size() * sizeof(float));
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void wait() override {}

  std::vector<uint64_t> all_gather(uint64_t value) override { return shared_->all_gather(rank_, value); }

  double take_seconds() override {
    const double out = seconds_;
    seconds_ = 0;
    return out;
  }

  void abort(const std::string& reason) override { shared_->abort(reason, [] {}); }

 private:
  std::shared_ptr<Shared> shared_;
  int rank_;
  double seconds_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int workers) {
  if (workers < 1) throw InternalError("make_in_process_group: at least one worker");
  auto shared = std::make_shared<Shared>(workers);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < workers; ++r) out.push_back(std::make_unique<InProcessCommunicator>(shared, r));
  return out;
}

#if !GALE_WITH_CUDA
std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<Device>&) {
  throw DeviceError("--gpus: this build has no CUDA backend");
}
#endif

}  // namespace gale::engine

#include "engine/train/presample.hpp"

#include <string>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "scheduler/epoch_plan.hpp"

namespace gale::engine::train_parts {

namespace {
// Pre-sampling's keys: apart from every epoch's (TrainRun::epoch_key derives those from the seed
// with the epoch's number).
constexpr uint64_t kPresampleStream = 0x70726573616d706cULL;  // "presampl"
// Batches sampled at once: as many as the read-ahead's sampling thread takes (a GPU sampler gives
// each concurrent call a stream of its own, whose freed blocks it keeps).
constexpr int kConcurrentBatches = 8;
}  // namespace

std::vector<uint32_t> presample_reads(int64_t num_nodes, const std::vector<int64_t>& train_ids, int64_t batch_size,
                                      uint64_t seed, const SampleInputs& sample) {
  std::vector<uint32_t> reads(static_cast<size_t>(num_nodes), 0);
  if (train_ids.empty() || batch_size <= 0) return reads;
  const uint64_t key = kernels::derive_key(seed, kPresampleStream);
  const scheduler::EpochPlan plan(train_ids, batch_size, key, /*epoch=*/0);
  tbb::task_arena arena(kConcurrentBatches);
  arena.execute([&] {
    tbb::parallel_for(int64_t{0}, plan.num_batches(), [&](int64_t b) {
      const std::vector<int64_t> inputs =
          sample(plan.batch(b), plan.batch_length(b), kernels::derive_key(key, static_cast<uint64_t>(b)));
      for (int64_t id : inputs) {
        if (id < 0 || id >= num_nodes)
          throw InternalError("presample_reads: input node " + std::to_string(id) + " is not in [0, " +
                              std::to_string(num_nodes) + ")");
        __atomic_fetch_add(&reads[static_cast<size_t>(id)], 1u, __ATOMIC_RELAXED);
      }
    });
  });
  return reads;
}

}  // namespace gale::engine::train_parts

// engine/train/replicas.hpp — the run's data-parallel workers as this process holds them: per
// worker a model replica on its device, its Adam, every node's label there, its communicator
// (none with a single worker), and, for mini-batch training, where its batches come from (the GPU
// sampler and the feature tiers). The same seed gives every replica the same initial weights, and
// every step sums their gradients, so they stay identical.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/batch_features.hpp"
#include "engine/comm.hpp"
#include "engine/gpu_batches.hpp"
#include "engine/model.hpp"
#include "engine/tensor.hpp"
#include "engine/train/run.hpp"
#include "engine/worker_arena.hpp"
#include "sampler/neighbor_sampler.hpp"
#include "storage/host_features.hpp"

namespace gale::engine::train_parts {

struct Replica {
  Device dev;
  std::unique_ptr<Model> model;
  std::unique_ptr<Adam> adam;
  std::unique_ptr<GpuBatches> gpu_batches;        // mini-batch with the GPU sampler
  std::unique_ptr<BatchFeatures> batch_features;  // mini-batch on a GPU: the feature tiers
  std::unique_ptr<Communicator> comm;
  Tensor labels_all;  // every node's label on dev (the GPU path gathers a batch's from it); none for inference
  // Mini-batch: where the worker's host threads run (engine/worker_arena.hpp); none with
  // GALE_WORKER_THREADS=shared, for CPU workers unless it asks for arenas, and for a lone CPU
  // worker (it has every core to itself).
  std::unique_ptr<WorkerArena> arena;
};

class Replicas {
 public:
  // A replica per worker of this process (under the GPU budget the run leases), and with several
  // workers in the run their communicators; for mini-batch training each worker's arena.
  explicit Replicas(const TrainRun& run);

  // Host memory each GPU worker beyond the first keeps out of the disk tier's host cache.
  static constexpr uint64_t kExtraGpuHostReserve = uint64_t{512} << 20;

  // Mini-batch training: where the batches' features come from, and on GPUs each replica's GPU
  // sampler (unless --sampler cpu). On a GPU the feature tiers take what --feature-gpu-mem says or
  // half of the GPU's room (the topology a quarter, or half when the features do not all fit:
  // replicas.cpp's GpuRooms says why); beyond it, every row in pinned host memory
  // (charged to the host budget; the workers of one process share it, and on a partitioned store
  // each GPU caches its own parts' hot nodes first). The CPU, and a GPU whose features fit neither,
  // read them on the host (host_features(): in memory, or the disk tier beyond the host budget).
  // With the features on disk and --cache-rank sampled, both caches are ranked by one pre-sampled
  // epoch (engine/train/presample.hpp), drawn by the GPU sampler or else by `cpu_sampler`.
  void place_batch_sources(const TrainRun& run, const sampler::NeighborSampler& cpu_sampler);
  // The host's feature source, shared by every replica; null when every replica's feature tiers
  // serve its batches (and full-graph runs).
  storage::HostFeatures* host_features() const { return host_features_.get(); }
  // GALE_WORKER_THREADS as this run applies it (CPU workers: arenas at most), and per worker of
  // this process where its threads run ("cuda:1 (NUMA node 0): cpus 16-31 pinned"); empty
  // without arenas.
  WorkerThreads worker_threads() const { return worker_threads_; }
  std::vector<std::string> describe_worker_threads() const;

  Replica& operator[](int w) { return replicas_[static_cast<size_t>(w)]; }
  const Replica& operator[](int w) const { return replicas_[static_cast<size_t>(w)]; }
  Replica& lead() { return replicas_[0]; }
  const Replica& lead() const { return replicas_[0]; }
  int size() const { return static_cast<int>(replicas_.size()); }
  std::vector<Replica>::iterator begin() { return replicas_.begin(); }
  std::vector<Replica>::iterator end() { return replicas_.end(); }
  std::vector<Replica>::const_iterator begin() const { return replicas_.begin(); }
  std::vector<Replica>::const_iterator end() const { return replicas_.end(); }

 private:
  // Each worker's share of the host's cores and its arena (engine/worker_arena.hpp): the GPUs'
  // shares split the cores near each GPU among the run's GPUs of this host (processes on one host
  // compute the same shares and take their own), pinned unless GALE_WORKER_THREADS says arenas;
  // CPU workers, given GALE_WORKER_THREADS=arenas or pinned, split the allowed cores, unpinned.
  void place_worker_threads(const TrainRun& run);

  std::vector<Replica> replicas_;
  std::unique_ptr<storage::HostFeatures> host_features_;
  WorkerThreads worker_threads_ = WorkerThreads::kShared;
};

// The distinct input nodes, on the host, of a batch of `n` seeds sampled with `key` as r's batches
// are: by its GPU sampler when it has one, else by `cpu`. For sampling ahead of the pipeline (the
// read-ahead, pre-sampling); callable from several threads at once.
std::vector<int64_t> sample_input_nodes(const Replica& r, const sampler::NeighborSampler& cpu, const int64_t* seeds,
                                        int64_t n, uint64_t key);

// xxHash64 over a model's parameter values, in order (copied to the host).
uint64_t parameter_checksum(Model& model);

}  // namespace gale::engine::train_parts

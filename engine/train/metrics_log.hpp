// engine/train/metrics_log.hpp — the run's --metrics file: one JSON object per epoch (loss, rate,
// accuracies, the time split, and what the run's shape adds: GPU memory, batches' reuse, workers,
// feature tiers) and a last one with "final": true. Written by the lead process only, appended to
// on --resume, flushed after every line; a write that fails is a ResourceError naming the file.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "engine/train/run.hpp"
#include "engine/trainer.hpp"

namespace gale::engine::train_parts {

// What the epoch lines say about where a mini-batch's inputs came from (absent: full-graph, or
// the CPU without feature tiers).
struct FeaturePlacement {
  bool tiers = false;        // the lead replica gathers features from tiers
  bool disk = false;         // the host reads them from the disk tier (storage/host_features.hpp)
  std::string description;   // BatchFeatures::describe() or HostFeatures::describe(), and the sampler's
  // And where the workers' host threads run: GALE_WORKER_THREADS as applied, and this process's
  // workers' arenas (Replicas::describe_worker_threads; empty with "shared").
  std::string worker_threads = "shared";
  std::vector<std::string> worker_cpus;
};

class MetricsLog {
 public:
  // Opens --metrics (InputError when it cannot); nothing without one or outside the lead process.
  explicit MetricsLog(const TrainRun& run);
  void epoch(const EpochMetrics& m, const FeaturePlacement& placement);
  void final(const TrainResult& result);

 private:
  void write(const std::string& line);

  const TrainRun& run_;
  std::ofstream out_;
};

}  // namespace gale::engine::train_parts

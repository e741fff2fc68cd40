// scheduler/batch_pipeline.hpp — one tbb::parallel_pipeline per worker over an epoch's batches.
//
//   serial: next batch index -> parallel: prepare (sample, gather features) -> serial in order:
//   consume (train step)
//
// At most `prefetch` batches are in flight, so preparation of the next batches overlaps the
// current step while memory stays bounded. Batches are consumed in plan order, so a run is the
// same whatever the prefetch depth.
#pragma once

#include <tbb/parallel_pipeline.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

namespace gale::scheduler {

struct PipelineTimes {
  double prepare_s = 0;   // summed over batches (runs in parallel with consume)
  double consume_s = 0;
  double wait_s = 0;      // consume stage idle, waiting for a prepared batch
};

// prepare(int64_t b) -> Payload (called concurrently); consume(int64_t b, Payload&) (serial).
template <typename Payload, typename Prepare, typename Consume>
PipelineTimes run_batch_pipeline(int64_t num_batches, int prefetch, Prepare&& prepare, Consume&& consume) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  std::atomic<int64_t> prepare_ns{0};
  PipelineTimes times;
  int64_t next = 0;
  Clock::time_point last_consume_end = Clock::now();
  const size_t tokens = static_cast<size_t>(std::max(1, prefetch) + 1);
  tbb::parallel_pipeline(
      tokens,
      tbb::make_filter<void, int64_t>(tbb::filter_mode::serial_in_order,
                                      [&](tbb::flow_control& fc) -> int64_t {
                                        if (next >= num_batches) {
                                          fc.stop();
                                          return 0;
                                        }
                                        return next++;
                                      }) &
          tbb::make_filter<int64_t, std::shared_ptr<std::pair<int64_t, Payload>>>(
              tbb::filter_mode::parallel,
              [&](int64_t b) {
                const auto t0 = Clock::now();
                auto p = std::make_shared<std::pair<int64_t, Payload>>(b, prepare(b));
                prepare_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
                return p;
              }) &
          tbb::make_filter<std::shared_ptr<std::pair<int64_t, Payload>>, void>(
              tbb::filter_mode::serial_in_order,
              [&](std::shared_ptr<std::pair<int64_t, Payload>> p) {
                const auto t0 = Clock::now();
                times.wait_s += seconds(last_consume_end, t0);
                consume(p->first, p->second);
                last_consume_end = Clock::now();
                times.consume_s += seconds(t0, last_consume_end);
              }));
  times.prepare_s = static_cast<double>(prepare_ns.load()) * 1e-9;
  return times;
}

}  // namespace gale::scheduler

// scheduler/batch_pipeline.hpp — one tbb::parallel_pipeline per worker over an epoch's batches.
//
//   serial: next batch index -> parallel: prepare (sample, gather features; copy the batch's node
//   set) -> serial in order: match-reorder (buffer a window, release it in FastGL's greedy order)
//   -> serial in order: load (each released batch in consume order: enqueue its feature gather on
//   the IO stream, so it runs while the previous batch trains) -> serial in order: consume (train
//   step)
//
// Windows are cut in plan order (batches [k w, (k + 1) w)), and the reorder stage sees batches
// in plan order, so the order batches are consumed in depends only on the plan and the node
// sets, never on prefetch depth or thread count. Window 0 or 1 consumes in plan order.
//
// A run may start at a later batch and stop early (PipelineRange): batches before `first` are
// never prepared, and once `*stop` is non-zero no new batch is started and none is consumed, so
// the consumed batches are exactly [first, consumed_end) in plan order. Only with a window of 0 or
// 1: a larger window ignores `stop` (stopping inside a match-reorder window would leave a set of
// batches trained that no plan-order range describes), and its callers stop between epochs.
//
// Memory: the pipeline runs prefetch + 1 tokens. A token that carries a released window holds it
// until its last batch is consumed (each batch is freed as soon as it is consumed); the tokens
// behind it hold at most one batch each, in preparation or buffered for the next window. So at
// most prefetch + max(1, window) batches are alive at once. Preparing the next window overlaps
// consuming this one fully when prefetch >= window; a smaller prefetch trades overlap for memory.
#pragma once

#include <tbb/parallel_pipeline.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

#include "scheduler/match_reorder.hpp"

namespace gale::scheduler {

struct PipelineTimes {
  double prepare_s = 0;   // summed over batches (runs in parallel with consume)
  double reorder_s = 0;   // serial reorder stage: overlaps with the buffered batches, Algorithm 1
  double load_s = 0;      // serial load stage (host time; the work it enqueues runs asynchronously)
  double consume_s = 0;
  double wait_s = 0;      // consume stage idle, waiting for a prepared batch
  double first_wait_s = 0;  // of wait_s: the wait for the first batch (the pipeline filling)
  ReuseCounts reuse;      // the match's expected reuse (nodes and reuse 0 without a node-set function)
  int64_t consumed_end = 0;  // window 0 or 1: one past the last batch consumed (plan order)
};

// Batches [first, num_batches), or fewer once *stop (read between batches; may be set from a signal
// handler) is non-zero.
struct PipelineRange {
  int64_t first = 0;
  const std::atomic<int>* stop = nullptr;
};

// prepare(int64_t b) -> Payload (called concurrently); node_set(const Payload&) -> the batch's
// node ids, any range of int64_t (called concurrently, right after prepare); load(int64_t b,
// Payload&) and consume(int64_t b, Payload&) (each serial, each batch exactly once, in the same
// order: windows of `window` batches in match-reorder order; b is the batch's plan index; the
// load of a later batch may run while an earlier one is consumed).
template <typename Payload, typename Prepare, typename NodeSet, typename Load, typename Consume>
PipelineTimes run_batch_pipeline(int64_t num_batches, int prefetch, int window, Prepare&& prepare,
                                 NodeSet&& node_set, Load&& load, Consume&& consume, PipelineRange range = {}) {
  using Clock = std::chrono::steady_clock;
  using Batch = std::unique_ptr<std::pair<int64_t, Payload>>;
  struct Prepared {
    Batch batch;
    std::vector<int64_t> nodes;
  };
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  std::atomic<int64_t> prepare_ns{0};
  PipelineTimes times;
  MatchReorder<Batch> reorder(window);
  const bool stoppable = range.stop != nullptr && window <= 1;
  auto stopped = [&] { return stoppable && range.stop->load(std::memory_order_relaxed) != 0; };
  int64_t next = std::clamp<int64_t>(range.first, 0, num_batches);
  times.consumed_end = next;
  Clock::time_point last_consume_end = Clock::now();
  const size_t tokens = static_cast<size_t>(std::max(1, prefetch) + 1);
  tbb::parallel_pipeline(
      tokens,
      tbb::make_filter<void, int64_t>(tbb::filter_mode::serial_in_order,
                                      [&](tbb::flow_control& fc) -> int64_t {
                                        if (next >= num_batches || stopped()) {
                                          fc.stop();
                                          return 0;
                                        }
                                        return next++;
                                      }) &
          tbb::make_filter<int64_t, std::shared_ptr<Prepared>>(
              tbb::filter_mode::parallel,
              [&](int64_t b) {
                const auto t0 = Clock::now();
                auto p = std::make_shared<Prepared>();
                p->batch = std::make_unique<std::pair<int64_t, Payload>>(b, prepare(b));
                const auto& ids = node_set(std::as_const(p->batch->second));
                p->nodes = make_node_set(std::vector<int64_t>(std::begin(ids), std::end(ids)));
                prepare_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
                return p;
              }) &
          tbb::make_filter<std::shared_ptr<Prepared>, std::shared_ptr<std::vector<Batch>>>(
              tbb::filter_mode::serial_in_order,
              [&](std::shared_ptr<Prepared> p) {
                const auto t0 = Clock::now();
                const int64_t b = p->batch->first;
                auto released = std::make_shared<std::vector<Batch>>(
                    reorder.push(std::move(p->batch), std::move(p->nodes)));
                if (b == num_batches - 1)
                  for (Batch& rest : reorder.flush()) released->push_back(std::move(rest));
                times.reorder_s += seconds(t0, Clock::now());
                return released;
              }) &
          tbb::make_filter<std::shared_ptr<std::vector<Batch>>, std::shared_ptr<std::vector<Batch>>>(
              tbb::filter_mode::serial_in_order,
              [&](std::shared_ptr<std::vector<Batch>> released) {
                const auto t0 = Clock::now();
                for (Batch& batch : *released) load(batch->first, batch->second);
                times.load_s += seconds(t0, Clock::now());
                return released;
              }) &
          tbb::make_filter<std::shared_ptr<std::vector<Batch>>, void>(
              tbb::filter_mode::serial_in_order,
              [&](std::shared_ptr<std::vector<Batch>> released) {
                for (Batch& batch : *released) {
                  if (stopped()) {  // the rest of the run is dropped, prepared or not
                    batch.reset();
                    continue;
                  }
                  const auto t0 = Clock::now();
                  times.wait_s += seconds(last_consume_end, t0);
                  if (times.consume_s == 0) times.first_wait_s = seconds(last_consume_end, t0);
                  consume(batch->first, batch->second);
                  times.consumed_end = batch->first + 1;
                  batch.reset();   // free it now, not when the whole window is done
                  last_consume_end = Clock::now();
                  times.consume_s += seconds(t0, last_consume_end);
                }
              }));
  if (!stoppable) times.consumed_end = num_batches;
  times.prepare_s = static_cast<double>(prepare_ns.load()) * 1e-9;
  times.reuse = reorder.counts();
  return times;
}

// Without a load stage.
template <typename Payload, typename Prepare, typename NodeSet, typename Consume>
PipelineTimes run_batch_pipeline(int64_t num_batches, int prefetch, int window, Prepare&& prepare,
                                 NodeSet&& node_set, Consume&& consume) {
  return run_batch_pipeline<Payload>(
      num_batches, prefetch, window, std::forward<Prepare>(prepare), std::forward<NodeSet>(node_set),
      [](int64_t, Payload&) {}, std::forward<Consume>(consume));
}

// Without a node-set function: batches are consumed in plan order, as with window 0.
template <typename Payload, typename Prepare, typename Consume>
PipelineTimes run_batch_pipeline(int64_t num_batches, int prefetch, Prepare&& prepare, Consume&& consume) {
  return run_batch_pipeline<Payload>(
      num_batches, prefetch, /*window=*/0, std::forward<Prepare>(prepare),
      [](const Payload&) { return std::vector<int64_t>(); }, std::forward<Consume>(consume));
}

}  // namespace gale::scheduler

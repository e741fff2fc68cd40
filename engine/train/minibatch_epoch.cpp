#include "engine/train/minibatch_epoch.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include <tbb/info.h>
#include <tbb/task_arena.h>

#include "engine/devices.hpp"
#include "engine/gpu_batches.hpp"
#include "engine/graph.hpp"
#include "engine/ops.hpp"
#include "engine/train/read_ahead.hpp"
#include "engine/train/whole_graph.hpp"
#include "kernels/error.hpp"
#include "kernels/graph_norms.hpp"
#include "kernels/random.hpp"
#include "scheduler/batch_pipeline.hpp"

namespace gale::engine::train_parts {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Adds the nanoseconds of its scope to a counter (threads of the prepare stage add at once).
class ScopeTime {
 public:
  explicit ScopeTime(std::atomic<int64_t>& ns) : ns_(ns) {}
  ~ScopeTime() { ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0_).count(); }
  ScopeTime(const ScopeTime&) = delete;
  ScopeTime& operator=(const ScopeTime&) = delete;

 private:
  std::atomic<int64_t>& ns_;
  const Clock::time_point t0_ = Clock::now();
};

uint64_t double_word(double v) {
  uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

double word_double(uint64_t u) {
  double v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

struct PreparedBatch {
  // Sampled on the CPU: the blocks and their operands on the host.
  sampler::SampledBatch batch;
  std::vector<std::unique_ptr<GraphOperand>> graphs;
  // Sampled on the GPU: the blocks stay there; the load stage turns them into operands and starts
  // the feature gather on the IO stream.
  GpuBatch gpu;
  std::optional<GpuBatch::Operands> ops;
  PendingFeatures x;
  std::vector<GraphOperand> on_device;  // graphs on the training device: the model's backward reads them
  Tensor features;
  StagedRows staged;  // features on disk behind a GPU cache: the rows the cache lacks
  std::vector<int32_t> labels;
  Tensor seeds;  // GPU-sampled: the seeds on the device, once forward has built the operands
};

// What a worker's epoch adds to the epoch's metrics.
struct WorkerEpoch {
  double loss_sum = 0;  // per-seed losses, summed
  int64_t seeds = 0;
  double wall_s = 0;
  scheduler::PipelineTimes times;
  double io_s = 0, allreduce_s = 0;
  // Host seconds the steps spent enqueueing the gradient sums, and waiting for the lagged read of
  // the stop votes (worker 0's are reported: where a worker's host, not its GPU, holds it up).
  double allreduce_host_s = 0, vote_wait_s = 0;
  double sum_wait_s = 0;  // GPU time the compute stream stalled for the sums (Communicator::take_wait_seconds)
  double drain_s = 0;     // after the pipeline: the last update, the losses' read, the device's backlog
  // Host seconds the prepare stage spent reading or staging the batches' features (summed over
  // the batches prepared concurrently, like times.prepare_s, which includes them).
  double host_features_s = 0;
  double gpu_sample_s = 0;  // of prepare_s: GPU sampling, with its waits for the device
  FeatureLoadStats features;
  uint64_t checksum = 0;
  int stop = 0;  // TrainOptions::stop as this worker saw it after the epoch
  // Several workers: the pipeline ended early because the workers agreed on an interval
  // checkpoint (not a stop); the epoch goes on after it from times.consumed_end.
  bool checkpoint_break = false;
  // With several workers: every worker's record (record() below), in rank order, gathered after
  // the epoch, so rank 0 reports the whole run's counts.
  std::vector<uint64_t> everyone;

  // What a worker tells the others after an epoch, as 64-bit words (doubles by their bits).
  std::vector<uint64_t> record() const {
    return {double_word(loss_sum),
            static_cast<uint64_t>(seeds),
            double_word(wall_s),
            static_cast<uint64_t>(features.rows),
            static_cast<uint64_t>(features.previous),
            static_cast<uint64_t>(features.device),
            static_cast<uint64_t>(features.cache),
            static_cast<uint64_t>(features.host),
            static_cast<uint64_t>(features.host_to_gpu_bytes()),
            static_cast<uint64_t>(times.reuse.nodes),
            static_cast<uint64_t>(times.reuse.reused),
            static_cast<uint64_t>(times.reuse.reused_sampled_order),
            double_word(allreduce_s),
            static_cast<uint64_t>(stop),
            double_word(times.prepare_s),
            double_word(host_features_s),
            double_word(times.load_s),
            double_word(io_s),
            double_word(times.consume_s),
            double_word(times.wait_s),
            double_word(times.reorder_s),
            double_word(allreduce_host_s),
            double_word(vote_wait_s),
            double_word(gpu_sample_s),
            double_word(sum_wait_s),
            double_word(times.first_wait_s),
            double_word(drain_s)};
  }
};

// Several workers stop between steps only together, after the same step: each adds its stop
// flag, and the run's first worker whether an interval checkpoint is due, to the step's gradient
// sums ([stop, checkpoint], one more tensor in the last bucket). Every worker reads the sums
// kVoteLag steps later (the copy long done, so the host never waits for the device) and ends
// its pipeline after that step if either is not zero. The sums are the same bits everywhere,
// so every worker ends after the same step; the trainer then stops, or checkpoints and goes
// on with the epoch from there (as a resumed run would).
// GALE_VOTE_LAG overrides the lag, for measuring what the bound on the host's run-ahead costs.
int64_t vote_lag() {
  static const int64_t lag = [] {
    const char* env = std::getenv("GALE_VOTE_LAG");
    return env != nullptr && std::atoll(env) > 0 ? static_cast<int64_t>(std::atoll(env)) : int64_t{2};
  }();
  return lag;
}

// Whether a bucket's packed gradients go as one sum (Worker::flush), unless GALE_MERGE_SUMS=0 (one
// sum per tensor, in one NCCL group, as before), for measuring; read per worker, so tests can compare.
bool merge_sums() {
  const char* env = std::getenv("GALE_MERGE_SUMS");
  return env == nullptr || std::string(env) != "0";
}

// Worker::overlap_update, unless GALE_UPDATE_OVERLAP=0 (read per worker, so tests can compare).
bool update_overlap() {
  const char* env = std::getenv("GALE_UPDATE_OVERLAP");
  return env == nullptr || std::string(env) != "0";
}

// The gradient buckets' size (Worker::sum_layer): kBucketBytes, or GALE_BUCKET_BYTES.
constexpr size_t kBucketBytes = size_t{4} << 20;
size_t bucket_bytes_limit() {
  static const size_t bytes = [] {
    const char* env = std::getenv("GALE_BUCKET_BYTES");
    return env != nullptr && std::atoll(env) > 0 ? static_cast<size_t>(std::atoll(env)) : kBucketBytes;
  }();
  return bytes;
}

// Batch b's input nodes that the host will read, sampled as the pipeline's prepare samples them
// (for the read-ahead's sampling thread): all of them, or behind a GPU cache those it lacks. The
// GPU sampler builds no blocks for it and leaves out the cached rows on the GPU
// (GpuBatches::sample_input_nodes), unless GALE_READ_AHEAD_INPUTS_ONLY=0 (for measuring).
bool read_ahead_inputs_only() {
  static const bool on = [] {
    const char* env = std::getenv("GALE_READ_AHEAD_INPUTS_ONLY");
    return env == nullptr || std::string(env) != "0";
  }();
  return on;
}
std::vector<int64_t> read_ahead_inputs(const Replica& r, const sampler::NeighborSampler& sampler,
                                       const scheduler::EpochPlan& plan, uint64_t epoch_key, int64_t b) {
  const int64_t len = plan.batch_length(b);
  if (len == 0) return {};
  const uint64_t key = kernels::derive_key(epoch_key, static_cast<uint64_t>(b));
  const bool staged = r.batch_features && r.batch_features->staged();
  if (r.gpu_batches && read_ahead_inputs_only()) {
    const UseDevice use(r.dev);
    return r.gpu_batches->sample_input_nodes(plan.batch(b), len, key,
                                             staged ? r.batch_features->gpu_cache_slots() : nullptr);
  }
  std::vector<int64_t> inputs = sample_input_nodes(r, sampler, plan.batch(b), len, key);
  if (staged)
    inputs.erase(std::remove_if(inputs.begin(), inputs.end(), [&](int64_t id) { return r.batch_features->on_gpu(id); }),
                 inputs.end());
  return inputs;
}

}  // namespace

// One worker's mini-batch epoch: its share of the epoch's steps through its own pipeline; the
// gradients are summed over the workers as backward produces them. A resumed epoch starts at
// first_batch with this worker's losses of the batches before it: adding on to that sum in the
// same order keeps the epoch's loss bit for bit.
struct MiniBatchEpochs::Worker {
  const TrainRun& run;
  const TrainOptions& opt;
  Replica& r;
  const UseDevice use_device;  // before anything below allocates on r.dev (worker threads start elsewhere)
  const Clock::time_point t0 = Clock::now();
  const sampler::NeighborSampler* sampler;
  storage::HostFeatures* host_features;  // the rows' source when r has no feature tiers
  const std::vector<float>& full_degree;
  CheckpointPolicy* const checkpoints;  // null when evaluating
  const int local, replicas;  // this worker's index in the process, and the process's workers
  const int64_t epoch, first_batch;
  const uint64_t epoch_key;
  const scheduler::EpochPlan plan;
  // Features on disk: the windows of rows read ahead of this worker's batches (its share of the
  // read-ahead memory), which run on across epochs (MiniBatchEpochs::read_ahead_for).
  ReadAhead* read_ahead;  // set after construction by sampled inference, whose read-ahead samples this plan
  WorkerEpoch out;
  IoTimer io_timer;
  mutable std::atomic<int64_t> host_feature_ns{0};  // out.host_features_s as the prepare stage adds to it
  mutable std::atomic<int64_t> gpu_sample_ns{0};    // out.gpu_sample_s likewise
  Tensor batch_rows;  // 0, 1, ..., batch_size - 1: every logits row of a batch is a seed
  // Each step's mean loss and hit count (16 bytes per step), read once after the epoch: a step
  // never waits for the device, so the host queues the next while the GPU runs this one.
  Tensor step_losses;
  std::vector<std::vector<Parameter*>> by_layer;
  std::vector<Tensor*> bucket;
  size_t bucket_bytes = 0;
  const bool merge = merge_sums();
  std::vector<Tensor> merged;  // flush's: the bucket's runs of packed tensors, one view each
  std::vector<Tensor*> sums;
  const int64_t lag = vote_lag();
  const int prefetch;  // MiniBatchEpochs::prefetch_depth
  const bool votes, votes_checkpoints;
  std::atomic<int> agreed{0};
  std::optional<LaggedReads> vote_reads;
  std::vector<Tensor> vote_sums;
  Tensor vote_values[4];  // [stop, checkpoint] for index stop + 2 * checkpoint, copied on the device
  // With other workers, step b's update (the wait for its gradient sums, its votes' copy, Adam) is
  // finished inside step b + 1's forward, once that step's first work that reads no parameter (an
  // aggregate-first layer's A x) is enqueued (Model::forward's before_weights): the compute stream
  // aggregates while NCCL sums and waits for the slowest worker, where it sat idle before. The
  // same ops on the same data: the same bits (tests/training/workers_test.cpp).
  // GALE_UPDATE_OVERLAP=0 finishes each update in its own step, for measuring.
  const bool overlap_update;
  int64_t pending_update = -1;  // the step whose update is still to finish
  ops::OpProfile* const op_profile;  // GALE_OP_PROFILE's, or null

  // Training (ckpt given) or, with ckpt null, sampled evaluation of `plan_`'s batches.
  Worker(const MiniBatchEpochs& e, int local_, int64_t epoch_, uint64_t key, scheduler::EpochPlan plan_, int64_t first,
         double loss_sum, CheckpointPolicy* ckpt, ReadAhead* ahead)
      : run(e.run_),
        opt(e.run_.opt()),
        r(e.replicas_[local_]),
        use_device(r.dev),
        sampler(e.sampler_.get()),
        host_features(e.replicas_.host_features()),
        full_degree(e.full_degree_),
        checkpoints(ckpt),
        local(local_),
        replicas(e.replicas_.size()),
        epoch(epoch_),
        first_batch(first),
        epoch_key(key),
        plan(std::move(plan_)),
        read_ahead(ahead),
        io_timer(r.dev),
        step_losses(Tensor::empty(std::max<int64_t>(1, plan.num_batches()) * 16, 1, DType::kU8, r.dev)),
        by_layer(r.model->parameters_by_layer()),
        prefetch(e.prefetch_depth()),
        votes(ckpt != nullptr && r.comm != nullptr && run.step_stops()),
        votes_checkpoints(votes && run.lead_process() && local_ == 0 && opt.checkpoint_interval_s > 0),
        overlap_update(r.comm != nullptr && update_overlap()),
        op_profile(e.op_profiles_.empty() ? nullptr : e.op_profiles_[static_cast<size_t>(local_)].get()) {
    out.loss_sum = loss_sum;
    if (votes) {
      vote_reads.emplace(r.dev, static_cast<int>(lag + 1), 2);
      vote_sums.resize(static_cast<size_t>(lag + 1));
      for (Tensor& v : vote_sums) v = Tensor::empty(1, 2, DType::kF32, r.dev);
      for (int i = 0; i < 4; ++i) {
        const float value[2] = {static_cast<float>(i & 1), static_cast<float>(i >> 1)};
        vote_values[i] = Tensor::from_host(value, 1, 2, DType::kF32, r.dev);
      }
    }
  }

  // sum + the per-seed losses of batches [from, to), added in plan order (the epoch's loss, and
  // with it a resumed epoch's, depends on that order).
  double add_losses(double sum, int64_t from, int64_t to) const {
    const Tensor losses = step_losses.to(Device::cpu());
    for (int64_t b = from; b < to; ++b) {
      if (plan.batch_length(b) == 0) continue;
      double loss;
      std::memcpy(&loss, losses.data<unsigned char>() + 16 * b, sizeof loss);
      sum += loss * static_cast<double>(plan.batch_length(b));
    }
    return sum;
  }

  // Gradients travel in buckets of at least kBucketBytes, filled layer by layer as backward
  // finishes them (last layer first) and sent as soon as full, so a deep or wide model's sums
  // overlap the rest of its backward; the rest goes after backward. Every worker forms the same
  // buckets (they depend only on the parameters' sizes), so the calls match. A bucket is one
  // NCCL group call: fewer, larger sums wait for the other workers fewer times per step
  // (measured on 2 H200s, R-MAT 23: one sum per layer spent 0.19 s per epoch in NCCL).
  // GALE_BUCKET_BYTES overrides the size, for measuring (every process of a run must see the same).
  const size_t bucket_limit = bucket_bytes_limit();
  void flush() {
    if (bucket.empty()) return;
    const auto t_sum = Clock::now();
    // Gradients packed one after another (Model::pack_gradients) go as one tensor, padding
    // included (zeros, whose sum stays zero): one NCCL sum for the run instead of one each.
    merged.clear();
    for (size_t first = 0, last = 0; first < bucket.size(); first = ++last) {
      while (merge && last + 1 < bucket.size() && bucket[last]->packed_before(*bucket[last + 1])) ++last;
      merged.push_back(bucket[first]->packed_through(*bucket[last]));
    }
    sums.clear();
    for (Tensor& t : merged) sums.push_back(&t);
    r.comm->all_reduce_sum(sums);
    out.allreduce_host_s += since(t_sum);
    bucket.clear();
    bucket_bytes = 0;
  }
  void sum_layer(const std::vector<Parameter*>& params) {
    for (Parameter* p : params) {
      bucket.push_back(&p->grad);
      bucket_bytes += p->grad.nbytes();
    }
    if (bucket_bytes >= bucket_limit) flush();
  }

  // Sampled blocks of a batch of seeds as graph operands (each outer source's GCN norm from its
  // full-graph in-degree, weighted when the model is), still on the host.
  void prepare_blocks(PreparedBatch* p, int64_t b, const int64_t* seeds, int64_t len, uint64_t key) const {
    const storage::Store& store = run.store();
    p->batch = sampler->sample(seeds, len, key);
    for (const sampler::Block& block : p->batch.blocks)
      p->graphs.push_back(std::make_unique<GraphOperand>(block.csr(), block.src_ids.data(), store.indptr(),
                                                          /*with_transpose=*/true, full_degree.data()));
    if (!r.batch_features) read_features(p, b, p->batch.input_nodes());  // a GPU's tiers gather them later
    else if (r.batch_features->staged()) stage_features(p, b, p->batch.input_nodes());
  }

  // The host reads a batch's input features here, in parallel with training: from memory, or
  // through the disk tier.
  void read_features(PreparedBatch* p, int64_t b, const std::vector<int64_t>& inputs) const {
    const ScopeTime timed(host_feature_ns);
    p->features = Tensor::empty(static_cast<int64_t>(inputs.size()), run.store().feature_dim());
    const std::shared_ptr<const storage::WindowRows> window = read_ahead ? read_ahead->window_of(epoch, b) : nullptr;
    host_features->read_rows(inputs.data(), p->features.rows(), p->features.f32(), window.get());
    if (read_ahead) read_ahead->done(epoch, b);
  }

  // Behind a GPU cache: the rows of `inputs` it lacks, staged from the host's source (its
  // cache, the batch's read-ahead window, or disk) for the gather.
  void stage_features(PreparedBatch* p, int64_t b, const std::vector<int64_t>& inputs) const {
    const ScopeTime timed(host_feature_ns);
    const std::shared_ptr<const storage::WindowRows> window = read_ahead ? read_ahead->window_of(epoch, b) : nullptr;
    p->staged = r.batch_features->stage(inputs, [&](const int64_t* ids, int64_t n, float* out) {
      host_features->read_rows(ids, n, out, window.get());
    });
    if (read_ahead) read_ahead->done(epoch, b);
  }

  std::unique_ptr<PreparedBatch> prepare(int64_t b) const {
    const UseDevice use_here(r.dev);
    auto p = std::make_unique<PreparedBatch>();
    const int64_t len = plan.batch_length(b);
    if (len == 0) {  // a worker without seeds in the last step only joins the sums
      if (read_ahead) read_ahead->done(epoch, b);
      return p;
    }
    const uint64_t key = kernels::derive_key(epoch_key, static_cast<uint64_t>(b));
    if (r.gpu_batches) {  // the node sets leave the GPU only for the match-reorder window or the host's reads
      const bool staged = r.batch_features && r.batch_features->staged();
      {
        const ScopeTime timed(gpu_sample_ns);
        p->gpu = r.gpu_batches->sample(plan.batch(b), len, key, opt.reorder_window > 1 || !r.batch_features || staged);
      }
      if (!r.batch_features) read_features(p.get(), b, p->gpu.input_nodes_host());
      else if (staged) stage_features(p.get(), b, p->gpu.input_nodes_host());
      return p;
    }
    prepare_blocks(p.get(), b, plan.batch(b), len, key);
    if (opt.inference) return p;  // the store may have no labels
    p->labels.resize(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) p->labels[i] = run.labels()[plan.batch(b)[i]];
    return p;
  }

  // The batch's nodes for the match-reorder window. GPU-sampled without a window, none: the
  // pipeline would sort each batch's ~160K input nodes (10-15 ms of a prepare thread) only to count
  // the reuse the feature tiers count anyway (rows from the previous batch), as the node sets never
  // leave the GPU in memory; staged from the disk tier they are on the host for the staging alone.
  const std::vector<int64_t>& node_set(const std::unique_ptr<PreparedBatch>& p) const {
    static const std::vector<int64_t> none;  // a worker's empty slice
    if (r.gpu_batches) return opt.reorder_window > 1 ? p->gpu.input_nodes_host() : none;
    return p->batch.blocks.empty() ? none : p->batch.input_nodes();
  }

  // In training order, ahead of the step: a GPU-sampled batch's operands and feature gather on the
  // IO stream.
  void load(int64_t b, std::unique_ptr<PreparedBatch>& p) {
    if (!r.gpu_batches || plan.batch_length(b) == 0) return;
    const UseDevice use_here(r.dev);
    io_timer.begin();
    p->ops = r.gpu_batches->operands(p->gpu, run.attention());
    if (r.batch_features) p->x = r.batch_features->load_async(p->ops->input_nodes, &p->staged);
    io_timer.end();
  }

  // Forward of a prepared batch on the replica's device (blocks copied there in order, on the
  // compute stream, or, sampled on the GPU, built there), training or evaluating; before_weights:
  // Model::forward's.
  Tensor forward(PreparedBatch* p, uint64_t key, bool training = true, const std::function<void()>& before_weights = {}) {
    p->on_device.clear();
    if (r.gpu_batches && p->batch.blocks.empty()) {  // built by the load stage on the IO stream
      // The compute stream waits for all of the gather here (or copies the rows the host read).
      const Tensor x = r.batch_features ? p->x.take() : p->features.to(r.dev);
      p->on_device = std::move(p->ops->graphs);
      p->seeds = std::move(p->ops->seeds);
      p->ops.reset();
      std::vector<const GraphOperand*> graphs;
      for (const auto& g : p->on_device) graphs.push_back(&g);
      return r.model->forward(graphs, x, training, key, before_weights);
    }
    for (const auto& g : p->graphs) p->on_device.push_back(g->to(r.dev, run.attention()));
    std::vector<const GraphOperand*> graphs;
    for (const auto& g : p->on_device) graphs.push_back(&g);
    const Tensor x = r.batch_features ? r.batch_features->load(p->batch.input_nodes(), &p->staged) : p->features.to(r.dev);
    return r.model->forward(graphs, x, training, key, before_weights);
  }

  // Rows 0 .. len - 1 of a batch's logits: every one is a seed.
  Tensor seed_rows(int64_t len) {
    if (!batch_rows.defined() || batch_rows.rows() < len) {
      std::vector<int64_t> rows(static_cast<size_t>(std::max(len, opt.batch_size)));
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
      batch_rows = ids_tensor(rows, r.dev);
    }
    return batch_rows.rows_slice(0, len);
  }

  // Forward and backward of step b (this worker's share of it), its loss queued into step_losses;
  // before_weights: Model::forward's (called first for a worker without seeds in the step).
  void step_gradients(int64_t b, std::unique_ptr<PreparedBatch>& p, const std::function<void()>& before_weights) {
    const int64_t len = plan.batch_length(b);
    if (len == 0) {
      if (before_weights) before_weights();
      for (size_t l = by_layer.size(); l-- > 0;) sum_layer(by_layer[l]);  // the same sums, of zeros
      return;
    }
    Tensor logits = forward(p.get(), kernels::derive_key(epoch_key ^ 0xb47c4ULL, static_cast<uint64_t>(b)),
                            /*training=*/true, before_weights);
    Tensor grad = Tensor::empty(len, logits.cols(), DType::kF32, r.dev);
    // The loss of a step is the mean over every worker's seeds: this worker's gradient is its sum
    // over the step's seeds (one pass: an axpy of its own cost a kernel a step). GPU-sampled, the
    // labels are read by the seeds' ids from the whole graph's (no gather of their own).
    const Tensor labels = p->seeds.defined() ? r.labels_all
                                             : Tensor::from_host(p->labels.data(), len, 1, DType::kI32, r.dev);
    ops::softmax_cross_entropy_seeds_async(logits, labels, p->seeds, &grad, &step_losses, b, plan.step_length(b));
    out.seeds += len;
    logits = Tensor();
    r.model->backward(std::move(grad),
                      r.comm ? Model::GradHook([this](const std::vector<Parameter*>& ps) { sum_layer(ps); })
                             : Model::GradHook());
  }

  // Adds this worker's votes to the step's sums; once summed (after the wait for them) they are
  // copied to the host, and read `lag` steps later: when any worker voted, the pipeline ends after
  // the step that reads them (agreed).
  int vote_slot(int64_t b) const { return static_cast<int>(b % (lag + 1)); }
  void vote(int64_t b) {
    const bool stop = opt.stop != nullptr && opt.stop->load() != 0;
    const bool due = votes_checkpoints && checkpoints->interval_due();
    Tensor& sums = vote_sums[static_cast<size_t>(vote_slot(b))];
    ops::copy(vote_values[(stop ? 1 : 0) + (due ? 2 : 0)], &sums);
    bucket.push_back(&sums);
  }
  void copy_votes(int64_t b) { vote_reads->copy(vote_slot(b), vote_sums[static_cast<size_t>(vote_slot(b))]); }
  void read_votes(int64_t b) {
    if (b - lag >= first_batch && b + 1 < plan.num_batches()) {
      const auto t_read = Clock::now();
      const float* sums = vote_reads->read(vote_slot(b - lag));
      out.vote_wait_s += since(t_read);
      if (sums[0] > 0.0f || sums[1] > 0.0f) {
        out.checkpoint_break = sums[0] == 0.0f;
        agreed.store(1);
      }
    }
  }

  // Forward and backward of step b, then its sums; its update (finish_update) follows at once, or,
  // with overlap_update, inside step b + 1's forward.
  void consume(int64_t b, std::unique_ptr<PreparedBatch>& p) {
    const UseDevice use_here(r.dev);
    const ops::OpProfile::Scope profiled(op_profile);
    if (overlap_update) {
      step_gradients(b, p, [this] {
        finish_update();
        r.model->zero_grad();
      });
    } else {
      r.model->zero_grad();
      step_gradients(b, p, {});
    }
    if (votes) vote(b);
    if (r.comm) flush();
    pending_update = b;
    if (!overlap_update) finish_update();
    if (votes) read_votes(b);  // step b - lag's, copied by the update of step b - lag (finished by now)
  }
  // The pending step's update: after its sums, Adam.
  void finish_update() {
    const int64_t b = pending_update;
    if (b < 0) return;
    pending_update = -1;
    const UseDevice use_here(r.dev);
    if (r.comm) r.comm->wait();
    if (votes) copy_votes(b);
    r.adam->step();
    stepped(b);
  }
  // Step b's update is enqueued.
  void stepped(int64_t b) {
    if (local == 0 && opt.on_step) opt.on_step(epoch, b, plan.num_batches());
    if (opt.checkpoint_interval_s > 0 && !r.comm && b + 1 < plan.num_batches() && checkpoints->interval_due())
      checkpoints->save_latest(epoch - 1, b + 1, {add_losses(out.loss_sum, first_batch, b + 1)});
  }

  WorkerEpoch run_epoch() {
    out.times = scheduler::run_batch_pipeline<std::unique_ptr<PreparedBatch>>(
        plan.num_batches(), prefetch,
        static_cast<int>(std::min<int64_t>(opt.reorder_window, std::max<int64_t>(1, plan.num_batches()))),  // a window past the epoch is the epoch
        [&](int64_t b) { return prepare(b); },
        [&](const std::unique_ptr<PreparedBatch>& p) -> const std::vector<int64_t>& { return node_set(p); },
        [&](int64_t b, std::unique_ptr<PreparedBatch>& p) { load(b, p); },
        [&](int64_t b, std::unique_ptr<PreparedBatch>& p) { consume(b, p); },
        scheduler::PipelineRange{first_batch, !run.step_stops() ? nullptr : votes ? &agreed : opt.stop});
    const auto t_drain = Clock::now();
    finish_update();  // the last step's
    out.loss_sum = add_losses(out.loss_sum, first_batch, out.times.consumed_end);
    if (r.batch_features) out.features = r.batch_features->take_stats();
    out.io_s = io_timer.take_seconds();
    out.host_features_s = static_cast<double>(host_feature_ns.load()) * 1e-9;
    out.gpu_sample_s = static_cast<double>(gpu_sample_ns.load()) * 1e-9;
    if (r.comm) out.allreduce_s = r.comm->take_seconds();
    if (r.comm) out.sum_wait_s = r.comm->take_wait_seconds();
    synchronize(r.dev);
    out.wall_s = since(t0);
    out.drain_s = since(t_drain);
    if (op_profile != nullptr) print_op_profile();
    if (r.comm) gather_records();
    return out;
  }

  // GALE_OP_PROFILE's table of the epoch's steps: per op (a GEMM's batch-sized dimensions as N),
  // calls and GPU milliseconds, and the total per kind of op.
  void print_op_profile() {
    struct Row {
      std::string name;
      int64_t calls = 0;
      double ms = 0, gap_ms = 0;  // gap: the stream's idle time before the op's calls
    };
    std::vector<Row> ops;
    double kinds[3] = {}, idle = 0;
    for (const ops::OpProfile::Entry& e : op_profile->table()) {
      std::string name;
      for (size_t i = 0; i < e.name.size();) {  // numbers of 1000 and more (rows of a batch) -> N
        size_t j = i;
        while (j < e.name.size() && std::isdigit(static_cast<unsigned char>(e.name[j]))) ++j;
        if (j == i) {
          name += e.name[i++];
          continue;
        }
        name += j - i >= 4 ? std::string("N") : e.name.substr(i, j - i);
        i = j;
      }
      kinds[std::min<int>(2, static_cast<int>(e.kind))] += e.ms;
      auto it = std::find_if(ops.begin(), ops.end(), [&](const Row& o) { return o.name == name; });
      if (it == ops.end()) it = ops.insert(ops.end(), Row{name});
      it->calls += e.calls;
      it->ms += e.ms;
      it->gap_ms += e.gap_ms;
      idle += e.gap_ms;
    }
    char line[256];
    std::snprintf(line, sizeof line, "op-profile worker %d epoch %lld: kinds %.2f %.2f %.2f ms, idle between ops %.2f ms\n",
                  local, static_cast<long long>(epoch), kinds[0], kinds[1], kinds[2], idle);
    std::string text = line;
    std::sort(ops.begin(), ops.end(), [](const Row& x, const Row& y) { return x.gap_ms > y.gap_ms; });
    for (size_t i = 0; i < ops.size() && i < 12; ++i) {
      std::snprintf(line, sizeof line, "op-profile worker %d epoch %lld: idle before %-38s %9.2f ms\n", local,
                    static_cast<long long>(epoch), ops[i].name.c_str(), ops[i].gap_ms);
      text += line;
    }
    std::sort(ops.begin(), ops.end(), [](const Row& x, const Row& y) { return x.ms > y.ms; });
    for (size_t i = 0; i < ops.size() && i < 40; ++i) {
      std::snprintf(line, sizeof line, "op-profile worker %d epoch %lld: %-44s %7lld calls %9.2f ms\n", local,
                    static_cast<long long>(epoch), ops[i].name.c_str(), static_cast<long long>(ops[i].calls),
                    ops[i].ms);
      text += line;
    }
    std::fputs(text.c_str(), stderr);
    op_profile->reset();
  }

  // Sampled inference (no checkpoints given): the plan's batches through the same pipeline, each
  // forward in evaluation mode; `per_batch(b, p, logits)` takes each batch's logits, in plan order.
  template <typename PerBatch>
  void run_inference(const PerBatch& per_batch) {
    scheduler::run_batch_pipeline<std::unique_ptr<PreparedBatch>>(
        plan.num_batches(), prefetch, /*window=*/1, [&](int64_t b) { return prepare(b); },
        [&](const std::unique_ptr<PreparedBatch>& p) -> const std::vector<int64_t>& { return node_set(p); },
        [&](int64_t b, std::unique_ptr<PreparedBatch>& p) { load(b, p); },
        [&](int64_t b, std::unique_ptr<PreparedBatch>& p) {
          if (plan.batch_length(b) == 0) return;
          const UseDevice use_here(r.dev);
          per_batch(b, *p, forward(p.get(), 0, /*training=*/false));
        },
        scheduler::PipelineRange{0, nullptr});
  }

  // Sampled evaluation: how many seeds' argmax is their label.
  int64_t run_evaluation() {
    int64_t correct = 0;
    run_inference([&](int64_t b, const PreparedBatch& p, const Tensor& logits) {
      const int64_t len = plan.batch_length(b);
      const Tensor labels = p.seeds.defined() ? ops::gather_rows(r.labels_all, p.seeds)
                                              : Tensor::from_host(p.labels.data(), len, 1, DType::kI32, r.dev);
      correct += ops::softmax_cross_entropy(logits, labels, seed_rows(len), nullptr).correct;
    });
    return correct;
  }

  // Every worker's counts to every worker (rank 0 reports them), and with --check-replicas each
  // one's weight checksum after the record.
  void gather_records() {
    out.stop = opt.stop ? opt.stop->load() : 0;
    std::vector<uint64_t> mine = out.record();
    if (opt.check_replicas) mine.push_back(parameter_checksum(*r.model));
    out.everyone = r.comm->all_gather(mine);
    if (!opt.check_replicas) return;
    const size_t words = mine.size();
    for (int w = 1; w < run.world(); ++w) {
      if (out.everyone[w * words + words - 1] != out.everyone[words - 1])
        throw InternalError("--check-replicas: after epoch " + std::to_string(epoch + 1) + " worker " +
                            std::to_string(w) + "'s weights differ from worker 0's");
    }
    out.checksum = out.everyone[words - 1];
  }
};

MiniBatchEpochs::MiniBatchEpochs(const TrainRun& run, Replicas& replicas)
    : run_(run), replicas_(replicas), read_aheads_(static_cast<size_t>(run.workers())) {
  const TrainOptions& opt = run.opt();
  sampler_ = std::make_unique<sampler::NeighborSampler>(run.store().csr(), opt.fanouts, opt.sampling,
                                                         opt.model.edge_weights);
  replicas.place_batch_sources(run, *sampler_);
  // The reads that filled the caches are not the first epoch's.
  if (storage::HostFeatures* host = replicas.host_features(); host != nullptr) host->take_stats();
  if (opt.model.edge_weights) full_degree_ = kernels::weighted_in_degree(run.store().csr());
  if (run.seeds_by_partition())
    seed_pools_ = scheduler::balance_seed_pools(run.train_ids(), run.store().partition(), run.world());
  if (const char* env = std::getenv("GALE_OP_PROFILE"); env != nullptr && std::string(env) == "1") {
    const ops::OpProfile::Scope keep(nullptr);  // a profile is live only inside its worker's steps
    for (int w = 0; w < run.workers(); ++w) op_profiles_.push_back(std::make_unique<ops::OpProfile>());
  }
}

MiniBatchEpochs::~MiniBatchEpochs() = default;

namespace {

// Whether several workers' slices of a step are balanced by in-degree (scheduler/epoch_plan.hpp);
// GALE_BALANCE_STEPS=0 cuts them as shuffled, for measuring.
bool balance_steps() {
  static const bool balance = [] {
    const char* env = std::getenv("GALE_BALANCE_STEPS");
    return env == nullptr || std::string(env) != "0";
  }();
  return balance;
}

}  // namespace

scheduler::EpochPlan MiniBatchEpochs::plan(int64_t epoch, int rank) const {
  const TrainOptions& opt = run_.opt();
  return run_.seeds_by_partition() ? scheduler::EpochPlan(seed_pools_, opt.batch_size, opt.seed, epoch, rank)
                                   : scheduler::EpochPlan(run_.train_ids(), opt.batch_size, opt.seed, epoch, run_.world(),
                                                          rank, balance_steps() ? run_.store().indptr() : nullptr);
}

scheduler::EpochPlan MiniBatchEpochs::first_plan(int64_t epoch) {
  const int rank = run_.first_rank();
  std::optional<scheduler::EpochPlan> made;
  if (next_plan_.valid()) {
    // An epoch that must wait for its plan gets the next one made by twice the threads.
    if (next_plan_.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
      plan_threads_ = std::min(2 * plan_threads_, tbb::info::default_concurrency());
    scheduler::EpochPlan ready = next_plan_.get();
    if (next_plan_epoch_ == epoch) made = std::move(ready);
  }
  if (!made) made = plan(epoch, rank);
  if (epoch + 1 < run_.opt().epochs) {
    next_plan_epoch_ = epoch + 1;
    const int threads = std::min(plan_threads(), tbb::info::default_concurrency());  // GALE_PLAN_THREADS too
    next_plan_ = std::async(std::launch::async, [this, epoch, rank, threads] {
      if (threads == 0) return plan(epoch + 1, rank);
      tbb::task_arena arena(threads, /*reserved_for_masters=*/1);  // this thread and threads - 1 of TBB's
      return arena.execute([&] { return plan(epoch + 1, rank); });
    });
  }
  return std::move(*made);
}

int MiniBatchEpochs::plan_threads() const {
  // GALE_PLAN_THREADS=N fixes them (0: TBB's whole arena, as before), for measuring; read per
  // epoch, so tests can compare.
  const char* env = std::getenv("GALE_PLAN_THREADS");
  const int fixed = env != nullptr && *env != '\0' && std::atoi(env) >= 0 ? std::atoi(env) : -1;
  return fixed >= 0 ? fixed : plan_threads_;
}

ReadAhead* MiniBatchEpochs::read_ahead_for(int local, int64_t epoch, int64_t first) {
  storage::HostFeatures* host = replicas_.host_features();
  if (host == nullptr || !host->on_disk() || host->read_ahead_bytes() == 0) return nullptr;
  ReadAheadAt& at = read_aheads_[static_cast<size_t>(local)];
  if (!at.ahead || at.epoch != epoch || at.first != first) start_read_ahead(local, epoch, first);
  at.epoch = epoch + 1, at.first = 0;  // where the worker's next epoch begins, if this one ends whole
  return at.ahead.get();
}

void MiniBatchEpochs::start_read_ahead(int local, int64_t epoch, int64_t first) {
  storage::HostFeatures* host = replicas_.host_features();
  ReadAheadAt& at = read_aheads_[static_cast<size_t>(local)];
  at.ahead.reset();  // its threads stop before the new one's start
  const int rank = run_.first_rank() + local;
  const TrainOptions& opt = run_.opt();
  const auto segment = [this, rank, local, &opt](int64_t e, int64_t from) {
    auto epoch_plan = std::make_shared<const scheduler::EpochPlan>(plan(e, rank));
    const uint64_t key = run_.epoch_key(e);
    const Replica& r = replicas_[local];
    const sampler::NeighborSampler& cpu = *sampler_;
    return ReadAhead::Segment{e, from, epoch_plan->num_batches(), [&r, &cpu, epoch_plan, key](int64_t b) {
                                return read_ahead_inputs(r, cpu, *epoch_plan, key, b);
                              }};
  };
  const bool gpu_sampled = replicas_[local].gpu_batches != nullptr;
  ReadAhead::Segment first_segment = segment(epoch, first);
  const int64_t lead = read_ahead_lead(gpu_sampled, epoch + 1 < opt.epochs, first_segment.end);
  at.ahead = std::make_unique<ReadAhead>(
      *host->disk(), host->read_ahead_bytes() / static_cast<uint64_t>(replicas_.size()), window_growth(gpu_sampled),
      std::move(first_segment),
      [segment, &opt](int64_t e) -> std::optional<ReadAhead::Segment> {
        if (e + 1 >= opt.epochs) return std::nullopt;
        return segment(e + 1, 0);
      },
      read_ahead_keeps(), read_ahead_rides_along(), read_ahead_chains_riders(), read_ahead_parts(), lead);
}

double MiniBatchEpochs::sampled_accuracy(const std::vector<int64_t>& nodes, int64_t epoch) {
  if (nodes.empty()) return 0;
  const TrainOptions& opt = run_.opt();
  // The lead replica's pipeline over batches of `nodes` (in an order drawn from the seed and a
  // key of the evaluation's own), its draws keyed apart from training's.
  const uint64_t key = kernels::derive_key(run_.epoch_key(epoch), 0xe7a1ULL);
  Worker worker(*this, 0, epoch, key, scheduler::EpochPlan(nodes, opt.batch_size, key, epoch), 0, 0.0, nullptr, nullptr);
  const int64_t correct = worker.run_evaluation();
  return static_cast<double>(correct) / static_cast<double>(nodes.size());
}

int64_t MiniBatchEpochs::sampled_logits(const std::vector<int64_t>& nodes, uint64_t key, const LogitsSink& sink) {
  // GALE_PREDICT_ORDER=consecutive: batches of consecutive entries (before), for measuring.
  const char* order = std::getenv("GALE_PREDICT_ORDER");
  const int64_t batch_size = run_.opt().batch_size;
  Worker worker(*this, 0, 0, key,
                order != nullptr && std::string(order) == "consecutive" ? scheduler::EpochPlan::in_order(nodes, batch_size)
                                                                        : scheduler::EpochPlan::strided(nodes, batch_size),
                0, 0.0, nullptr, nullptr);
  const std::unique_ptr<ReadAhead> ahead = inference_read_ahead(worker.plan, key);  // gone before the worker
  worker.read_ahead = ahead.get();
  worker.run_inference([&](int64_t b, const PreparedBatch&, const Tensor& logits) {
    const int64_t len = worker.plan.batch_length(b);
    sink(worker.plan.batch(b), len, logits.rows_slice(0, len).to(Device::cpu()));
  });
  return worker.plan.num_batches();
}

std::unique_ptr<ReadAhead> MiniBatchEpochs::inference_read_ahead(const scheduler::EpochPlan& plan, uint64_t key) {
  storage::HostFeatures* host = replicas_.host_features();
  if (host == nullptr || !host->on_disk() || host->read_ahead_bytes() == 0) return nullptr;
  const Replica& r = replicas_.lead();
  const sampler::NeighborSampler& cpu = *sampler_;
  return std::make_unique<ReadAhead>(
      *host->disk(), host->read_ahead_bytes(), window_growth(r.gpu_batches != nullptr),
      ReadAhead::Segment{0, 0, plan.num_batches(),
                         [&r, &cpu, &plan, key](int64_t b) { return read_ahead_inputs(r, cpu, plan, key, b); }},
      [](int64_t) -> std::optional<ReadAhead::Segment> { return std::nullopt; }, read_ahead_keeps(),
      read_ahead_rides_along(), read_ahead_chains_riders(), read_ahead_parts(),
      read_ahead_lead(r.gpu_batches != nullptr, /*later_epochs=*/false, plan.num_batches()));
}

void MiniBatchEpochs::take_disk_stats(EpochMetrics* m) {
  storage::HostFeatures* host = replicas_.host_features();
  if (host == nullptr || !host->on_disk()) return;
  const storage::DiskFeatureStats d = host->take_stats();
  m->host_cache_hits = d.cache_hits;
  m->disk_rows = d.disk_rows;
  m->disk_bytes_read = d.disk_bytes;
  m->useful_disk_bytes = d.useful_bytes;
  m->disk_read_s = d.read_seconds;
  m->disk_read_requests = d.read_calls;
  m->needed_disk_bytes = d.needed_bytes;
  m->read_ahead_hits = d.read_ahead_hits;
  m->read_ahead_windows = d.windows;
  m->read_ahead_wait_s = d.read_ahead_wait_s;
  m->read_ahead_sample_s = d.read_ahead_sample_s;
  m->read_ahead_reader_idle_s = d.read_ahead_reader_idle_s;
  m->read_ahead_reader_held_s = d.read_ahead_reader_held_s;
}

int MiniBatchEpochs::prefetch_depth() const {
  if (run_.opt().prefetch > 0) return run_.opt().prefetch;
  // Measured on R-MAT 25 in an 8 GB cgroup (H100): 8.7 s per epoch with 8, 24.7-25.9 s with 2.
  const Replica& lead = replicas_.lead();
  return lead.batch_features != nullptr && lead.batch_features->staged() ? 8 : 2;
}

FeaturePlacement MiniBatchEpochs::placement() const {
  const Replica& lead = replicas_.lead();
  FeaturePlacement p;
  p.worker_threads = worker_threads_name(replicas_.worker_threads());
  p.worker_cpus = replicas_.describe_worker_threads();
  p.tiers = lead.batch_features != nullptr;
  if (p.tiers)
    p.description = lead.batch_features->describe() + (lead.gpu_batches ? "; " + lead.gpu_batches->describe() : "; CPU sampler");
  if (const storage::HostFeatures* host = replicas_.host_features(); host != nullptr) {
    p.disk = host->on_disk();
    p.description = (p.tiers ? lead.batch_features->describe() + "; " : "") + host->describe() +
                    (lead.gpu_batches ? "; " + lead.gpu_batches->describe() : "");
  }
  return p;
}

namespace {

// Every worker's epoch on its own thread (rank 0 on this one). A worker that fails aborts the
// group, so the others stop at their next sum instead of waiting for it forever; the first
// failure is rethrown, naming the worker.
template <typename RunWorker>
void run_workers(const TrainRun& run, Replicas& replicas, const RunWorker& run_worker) {
  const int workers = run.workers();
  std::vector<std::exception_ptr> failed(static_cast<size_t>(workers));
  std::atomic<int> first_failure{-1};  // set before the abort, so the cause wins over its echoes
  auto guarded = [&](int w) {
    Replica& r = replicas[w];
    try {
      if (r.arena) r.arena->execute([&] { run_worker(w); });  // its share of the cores (engine/worker_arena.hpp)
      else run_worker(w);
    } catch (const std::exception& e) {
      failed[static_cast<size_t>(w)] = std::current_exception();
      int none = -1;
      first_failure.compare_exchange_strong(none, w);
      if (r.comm)
        r.comm->abort("stopped because worker " + std::to_string(run.first_rank() + w) + " (" + r.dev.name() +
                      ") failed: " + e.what());
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(guarded, w);
  guarded(0);
  for (std::thread& t : pool) t.join();
  const int w = first_failure.load();
  if (w < 0) return;
  if (workers == 1) std::rethrow_exception(failed[0]);
  const std::string where = "worker " + std::to_string(run.first_rank() + w) + " (" + replicas[w].dev.name() + "): ";
  try {
    std::rethrow_exception(failed[static_cast<size_t>(w)]);
  } catch (const Error& e) {
    throw Error(where + e.what(), e.code());
  } catch (const std::exception& e) {
    throw InternalError(where + e.what());
  }
}

// The epoch's counts so far over every worker of the run, summed by rank.
struct EpochTally {
  std::vector<double> loss_sums;  // by rank, over the epoch so far
  std::vector<int64_t> seeds;
  std::vector<double> wall, allreduce;
  std::vector<WorkerStageSeconds> stages;
  int stop_signal = 0;
  explicit EpochTally(int world)
      : seeds(static_cast<size_t>(world), 0),
        wall(static_cast<size_t>(world), 0.0),
        allreduce(static_cast<size_t>(world), 0.0),
        stages(static_cast<size_t>(world)) {}

  // Adds a segment of the epoch (worker 0's view of it: every worker's records, or its own).
  void add(const WorkerEpoch& w0, int world, EpochMetrics* m) {
    const std::vector<uint64_t> records = w0.everyone.empty() ? w0.record() : w0.everyone;
    const size_t words = records.size() / static_cast<size_t>(world);
    loss_sums.clear();
    for (int w = 0; w < world; ++w) {
      const uint64_t* rec = records.data() + static_cast<size_t>(w) * words;
      loss_sums.push_back(word_double(rec[0]));  // each worker's sum goes on from its prior
      seeds[static_cast<size_t>(w)] += static_cast<int64_t>(rec[1]);
      wall[static_cast<size_t>(w)] += word_double(rec[2]);
      m->feature_rows += static_cast<int64_t>(rec[3]);
      m->rows_previous += static_cast<int64_t>(rec[4]);
      m->rows_device += static_cast<int64_t>(rec[5]);
      m->rows_cache += static_cast<int64_t>(rec[6]);
      m->rows_host += static_cast<int64_t>(rec[7]);
      m->host_to_gpu_bytes += static_cast<int64_t>(rec[8]);
      m->input_nodes += static_cast<int64_t>(rec[9]);
      m->reused_nodes += static_cast<int64_t>(rec[10]);
      m->reused_nodes_sampled_order += static_cast<int64_t>(rec[11]);
      allreduce[static_cast<size_t>(w)] += word_double(rec[12]);
      stop_signal = std::max(stop_signal, static_cast<int>(rec[13]));
      WorkerStageSeconds& st = stages[static_cast<size_t>(w)];
      st.prepare_s += word_double(rec[14]);
      st.host_features_s += word_double(rec[15]);
      st.load_s += word_double(rec[16]);
      st.io_s += word_double(rec[17]);
      st.compute_s += word_double(rec[18]);
      st.wait_s += word_double(rec[19]);
      st.reorder_s += word_double(rec[20]);
      st.allreduce_s += word_double(rec[12]);
      st.allreduce_host_s += word_double(rec[21]);
      st.vote_wait_s += word_double(rec[22]);
      st.gpu_sample_s += word_double(rec[23]);
      st.sum_wait_s += word_double(rec[24]);
      st.fill_s += word_double(rec[25]);
      st.drain_s += word_double(rec[26]);
      st.wall_s += word_double(rec[2]);
    }
    m->sample_s += w0.times.prepare_s;
    m->io_s += w0.io_s;
    m->compute_s += w0.times.consume_s;
    m->wait_s += w0.times.wait_s;
    m->allreduce_s += w0.allreduce_s;
    m->allreduce_host_s += w0.allreduce_host_s;
    m->vote_wait_s += w0.vote_wait_s;
    m->reorder_s += w0.times.reorder_s;
    m->replica_checksum = w0.checksum;
  }

  // The whole epoch's loss and per-worker rates into m.
  void finish(int world, int64_t train_seeds, EpochMetrics* m) const {
    double loss_sum = 0;
    for (int w = 0; w < world; ++w) {
      loss_sum += loss_sums[static_cast<size_t>(w)];
      const double t = wall[static_cast<size_t>(w)];
      m->worker_seeds_per_s.push_back(t > 0 ? static_cast<double>(seeds[static_cast<size_t>(w)]) / t : 0.0);
      m->worker_allreduce_s.push_back(allreduce[static_cast<size_t>(w)]);
    }
    m->worker_stages = stages;
    m->loss = loss_sum / static_cast<double>(train_seeds);
    if (m->input_nodes == 0) {  // GPU-sampled without a window: the node sets never left the GPU
      m->input_nodes = m->feature_rows;
      m->reused_nodes = m->reused_nodes_sampled_order = m->rows_previous;
    }
  }
};

}  // namespace

// Several workers run the epoch in segments when they agree on an interval checkpoint: each
// segment ends after the same step, the checkpoint is written, and the next goes on from there
// with each worker's loss sum so far, exactly as a run resumed from that checkpoint would.
MiniBatchEpochEnd MiniBatchEpochs::train_epoch(int64_t epoch, uint64_t epoch_key, const ResumePoint* start,
                                               CheckpointPolicy& checkpoints, EpochMetrics* m) {
  const int world = run_.world();
  std::vector<WorkerEpoch> done(static_cast<size_t>(run_.workers()));
  int64_t segment_first = start != nullptr ? start->batch : 0;
  // Each worker rank's sum of the losses before segment_first (a resumed epoch's from the checkpoint).
  std::vector<double> priors(static_cast<size_t>(world), 0.0);
  if (start != nullptr && !start->loss_sums.empty()) priors = start->loss_sums;
  EpochTally tally(world);
  // One plan for the process's workers: a sliced plan is the same for every rank but its slice,
  // and dealing its steps is the costly part (a partition-aware plan is one rank's pool).
  const scheduler::EpochPlan lead_plan = first_plan(epoch);
  const auto plan_for = [&](int w) {
    const int rank = run_.first_rank() + w;
    return w == 0 ? lead_plan : run_.seeds_by_partition() ? plan(epoch, rank) : lead_plan.for_rank(rank);
  };
  m->batches = lead_plan.num_batches();
  MiniBatchEpochEnd end;
  for (;;) {
    run_workers(run_, replicas_, [&](int w) {
      Worker worker(*this, w, epoch, epoch_key, plan_for(w), segment_first,
                    priors[static_cast<size_t>(run_.first_rank() + w)], &checkpoints, read_ahead_for(w, epoch, segment_first));
      done[static_cast<size_t>(w)] = worker.run_epoch();
      // A pipeline that ended inside the epoch read some batches after its last step: their
      // windows may be gone, so the read-ahead starts again from where the next one begins.
      if (done[static_cast<size_t>(w)].times.consumed_end < worker.plan.num_batches()) read_aheads_[static_cast<size_t>(w)].ahead.reset();
    });
    const WorkerEpoch& w0 = done[0];
    tally.add(w0, world, m);
    end.stop_signal = tally.stop_signal;
    const int64_t consumed = w0.times.consumed_end;
    if (consumed >= m->batches) break;
    // Ended between steps (step_stops), every worker after the same one.
    checkpoints.save_latest(epoch - 1, consumed, tally.loss_sums);
    if (w0.checkpoint_break) {  // an agreed interval checkpoint: the epoch goes on
      segment_first = consumed;
      priors = tally.loss_sums;
      continue;
    }
    end.inside = true;
    end.batches_done = consumed;
    return end;
  }
  tally.finish(world, static_cast<int64_t>(run_.train_ids().size()), m);
  take_disk_stats(m);
  return end;
}

}  // namespace gale::engine::train_parts

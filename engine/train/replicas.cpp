#include "engine/train/replicas.hpp"

#include <algorithm>

#include <xxhash.h>

#include "engine/devices.hpp"
#include "engine/train/presample.hpp"
#include "kernels/error.hpp"

namespace gale::engine::train_parts {

Replicas::Replicas(const TrainRun& run) : replicas_(static_cast<size_t>(run.workers())) {
  const TrainOptions& opt = run.opt();
  for (int w = 0; w < run.workers(); ++w) {
    Replica& r = replicas_[static_cast<size_t>(w)];
    r.dev = run.devices()[static_cast<size_t>(w)];
    const UseDevice use(r.dev);
    r.model = std::make_unique<Model>(opt.model, opt.seed);
    r.model->to(r.dev);
    r.model->set_exec(opt.exec);
    r.model->set_constant_input(opt.full_graph);  // the resident features(), unchanged all run
    r.adam = std::make_unique<Adam>(r.model->parameters(), opt.lr, opt.weight_decay);
    if (!opt.inference) r.labels_all = Tensor::from_host(run.labels(), run.num_nodes(), 1, DType::kI32, r.dev);
  }
  if (run.world() > 1) {
    auto comms = run.lead_device().is_cpu() ? make_in_process_group(run.workers(), &run.procs())
                                            : make_nccl_group(run.devices(), &run.procs());
    for (int w = 0; w < run.workers(); ++w) replicas_[static_cast<size_t>(w)].comm = std::move(comms[static_cast<size_t>(w)]);
  }
  if (!opt.full_graph) place_worker_threads(run);
}

void Replicas::place_worker_threads(const TrainRun& run) {
  const bool gpus = replicas_[0].dev.is_cuda();
  const WorkerThreads policy = worker_threads_from_env(gpus);
  const int host_cpu_workers = run.procs().local_size() * run.workers();
  if (policy == WorkerThreads::kShared || (!gpus && host_cpu_workers == 1)) return;
  std::vector<CpuList> shares;
  if (gpus) {
    // The run's GPUs on this host, in rank order: the --gpus list that the processes here slice
    // (engine/processes.hpp's place_devices).
    std::vector<int> host_gpus;
    for (const Device& d : run.opt().devices.empty() ? run.devices() : run.opt().devices) host_gpus.push_back(d.ordinal);
    const std::vector<CpuList> host_shares = gpu_worker_cpus(host_gpus);
    for (const Replica& r : replicas_) {
      const auto at = std::find(host_gpus.begin(), host_gpus.end(), r.dev.ordinal);
      if (at == host_gpus.end()) throw InternalError("Replicas: " + r.dev.name() + " is not among the run's GPUs");
      shares.push_back(host_shares[static_cast<size_t>(at - host_gpus.begin())]);
    }
  } else {
    const std::vector<CpuList> host_shares = cpu_worker_cpus(host_cpu_workers);
    const size_t first = static_cast<size_t>(run.procs().local_rank() * run.workers());
    shares.assign(host_shares.begin() + static_cast<std::ptrdiff_t>(first),
                  host_shares.begin() + static_cast<std::ptrdiff_t>(first + replicas_.size()));
  }
  // CPU workers are never pinned and by default keep TBB's arenas: they have no GPU to be near,
  // their kernels are TBB loops that use the cores another worker leaves idle while it waits for
  // the sums, and two CPU workers pinned to a core each of 2 ran slower (workers_test's batch-norm
  // and partition runs: 6.4 s against 5.6-6.1 s, 2.4x the system time, in sched_yield and futex).
  const bool pin = policy == WorkerThreads::kPinned && gpus;
  worker_threads_ = pin ? WorkerThreads::kPinned : WorkerThreads::kArenas;
  for (size_t w = 0; w < replicas_.size(); ++w) replicas_[w].arena = std::make_unique<WorkerArena>(shares[w], pin);
}

std::vector<std::string> Replicas::describe_worker_threads() const {
  std::vector<std::string> out;
  for (const Replica& r : replicas_) {
    if (!r.arena) continue;
    std::string where = r.dev.name();
    if (r.dev.is_cuda()) {
      const int node = gpu_numa_node(r.dev.ordinal);
      if (node >= 0) where += " (NUMA node " + std::to_string(node) + ")";
    }
    out.push_back(where + ": " + r.arena->describe());
  }
  return out;
}

namespace {

// Where a mini-batch run's GPUs keep the features and the GPU sampler's topology, and how much of
// each GPU's room they take.
class GpuRooms {
 public:
  GpuRooms(const TrainRun& run, const std::vector<Replica>& replicas) : opt_(run.opt()) {
    const storage::Store& store = run.store();
    const uint64_t f32_bytes =
        static_cast<uint64_t>(run.num_nodes()) * static_cast<uint64_t>(store.feature_dim()) * sizeof(float);
    // GPUs gather from their feature tiers: every row on the GPU, or a cache there and every row in
    // pinned host memory, which must fit the host budget beside the topology and some staging. Else
    // (and on the CPU) the rows come from the host's source, in memory or on disk.
    const Device& lead = replicas[0].dev;
    topology_ = storage::topology_bytes(store);
    tiers_ = lead.is_cuda() && !opt_.features_on_disk &&
             (feature_room_default(lead) >= f32_bytes ||
              run.host_budget().in_use() + f32_bytes + topology_ + storage::HostFeatures::kStagingReserve <=
                  run.host_budget().limit());
    // Unless every feature row fits in half the GPU's room, the GPU sampler's topology goes to the
    // GPU when half the room holds it, and the features' GPU cache takes what is left of three
    // quarters: a row the cache misses costs a gather from pinned host memory (or, beyond the host's
    // memory, a disk read behind the host's cache, whose budget the topology then leaves alone), and
    // sampling on the GPU outruns sampling over UVA: R-MAT 25 (4.2 GiB of topology, 17.2 GB of
    // features, --gpu-mem-budget 10G) with every feature in pinned host memory took 11.7 s an epoch
    // with the topology read over UVA (H100), 4.9 s with it on the GPU (H200).
    const bool features_resident = lead.is_cuda() && feature_room_default(lead) >= f32_bytes;
    topology_on_gpus_ =
        !features_resident && opt_.gpu_sampler && std::all_of(replicas.begin(), replicas.end(), [&](const Replica& r) {
          return r.dev.is_cuda() && topology_ <= gpu_room(r.dev, opt_.gpu_mem_budget) / 2;
        });
  }

  // Whether every GPU replica gathers from its own feature tiers (else from the host's source).
  bool tiers() const { return tiers_; }
  bool topology_on_gpus() const { return topology_on_gpus_; }

  // The GPU room of dev's features: --feature-gpu-mem, else half the room, or what the topology
  // leaves of three quarters when it is on the GPU too.
  uint64_t feature_room(const Device& dev) const {
    if (opt_.feature_gpu_bytes > 0 || !topology_on_gpus_) return feature_room_default(dev);
    const uint64_t room = gpu_room(dev, opt_.gpu_mem_budget);
    return std::min(room / 2, room - room / 4 - topology_);
  }
  // The room of dev's GPU sampler's topology.
  uint64_t topology_room(const Device& dev) const {
    return topology_on_gpus_ ? gpu_room(dev, opt_.gpu_mem_budget) / 2 : GpuBatches::topology_room(dev, opt_.gpu_mem_budget);
  }

 private:
  // Features may take half of what the GPU budget (or 90% of the card) allows, the topology a
  // quarter (else the GPU sampler reads it from pinned host memory); the rest is for the model,
  // its activations and the batches' blocks.
  uint64_t feature_room_default(const Device& dev) const {
    return opt_.feature_gpu_bytes > 0 ? opt_.feature_gpu_bytes : gpu_room(dev, opt_.gpu_mem_budget) / 2;
  }

  const TrainOptions& opt_;
  uint64_t topology_ = 0;
  bool tiers_ = false, topology_on_gpus_ = false;
};

// A GPU sampler for r, unless it has one, is on the CPU or the run samples on the CPU. Made after
// the host's source has charged the topology it may pin (so a budget too small for it is exit 4,
// never the OOM killer), except the lead's when pre-sampling needs it first, which is then past
// that charge too.
void make_gpu_sampler(Replica& r, const TrainRun& run, const GpuRooms& rooms) {
  const TrainOptions& opt = run.opt();
  if (r.gpu_batches || !r.dev.is_cuda() || !opt.gpu_sampler) return;
  const UseDevice use(r.dev);
  r.gpu_batches = std::make_unique<GpuBatches>(run.store(), r.dev, opt.fanouts, rooms.topology_room(r.dev), opt.sampling,
                                               opt.model.edge_weights);
}

// --cache-rank sampled: the counts of one pre-sampled epoch, charged to the host budget while the
// caches are filled; drawn only once the host's source goes to disk.
struct PresampledReads {
  std::vector<uint32_t> reads;
  std::unique_ptr<kernels::cuda::BudgetCharge> charge;
  const std::vector<uint32_t>* drawn = nullptr;  // &reads once drawn
};

// The host's feature source: in memory, or the disk tier. Behind GPUs its cache skips the rows
// their caches hold, and leaves room for the pinned buffers of the batches' staged rows.
std::unique_ptr<storage::HostFeatures> make_host_source(const TrainRun& run, const GpuRooms& rooms,
                                                        std::vector<Replica>& replicas,
                                                        const sampler::NeighborSampler& cpu_sampler,
                                                        PresampledReads* presampled) {
  const TrainOptions& opt = run.opt();
  storage::HostFeatures::Options host;
  if (opt.cache_rank == TrainOptions::CacheRank::kSampled) {
    host.reads = [&run, &rooms, &replicas, &cpu_sampler, presampled]() -> const std::vector<uint32_t>* {
      const TrainOptions& o = run.opt();
      presampled->charge = std::make_unique<kernels::cuda::BudgetCharge>(
          &run.host_budget(), static_cast<uint64_t>(run.num_nodes()) * sizeof(uint32_t));
      Replica& lead = replicas[0];
      make_gpu_sampler(lead, run, rooms);
      presampled->reads = presample_reads(run.num_nodes(), run.train_ids(), o.batch_size, o.seed,
                                          [&](const int64_t* seeds, int64_t n, uint64_t key) {
                                            return sample_input_nodes(lead, cpu_sampler, seeds, n, key);
                                          });
      return presampled->drawn = &presampled->reads;
    };
  }
  host.budget = &run.host_budget();
  host.engine = opt.io_engine;
  host.force_disk = opt.features_on_disk;
  host.read_ahead_bytes = opt.read_ahead_bytes;
  host.topology_on_host = !rooms.topology_on_gpus();
  const Device& lead = replicas[0].dev;
  if (lead.is_cuda()) {
    host.skip_hottest = storage::cache_rows_within(run.store(), rooms.feature_room(lead));
    // Each GPU beyond the first also keeps kExtraGpuHostReserve of the budget unused: R-MAT 25
    // on 2 GPUs in an 8 GB cgroup was killed by the OOM killer with the budget one GPU leaves
    // the cache (peer mappings, NCCL, a second worker's pipeline: not yet broken down).
    host.keep_free = BatchFeatures::kStagedReserve * static_cast<uint64_t>(replicas.size()) +
                     Replicas::kExtraGpuHostReserve * static_cast<uint64_t>(replicas.size() - 1);
  }
  return std::make_unique<storage::HostFeatures>(run.store(), host);
}

// On a partitioned store with several workers in the run: which nodes are `rank`'s own (its
// parts', whose hot nodes its GPU cache holds first); else empty.
std::vector<uint8_t> own_nodes(const TrainRun& run, int rank) {
  std::vector<uint8_t> own;
  const storage::Store& store = run.store();
  if (run.world() <= 1 || !store.has_partition()) return own;
  own.resize(static_cast<size_t>(run.num_nodes()));
  for (int64_t v = 0; v < run.num_nodes(); ++v) own[static_cast<size_t>(v)] = store.partition()[v] % run.world() == rank;
  return own;
}

}  // namespace

void Replicas::place_batch_sources(const TrainRun& run, const sampler::NeighborSampler& cpu_sampler) {
  const TrainOptions& opt = run.opt();
  const GpuRooms rooms(run, replicas_);
  PresampledReads presampled;
  if (!rooms.tiers()) host_features_ = make_host_source(run, rooms, replicas_, cpu_sampler, &presampled);
  for (Replica& r : replicas_) {
    if (!r.dev.is_cuda()) continue;
    make_gpu_sampler(r, run, rooms);
    const UseDevice use(r.dev);
    if (!rooms.tiers()) {  // a GPU cache, each batch's other rows staged from the host's source
      r.batch_features = std::make_unique<BatchFeatures>(run.store(), r.dev, rooms.feature_room(r.dev), opt.match,
                                                         *host_features_, &run.host_budget(), presampled.drawn);
      continue;
    }
    // Workers share one pinned host copy of the features; on a partitioned store each GPU's cache
    // holds its own parts' hot nodes first.
    const std::vector<uint8_t> own = own_nodes(run, run.first_rank() + static_cast<int>(&r - replicas_.data()));
    r.batch_features = std::make_unique<BatchFeatures>(run.store(), r.dev, rooms.feature_room(r.dev), opt.match,
                                                       &r == &replicas_[0] ? nullptr : replicas_[0].batch_features.get(),
                                                       own.empty() ? nullptr : &own, &run.host_budget());
  }
}

std::vector<int64_t> sample_input_nodes(const Replica& r, const sampler::NeighborSampler& cpu, const int64_t* seeds,
                                        int64_t n, uint64_t key) {
  if (!r.gpu_batches) return cpu.sample(seeds, n, key).input_nodes();
  const UseDevice use(r.dev);
  return r.gpu_batches->sample(seeds, n, key, /*input_nodes_on_host=*/true).input_nodes_host();
}

uint64_t parameter_checksum(Model& model) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  for (Parameter* p : model.parameters()) {
    const std::vector<float> v = p->value.to_vector();
    XXH64_update(state, v.data(), v.size() * sizeof(float));
  }
  const uint64_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return h;
}

}  // namespace gale::engine::train_parts

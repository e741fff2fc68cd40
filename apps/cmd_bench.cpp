// `gale bench spmm STORE|--generate SPEC [--dims 32,64,128,256] [--kernels cusparse,gar,gas] [--runs 20]
//  [--warmup 5] [--json]`.
//
// Times Gale's CUDA SpMM kernels (fuseGNN's GAR and GAS, kernels/spmm.cu) against cuSPARSE on
// the same device inputs in the same run: the graph's CSR is uploaded once, with random edge
// weights (cuSPARSE's matrix values, so every kernel reads the same bytes), and for each width
// random features. Each kernel is timed with CUDA events around single launches, warm-up runs
// first, and reported as the median; GAR's and GAS's outputs are checked against cuSPARSE's.
// Benchmarks are programs, never assertions on time (shared/STYLE.md).
#include <boost/program_options.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "apps/bench_store.hpp"
#include "apps/commands.hpp"
#include "kernels/error.hpp"

#if GALE_WITH_CUDA
#include <tbb/info.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "engine/roofline.hpp"
#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/cuda/tc_plan.hpp"
#include "kernels/random.hpp"
#include "kernels/maxk.hpp"
#include "kernels/spmm.hpp"
#include "kernels/spmm_tc.hpp"
#include "storage/store.hpp"
#endif

namespace gale::apps {

namespace po = boost::program_options;

#if GALE_WITH_CUDA
namespace {

using kernels::SpmmKind;
using kernels::cuda::DeviceBuffer;

std::vector<float> random_floats(uint64_t key, size_t n, float lo, float hi) {
  std::vector<float> v(n);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n, 1 << 16), [&](const tbb::blocked_range<size_t>& r) {
    for (size_t i = r.begin(); i < r.end(); ++i) v[i] = lo + (hi - lo) * kernels::random_uniform(key, i);
  });
  return v;
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (static_cast<double>(v[n / 2 - 1]) + v[n / 2]);
}

// max |a - b| over n elements, through cuBLAS (a is overwritten with a - b); with `relative`, also
// ||a - b|| / ||b||.
double max_abs_difference(const kernels::cuda::CublasHandle& blas, float* a, const float* b, int64_t n,
                          cudaStream_t stream, double* relative = nullptr) {
  if (n == 0) return 0.0;
  const float minus_one = -1.0f;
  GALE_CHECK_CUBLAS(cublasSaxpy_64(blas, n, &minus_one, b, 1, a, 1));
  int64_t index = 0;  // 1-based
  GALE_CHECK_CUBLAS(cublasIsamax_64(blas, n, a, 1, &index));
  float value = 0.0f, diff_norm = 0.0f, base_norm = 0.0f;
  if (relative) {  // host-pointer results: these calls wait for the stream
    GALE_CHECK_CUBLAS(cublasSnrm2_64(blas, n, a, 1, &diff_norm));
    GALE_CHECK_CUBLAS(cublasSnrm2_64(blas, n, b, 1, &base_norm));
    *relative = base_norm > 0.0f ? static_cast<double>(diff_norm) / base_norm : 0.0;
  }
  kernels::cuda::copy_to_host(&value, a + (index - 1), 1, stream);
  GALE_CHECK_CUDA(cudaStreamSynchronize(stream));
  return std::fabs(value);
}

void check_runs(int runs, int warmup) {
  if (runs < 1) throw InputError("--runs: expected at least 1, found " + std::to_string(runs));
  if (warmup < 0) throw InputError("--warmup: expected 0 or more, found " + std::to_string(warmup));
}

// What both SpMM benchmarks time on: the store's CSR on GPU 0 with random edge weights (cuSPARSE's
// matrix values, so every kernel reads the same bytes), one stream with its pool and cuBLAS
// handle, and CUDA events around single launches.
class BenchGpu {
 public:
  // Checks the store (or the generator spec) and GPU 0 before generating anything, so a bad spec
  // is reported as such on any machine; `command` names the benchmark in messages.
  BenchGpu(const std::string& store_path, const std::string& generate, const std::string& command)
      : source(checked_source(store_path, generate, command)),
        store(storage::Store::open(source.path())),
        host(store.csr()),
        rows(host.rows),
        cols(host.cols),
        nnz(host.nnz()),
        info(kernels::cuda::device_info(0)),
        guard(0),
        pool(0),
        stream(0),
        blas(stream, pool),
        indptr(uploaded(host.indptr, rows + 1)),
        indices(kernels::cuda::to_device(pool, host.indices, static_cast<size_t>(nnz), stream)),
        weights(kernels::cuda::to_device(pool, random_floats(1, static_cast<size_t>(nnz), 0.5f, 1.5f), stream)),
        graph{rows, cols, indptr.data(), indices.data(), nullptr} {}

  // The median of `runs` launches timed with CUDA events, after `warmup` untimed ones.
  template <typename Launch>
  double time_median(const Launch& launch, int runs, int warmup) {
    for (int i = 0; i < warmup; ++i) launch();
    std::vector<float> times;
    for (int i = 0; i < runs; ++i) {
      start_.record(stream);
      launch();
      stop_.record(stream);
      times.push_back(kernels::cuda::elapsed_ms(start_, stop_));
    }
    return median(times);
  }

  // n uniform floats in [-1, 1) on the device, drawn from `key`.
  DeviceBuffer<float> random_matrix(uint64_t key, int64_t n) {
    return kernels::cuda::to_device(pool, random_floats(key, static_cast<size_t>(n), -1.0f, 1.0f), stream);
  }

  const BenchStore source;
  const storage::Store store;
  const kernels::CsrView host;
  const int64_t rows, cols, nnz;
  const kernels::cuda::DeviceInfo info;
  kernels::cuda::DeviceGuard guard;
  kernels::cuda::MemoryPool pool;
  kernels::cuda::Stream stream;
  kernels::cuda::CublasHandle blas;
  const DeviceBuffer<int64_t> indptr;
  const DeviceBuffer<int32_t> indices;
  const DeviceBuffer<float> weights;
  const kernels::CsrView graph;  // the device's copy

 private:
  static BenchStore checked_source(const std::string& store_path, const std::string& generate,
                                   const std::string& command) {
    BenchStore::check(store_path, generate, command);
    kernels::cuda::require_device(0);
    return BenchStore(store_path, generate, command);
  }
  DeviceBuffer<int64_t> uploaded(const int64_t* indptr_of_host, int64_t count) {
    // A store's indptr starts at 0, so the uploaded indices line up with it.
    GALE_ASSERT(indptr_of_host[0] == 0);
    return kernels::cuda::to_device(pool, indptr_of_host, static_cast<size_t>(count), stream);
  }

  kernels::cuda::Event start_{0, kernels::cuda::Event::Timing::kEnabled};
  kernels::cuda::Event stop_{0, kernels::cuda::Event::Timing::kEnabled};
};

// ---- gale bench spmm ------------------------------------------------------------------------------

struct SpmmFlags {
  std::string store_path, generate, dims_text = "32,64,128,256", kernels_text = "cusparse,gar,gas";
  int runs = 20, warmup = 5;
  bool json = false;
};

po::options_description describe_spmm_flags(SpmmFlags* f) {
  po::options_description desc(
      "usage: gale bench spmm STORE [options]\n"
      "       gale bench spmm --generate rmat:scale=S,edge-factor=E [options]\n\n"
      "Times Gale's GAR and GAS SpMM kernels against cuSPARSE (CSR, ALG2) on GPU 0: median of --runs\n"
      "launches timed with CUDA events after --warmup launches, for each feature width.\n"
      "With --maxk 16,32: MaxK-GNN's top-k, SpGEMM and SSpMM instead ('gale bench spmm --maxk 32 --help').\n\n"
      "options");
  desc.add_options()
      ("help,h", "show this help")
      ("generate", po::value(&f->generate), "build this generated graph in a temporary store (deleted after)")
      ("dims", po::value(&f->dims_text), "feature widths, comma separated (default 32,64,128,256)")
      ("kernels", po::value(&f->kernels_text),
       "kernels to time, comma separated, from cusparse, gar, gas, memory-aware, auto, gar-scan (GAR "
       "finding its long rows by scanning and in chunks of 16 rows, as without the graph's list and chunk rule), sampled:S[:fastrand|:bucket] "
       "(ES-SpMM's edge-sampled estimate from at most S entries a row), tc[:32|:64] (TC-GNN's tensor-core SpMM in TF32, "
       "over the graph translated once on the host; 32 or 64 output columns a warp); default cusparse,gar,gas; "
       "speedups and errors are against cusparse when it is listed")
      ("runs", po::value(&f->runs), "timed launches per kernel and width (default 20)")
      ("warmup", po::value(&f->warmup), "untimed launches first (default 5)")
      ("json", po::bool_switch(&f->json), "one JSON object per result row instead of the table")
      ("store", po::value(&f->store_path), "store directory");
  return desc;
}

// --dims for `bench spmm`: at least one width, each at least 1.
std::vector<int> parse_spmm_widths(const std::string& text) {
  const std::vector<int> dims = parse_int_list(text, "--dims");
  if (dims.empty()) throw InputError("--dims: expected at least one width");
  for (int d : dims)
    if (d < 1) throw InputError("--dims: widths must be at least 1, found " + std::to_string(d));
  return dims;
}

// A kernel --kernels names, with what its launch needs beyond the graph.
struct BenchKernel {
  SpmmKind kind;
  std::string name;
  bool listed = true;  // GAR and auto get the graph's long-row list, as training passes it; gar-scan runs GAR without
  int64_t sample_width = 0;
  kernels::SpmmSampling sampling = kernels::SpmmSampling::kFastRand;
  int tc_slice = 0;
};

// --kernels in timing order: cuSPARSE, when listed, first (the speedups and errors are measured
// against it; *with_cusparse says whether it is).
std::vector<BenchKernel> parse_spmm_kernels(const std::string& text, bool* with_cusparse) {
  std::vector<BenchKernel> kinds;
  *with_cusparse = false;
  for (const std::string& name : split_list(text)) {
    if (name == "cusparse") *with_cusparse = true;
    else if (name == "gar") kinds.push_back({SpmmKind::kGar, name});
    else if (name == "gar-scan") kinds.push_back({SpmmKind::kGar, name, false});
    else if (name == "gas") kinds.push_back({SpmmKind::kGas, name});
    else if (name == "auto") kinds.push_back({SpmmKind::kAuto, name});
    else if (name == "memory-aware") kinds.push_back({SpmmKind::kMemoryAware, name});
    else if (name == "tc" || name == "tc:32" || name == "tc:64") {
      BenchKernel k{SpmmKind::kTensorCore, name};
      k.tc_slice = name == "tc" ? 0 : std::stoi(name.substr(3));
      kinds.push_back(k);
    }
    else if (name.rfind("sampled", 0) == 0) {
      BenchKernel k{SpmmKind::kSampled, name};
      try {
        parse_inference_spmm(name, &k.sample_width, &k.sampling);
      } catch (const InputError& e) {
        throw InputError(std::string("--kernels: ") + e.what());
      }
      kinds.push_back(k);
    } else
      throw InputError("--kernels: expected cusparse, gar, gar-scan, gas, memory-aware, auto, tc[:32|:64] or sampled:S, found '" +
                       name + "'");
  }
  if (*with_cusparse) kinds.insert(kinds.begin(), {SpmmKind::kCusparse, "cusparse"});
  if (kinds.empty()) throw InputError("--kernels: expected at least one kernel");
  return kinds;
}

// What GAR gets from the graph, once, as GraphOperand finds it for training: the list of its long
// rows, and the chunk of rows a block takes (gar and auto; gar-scan keeps 16 and scans).
struct GarRows {
  explicit GarRows(BenchGpu& g)
      : capacity(kernels::gar_long_rows_capacity(g.rows, g.nnz)),
        list(g.pool, static_cast<size_t>(std::max<int64_t>(capacity, 1)), g.stream),
        count(g.pool, 1, g.stream),
        chunk_rows(kernels::gar_chunk_rows_for(g.host)) {
    kernels::gar_long_rows_cuda(g.graph, list.data(), capacity, count.data(), g.stream);
    listed = kernels::cuda::to_host_and_wait(count.view(), g.stream)[0];
  }
  const int64_t capacity;
  DeviceBuffer<int64_t> list;
  DeviceBuffer<int64_t> count;
  const int64_t chunk_rows;
  int64_t listed = 0;
};

// TC-GNN's translation of the graph, made once on the host and uploaded; *line says what it took.
kernels::cuda::DeviceTcPlan translate_for_tc(BenchGpu& g, std::string* line) {
  const auto t0 = std::chrono::steady_clock::now();
  const kernels::SpmmTcTranslation t = kernels::spmm_tc_translate(g.host);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  kernels::cuda::DeviceTcPlan plan(g.pool, t, g.stream);
  char text[256];
  std::snprintf(text, sizeof text, "tc plan: %.0f ms on %d threads, %zu blocks of 16 x 8 (%.1f%% full), %zu items, %.0f MB\n",
                ms, tbb::this_task_arena::max_concurrency(), t.block_src.size() / kernels::kTcBlockCols,
                100.0 * t.density(), t.item_window.size(), static_cast<double>(t.bytes()) / 1e6);
  *line = text;
  return plan;
}

void print_spmm_header(const BenchGpu& g, const GarRows& gar, const std::string& tc_line, const SpmmFlags& f) {
  std::printf("device: %s\ngraph: %s, %lld rows, %lld entries (avg degree %.1f), %lld rows of more than %lld, "
              "GAR chunks of %lld rows\n",
              g.info.name.c_str(), g.source.label().c_str(), static_cast<long long>(g.rows),
              static_cast<long long>(g.nnz), g.rows ? static_cast<double>(g.nnz) / g.rows : 0.0,
              static_cast<long long>(gar.listed), static_cast<long long>(kernels::kGarLongRow),
              static_cast<long long>(gar.chunk_rows));
  std::printf("%s", tc_line.c_str());
  std::printf("median of %d runs after %d warm-up, CUDA events; speedup = cusparse_ms / kernel_ms\n", f.runs, f.warmup);
  std::printf("%6s  %-18s %10s %9s %9s %12s %10s\n", "width", "kernel", "median_ms", "speedup", "GB/s", "max_abs_err",
              "rel_err");
}

struct Row {
  int64_t width = 0;
  std::string kernel;
  double ms = 0.0;
  double speedup = 0.0;       // cusparse_ms / ms
  double gbps = 0.0;
  double max_abs_err = 0.0;   // against cuSPARSE's output; 0 for cuSPARSE itself
  double rel_err = 0.0;       // ||out - cuSPARSE's|| / ||cuSPARSE's|| (the sampled kernels' estimate error)
  std::string skipped;        // spmm_cannot's reason when the kernel could not run
};

// The arguments of `kernel`'s launch over x (cols x w) into out (rows x w).
kernels::SpmmArgs spmm_args(const BenchGpu& g, const GarRows& gar, const kernels::cuda::DeviceTcPlan& tc,
                            const BenchKernel& kernel, const float* x, float* out, int64_t w) {
  kernels::SpmmArgs a;
  a.graph = g.graph;
  a.x = kernels::ConstMatrixView{x, g.cols, w, w};
  a.out = kernels::MatrixView{out, g.rows, w, w};
  a.edge_weight = g.weights.data();
  a.nnz = g.nnz;
  a.sample_width = kernel.sample_width;
  a.sampling = kernel.sampling;
  if (kernel.listed) {
    a.long_rows = {gar.list.data(), gar.count.data(), gar.capacity};
    a.gar_chunk_rows = gar.chunk_rows;
  }
  if (kernel.kind == SpmmKind::kTensorCore) a.tc = tc.plan();
  a.tc_slice = kernel.tc_slice;
  return a;
}

// Each kernel at width w over the same random x, its output kept in *outputs (one per kernel, in
// order) for the comparison with cuSPARSE's.
std::vector<Row> time_spmm_kernels(BenchGpu& g, const GarRows& gar, const kernels::cuda::DeviceTcPlan& tc,
                                   const std::vector<BenchKernel>& kernels, int64_t w, const SpmmFlags& f,
                                   std::vector<DeviceBuffer<float>>* outputs) {
  const DeviceBuffer<float> x = g.random_matrix(kernels::derive_key(2, static_cast<uint64_t>(w)), g.cols * w);
  // Bytes the product must move at least once: the CSR with its weights, the gathered source
  // rows, the output (the model `gale bench train`'s roofline takes for aggregations).
  const double bytes = engine::spmm_min_bytes(g.rows, g.nnz, w, 4);
  std::vector<Row> results;
  for (const BenchKernel& kernel : kernels) {
    outputs->emplace_back(g.pool, static_cast<size_t>(g.rows * w), g.stream);
    const kernels::SpmmArgs a = spmm_args(g, gar, tc, kernel, x.data(), outputs->back().data(), w);
    Row row;
    row.width = w;
    row.kernel = kernel.name;
    row.skipped = kernels::spmm_cannot(kernel.kind, a);
    if (row.skipped.empty()) {
      row.ms = g.time_median([&] { kernels::spmm_cuda(kernel.kind, a, g.stream); }, f.runs, f.warmup);
      row.gbps = bytes / (row.ms * 1e6);
    }
    results.push_back(row);
  }
  return results;
}

// Speedups and errors against the first row's cuSPARSE, when it is there and ran.
bool compare_with_cusparse(BenchGpu& g, bool with_cusparse, std::vector<Row>* results,
                           std::vector<DeviceBuffer<float>>* outputs) {
  const Row& base = (*results)[0];
  const bool have_base = with_cusparse && base.skipped.empty();
  for (size_t k = 0; k < results->size(); ++k) {
    Row& row = (*results)[k];
    if (!row.skipped.empty()) continue;
    row.speedup = have_base ? base.ms / row.ms : 0.0;
    if (k > 0 && have_base)
      row.max_abs_err = max_abs_difference(g.blas, (*outputs)[k].data(), (*outputs)[0].data(), g.rows * row.width,
                                           g.stream, &row.rel_err);
  }
  return have_base;
}

void print_spmm_rows(const BenchGpu& g, const std::vector<Row>& results, bool have_base, const SpmmFlags& f) {
  // Without cuSPARSE in the run there is no speedup and no error to report: null / "-".
  const auto number = [&](const char* format, double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), format, v);
    return std::string(have_base ? buf : f.json ? "null" : "-");
  };
  for (const Row& row : results) {
    if (f.json) {
      if (row.skipped.empty()) {
        std::printf("{\"bench\":\"spmm\",\"device\":\"%s\",\"rows\":%lld,\"nnz\":%lld,\"width\":%lld,"
                    "\"kernel\":\"%s\",\"median_ms\":%.4f,\"speedup_vs_cusparse\":%s,\"gbps\":%.1f,"
                    "\"max_abs_err\":%s,\"rel_err\":%s,\"runs\":%d,\"warmup\":%d}\n",
                    g.info.name.c_str(), static_cast<long long>(g.rows), static_cast<long long>(g.nnz),
                    static_cast<long long>(row.width), row.kernel.c_str(), row.ms,
                    number("%.3f", row.speedup).c_str(), row.gbps, number("%.3g", row.max_abs_err).c_str(),
                    number("%.3g", row.rel_err).c_str(), f.runs, f.warmup);
      } else {
        std::printf("{\"bench\":\"spmm\",\"width\":%lld,\"kernel\":\"%s\",\"skipped\":\"%s\"}\n",
                    static_cast<long long>(row.width), row.kernel.c_str(), row.skipped.c_str());
      }
    } else if (row.skipped.empty()) {
      std::printf("%6lld  %-18s %10.3f %9s %9.1f %12s %10s\n", static_cast<long long>(row.width),
                  row.kernel.c_str(), row.ms, number("%.2fx", row.speedup).c_str(), row.gbps,
                  number("%.3g", row.max_abs_err).c_str(), number("%.3g", row.rel_err).c_str());
    } else {
      std::printf("%6lld  %-18s skipped: %s\n", static_cast<long long>(row.width), row.kernel.c_str(),
                  row.skipped.c_str());
    }
  }
  std::fflush(stdout);
}

int bench_spmm(const std::vector<std::string>& args) {
  SpmmFlags f;
  const po::options_description desc = describe_spmm_flags(&f);
  po::variables_map vm;
  if (!parse_store_command_line(args, desc, &vm)) return 0;
  const std::vector<int> dims = parse_spmm_widths(f.dims_text);
  check_runs(f.runs, f.warmup);
  bool with_cusparse = false;
  const std::vector<BenchKernel> kernels = parse_spmm_kernels(f.kernels_text, &with_cusparse);

  BenchGpu g(f.store_path, f.generate, "bench spmm");
  const GarRows gar(g);
  kernels::cuda::DeviceTcPlan tc_plan;
  std::string tc_line;
  if (std::any_of(kernels.begin(), kernels.end(), [](const BenchKernel& k) { return k.kind == SpmmKind::kTensorCore; }))
    tc_plan = translate_for_tc(g, &tc_line);
  if (!f.json) print_spmm_header(g, gar, tc_line, f);
  for (int width : dims) {
    std::vector<DeviceBuffer<float>> outputs;
    std::vector<Row> results = time_spmm_kernels(g, gar, tc_plan, kernels, width, f, &outputs);
    const bool have_base = compare_with_cusparse(g, with_cusparse, &results, &outputs);
    print_spmm_rows(g, results, have_base, f);
  }
  return 0;
}

// ---- gale bench spmm --maxk ------------------------------------------------------------------------

struct MaxkFlags {
  std::string store_path, generate, dims_text = "256", ks_text;
  int runs = 20, warmup = 5;
  bool json = false;
};

po::options_description describe_maxk_flags(MaxkFlags* f) {
  po::options_description desc(
      "usage: gale bench spmm STORE|--generate SPEC --maxk 8,16,32 [options]\n\n"
      "Times MaxK-GNN's top-k, SpGEMM (forward) and SSpMM (backward) kernels against cuSPARSE SpMM\n"
      "(CSR, ALG2) at the dense width on GPU 0: median of --runs launches after --warmup.\n\n"
      "options");
  desc.add_options()
      ("help,h", "show this help")
      ("maxk", po::value(&f->ks_text)->required(), "kept values per row, comma separated (each 1 to the width)")
      ("generate", po::value(&f->generate), "build this generated graph in a temporary store (deleted after)")
      ("dims", po::value(&f->dims_text), "dense widths, comma separated (default 256)")
      ("runs", po::value(&f->runs), "timed launches per kernel (default 20)")
      ("warmup", po::value(&f->warmup), "untimed launches first (default 5)")
      ("json", po::bool_switch(&f->json), "one JSON object per result row instead of the table")
      ("store", po::value(&f->store_path), "store directory");
  return desc;
}

// --dims and --maxk: widths the MaxK kernels take, and k from 1 to the widest width.
void parse_maxk_shapes(const MaxkFlags& f, std::vector<int>* dims, std::vector<int>* ks) {
  *dims = parse_int_list(f.dims_text, "--dims");
  *ks = parse_int_list(f.ks_text, "--maxk");
  if (dims->empty() || ks->empty()) throw InputError("--dims, --maxk: expected at least one value each");
  for (int d : *dims)
    if (d < 1 || d > kernels::kMaxkCudaMaxWidth)
      throw InputError("--dims: widths must be 1 to " + std::to_string(kernels::kMaxkCudaMaxWidth) + " with --maxk, found " +
                       std::to_string(d));
  const int widest = *std::max_element(dims->begin(), dims->end());
  for (int k : *ks) {
    if (k < 1) throw InputError("--maxk: expected values of at least 1, found " + std::to_string(k));
    if (k > widest)
      throw InputError("--maxk " + std::to_string(k) + ": expected at most the widest --dims width (" +
                       std::to_string(widest) + ")");
  }
}

// MaxK's edge groups, built once per graph on the GPU (timed) and shared by both aggregations.
struct EdgeGroups {
  EdgeGroups(BenchGpu& g, const MaxkFlags& f)
      : capacity(kernels::edge_groups_capacity(g.rows, g.nnz)),
        groups(g.pool, static_cast<size_t>(capacity), g.stream),
        count(g.pool, 1, g.stream),
        workspace_bytes(kernels::edge_groups_workspace_bytes(g.rows)),
        workspace(g.pool, workspace_bytes, g.stream) {
    ms = g.time_median([&] {
      kernels::edge_groups_cuda(g.graph, kernels::kMaxkEdgeGroupSize, groups.data(), capacity, count.data(),
                                workspace.data(), workspace_bytes, g.stream);
    }, f.runs, f.warmup);
    total = kernels::cuda::to_host_and_wait(count.view(), g.stream)[0];
  }
  kernels::EdgeGroupsView view() const { return {groups.data(), capacity, count.data()}; }

  const int64_t capacity;
  DeviceBuffer<kernels::EdgeGroup> groups;
  DeviceBuffer<int64_t> count;
  const size_t workspace_bytes;
  DeviceBuffer<uint8_t> workspace;
  double ms = 0;
  int64_t total = 0;
};

void print_maxk_header(const BenchGpu& g, const EdgeGroups& groups, const MaxkFlags& f) {
  std::printf("device: %s\ngraph: %s, %lld rows, %lld entries (avg degree %.1f), %lld edge groups of <= %lld "
              "built in %.3f ms\n",
              g.info.name.c_str(), g.source.label().c_str(), static_cast<long long>(g.rows),
              static_cast<long long>(g.nnz), g.rows ? static_cast<double>(g.nnz) / g.rows : 0.0,
              static_cast<long long>(groups.total), static_cast<long long>(kernels::kMaxkEdgeGroupSize), groups.ms);
  std::printf("median of %d runs after %d warm-up, CUDA events; speedup = cusparse_ms / kernel_ms\n", f.runs, f.warmup);
  std::printf("max_abs_err: spgemm against cuSPARSE on the densified input, sspmm-flat (global atomics only) "
              "against sspmm (with the hub plan)\n");
  std::printf("%6s %5s  %-10s %10s %9s %12s\n", "width", "k", "kernel", "median_ms", "speedup", "max_abs_err");
}

// One result row of `bench spmm --maxk`, as a table line or a JSON object.
void print_maxk_row(const BenchGpu& g, const EdgeGroups& groups, const MaxkFlags& f, int64_t w, int64_t k,
                    const char* kernel, double ms, double base_ms, double err) {
  const double speedup = ms > 0 ? base_ms / ms : 0.0;
  if (f.json) {
    std::printf("{\"bench\":\"spmm_maxk\",\"device\":\"%s\",\"rows\":%lld,\"nnz\":%lld,\"width\":%lld,\"k\":%lld,"
                "\"kernel\":\"%s\",\"median_ms\":%.4f,\"speedup_vs_cusparse\":%.3f,\"max_abs_err\":%.3g,"
                "\"edge_groups\":%lld,\"edge_groups_ms\":%.4f,\"runs\":%d,\"warmup\":%d}\n",
                g.info.name.c_str(), static_cast<long long>(g.rows), static_cast<long long>(g.nnz),
                static_cast<long long>(w), static_cast<long long>(k), kernel, ms, speedup, err,
                static_cast<long long>(groups.total), groups.ms, f.runs, f.warmup);
  } else {
    std::printf("%6lld %5lld  %-10s %10.3f %8.2fx %12.3g\n", static_cast<long long>(w), static_cast<long long>(k),
                kernel, ms, speedup, err);
  }
}

// MaxK's four timings at one width and k, with the errors of SpGEMM (against cuSPARSE on the
// densified CBSR input) and of sspmm-flat (against sspmm with the hub plan).
struct MaxkTimes {
  double topk_ms = 0, spgemm_ms = 0, sspmm_ms = 0, flat_ms = 0;
  double spgemm_err = 0, sspmm_err = 0;
};

// SSpMM's backward of `grad` at CBSR's pattern, flat and then with the graph's hub plan for k;
// *err is the flat result's distance from the planned one.
void time_sspmm(BenchGpu& g, const EdgeGroups& groups, const MaxkFlags& f, const kernels::CbsrView& cbsr,
                const float* grad, MaxkTimes* t) {
  const int64_t w = cbsr.width, k = cbsr.k;
  DeviceBuffer<float> grad_values(g.pool, static_cast<size_t>(g.cols * k), g.stream);
  kernels::SspmmCbsrArgs b;
  b.graph = g.graph;
  b.grad_out = kernels::ConstMatrixView{grad, g.rows, w, w};
  b.pattern = cbsr;
  b.grad_values = grad_values.data();
  b.edge_weight = g.weights.data();
  // SSpMM with global atomics only (sspmm-flat), then as training runs it: with the graph's hub
  // plan for this k (built once per graph and k, like the edge groups) from k = 32 on, else
  // the same as sspmm-flat. Both write the same buffer: its lines' L2 priority (the atomics
  // mark half of them evict-last) outlives a run, and a second buffer would time the later
  // kernel against the first one's leftovers.
  t->flat_ms = g.time_median([&] { kernels::sspmm_cbsr_cuda(b, groups.view(), g.stream); }, f.runs, f.warmup);
  DeviceBuffer<float> flat_values(g.pool, static_cast<size_t>(g.cols * k), g.stream);
  kernels::cuda::copy_on_device(flat_values.data(), grad_values.data(), static_cast<size_t>(g.cols * k), g.stream);
  const int hub_capacity = kernels::sspmm_hub_capacity(k);
  DeviceBuffer<int32_t> hub_ids(g.pool, static_cast<size_t>(std::max(hub_capacity, 1)), g.stream);
  DeviceBuffer<uint32_t> hub_mask(g.pool, static_cast<size_t>(std::max<int64_t>(kernels::sspmm_hub_mask_words(g.nnz), 1)),
                                  g.stream);
  const size_t hub_ws_bytes = kernels::sspmm_hubs_workspace_bytes(g.cols);
  DeviceBuffer<uint8_t> hub_ws(g.pool, hub_ws_bytes, g.stream);
  if (hub_capacity > 0 && k >= kernels::kSspmmHubMinK) {
    kernels::sspmm_hubs_cuda(g.graph, hub_capacity, kernels::kSspmmHubMinEntries, hub_ids.data(), hub_mask.data(), g.nnz,
                             hub_ws.data(), hub_ws_bytes, g.stream);
    b.hubs = kernels::SspmmHubsView{hub_ids.data(), hub_mask.data(), hub_capacity};
  }
  t->sspmm_ms = g.time_median([&] { kernels::sspmm_cbsr_cuda(b, groups.view(), g.stream); }, f.runs, f.warmup);
  t->sspmm_err = max_abs_difference(g.blas, flat_values.data(), grad_values.data(), g.cols * k, g.stream);
}

// The top-k of x into CBSR, the SpGEMM over it (checked against cuSPARSE on the densified CBSR)
// and the SSpMM of `grad` at its pattern, at `dense`'s width and k.
MaxkTimes time_maxk(BenchGpu& g, const EdgeGroups& groups, const MaxkFlags& f, const kernels::SpmmArgs& dense,
                    const float* grad, int64_t k) {
  const int64_t w = dense.x.cols;
  MaxkTimes t;
  DeviceBuffer<float> values(g.pool, static_cast<size_t>(g.cols * k), g.stream);
  DeviceBuffer<uint8_t> index(g.pool, static_cast<size_t>(kernels::cbsr_index_size_bytes(g.cols, w, k)), g.stream);
  const kernels::CbsrView cbsr{g.cols, w, k, values.data(), index.data()};
  t.topk_ms = g.time_median([&] { kernels::maxk_forward_cuda(dense.x, cbsr, g.stream); }, f.runs, f.warmup);
  DeviceBuffer<float> out(g.pool, static_cast<size_t>(g.rows * w), g.stream);
  kernels::SpgemmCbsrArgs fw;
  fw.graph = g.graph;
  fw.x = cbsr;
  fw.out = kernels::MatrixView{out.data(), g.rows, w, w};
  fw.edge_weight = g.weights.data();
  t.spgemm_ms = g.time_median([&] { kernels::spgemm_cbsr_cuda(fw, groups.view(), g.stream); }, f.runs, f.warmup);
  time_sspmm(g, groups, f, cbsr, grad, &t);
  // cuSPARSE on the densified CBSR gives the reference for SpGEMM's output.
  DeviceBuffer<float> densified(g.pool, static_cast<size_t>(g.cols * w), g.stream);
  kernels::cbsr_to_dense_cuda(cbsr, kernels::MatrixView{densified.data(), g.cols, w, w}, g.stream);
  DeviceBuffer<float> reference(g.pool, static_cast<size_t>(g.rows * w), g.stream);
  kernels::SpmmArgs check = dense;
  check.x = kernels::ConstMatrixView{densified.data(), g.cols, w, w};
  check.out = kernels::MatrixView{reference.data(), g.rows, w, w};
  kernels::spmm_cuda(SpmmKind::kCusparse, check, g.stream);
  t.spgemm_err = max_abs_difference(g.blas, out.data(), reference.data(), g.rows * w, g.stream);
  return t;
}

// `gale bench spmm --maxk 8,16,32 ...`: MaxK-GNN's kernels (kernels/maxk.cu) against cuSPARSE's SpMM
// at the dense width, on the same graph and edge weights: for each width and k, the top-k of a
// random dense x into CBSR, the forward SpGEMM over it and the backward SSpMM of a random
// gradient at its pattern, each the median of --runs launches timed with CUDA events. The
// SpGEMM output is checked against cuSPARSE on the densified CBSR input. The edge-group table is
// built once per graph on the GPU (its time is printed) and shared by both aggregations.
int bench_spmm_maxk(const std::vector<std::string>& args) {
  MaxkFlags f;
  const po::options_description desc = describe_maxk_flags(&f);
  po::variables_map vm;
  if (!parse_store_command_line(args, desc, &vm)) return 0;
  std::vector<int> dims, ks;
  parse_maxk_shapes(f, &dims, &ks);
  check_runs(f.runs, f.warmup);

  BenchGpu g(f.store_path, f.generate, "bench spmm --maxk");
  const EdgeGroups groups(g, f);
  if (!f.json) print_maxk_header(g, groups, f);
  for (int width : dims) {
    const int64_t w = width;
    const DeviceBuffer<float> x = g.random_matrix(kernels::derive_key(2, static_cast<uint64_t>(w)), g.cols * w);
    const DeviceBuffer<float> grad = g.random_matrix(kernels::derive_key(3, static_cast<uint64_t>(w)), g.rows * w);
    DeviceBuffer<float> dense_out(g.pool, static_cast<size_t>(g.rows * w), g.stream);
    kernels::SpmmArgs dense;
    dense.graph = g.graph;
    dense.x = kernels::ConstMatrixView{x.data(), g.cols, w, w};
    dense.out = kernels::MatrixView{dense_out.data(), g.rows, w, w};
    dense.edge_weight = g.weights.data();
    dense.nnz = g.nnz;
    const double base_ms =
        g.time_median([&] { kernels::spmm_cuda(SpmmKind::kCusparse, dense, g.stream); }, f.runs, f.warmup);
    print_maxk_row(g, groups, f, w, w, "cusparse", base_ms, base_ms, 0.0);
    for (int kk : ks) {
      const int64_t k = kk;
      if (k > w) {  // a narrower width than this k: said, not measured
        std::fprintf(stderr, "gale: --maxk %lld skipped at width %lld (k is at most the width)\n",
                     static_cast<long long>(k), static_cast<long long>(w));
        continue;
      }
      const MaxkTimes t = time_maxk(g, groups, f, dense, grad.data(), k);
      print_maxk_row(g, groups, f, w, k, "topk", t.topk_ms, base_ms, 0.0);
      print_maxk_row(g, groups, f, w, k, "spgemm", t.spgemm_ms, base_ms, t.spgemm_err);
      print_maxk_row(g, groups, f, w, k, "sspmm", t.sspmm_ms, base_ms, 0.0);
      print_maxk_row(g, groups, f, w, k, "sspmm-flat", t.flat_ms, base_ms, t.sspmm_err);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
#endif

int run_bench(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::puts("usage: gale bench spmm STORE|--generate SPEC [--dims 32,64,128,256] [--kernels cusparse,gar,gas]\n"
              "                  [--maxk 16,32] [--runs 20] [--warmup 5] [--json]\n"
              "       gale bench train STORE|--generate SPEC [--models gcn,sage,gin,gat] [--layers 3] [--hidden 256] ...\n"
              "       gale bench sample STORE|--generate SPEC [--fanouts 15,10,5] [--batch-size 1024] [--batches 50]\n"
              "                  [--warmup 5] [--samplers gpu,cpu] [--topology gpu|host|auto] [--json]\n"
              "       gale bench gather STORE|--generate SPEC [--fanouts 15,10,5] [--batch-size 1024] [--batches 50]\n"
              "                  [--feature-gpu-mem all,256M,1M] [--match on,off] [--json]\n"
              "       gale bench pipeline STORE|--generate SPEC [--model sage] [--layers 3] [--hidden 256]\n"
              "                  [--fanouts 15,10,5] [--batch-size 1024] [--epochs 3] [--warmup 1] [--device D] ... [--json]\n"
              "       gale bench io STORE [--seconds 3] [--queue-depth 64] [--io-engine auto|io_uring|pread]\n"
              "`gale bench NAME --help` lists a benchmark's options.");
    return args.empty() ? static_cast<int>(ExitCode::kInput) : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "train") return run_bench_train(rest);
  if (args[0] == "io") return run_bench_io(rest);
  if (args[0] == "sample" || args[0] == "gather" || args[0] == "pipeline") return run_bench_minibatch(args[0], rest);
  if (args[0] == "spmm") {
#if GALE_WITH_CUDA
    const bool maxk = std::any_of(rest.begin(), rest.end(), [](const std::string& a) { return a.rfind("--maxk", 0) == 0; });
    return maxk ? bench_spmm_maxk(rest) : bench_spmm(rest);
#else
    throw DeviceError("bench spmm: this build has no CUDA backend");
#endif
  }
  throw InputError("bench: unknown benchmark '" + args[0] + "' (expected spmm, train, sample, gather, pipeline or io)");
}

}  // namespace gale::apps

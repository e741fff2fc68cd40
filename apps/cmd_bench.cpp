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

int bench_spmm(const std::vector<std::string>& args) {
  std::string store_path, generate, dims_text = "32,64,128,256", kernels_text = "cusparse,gar,gas";
  int runs = 20, warmup = 5;
  bool json = false;
  po::options_description desc(
      "usage: gale bench spmm STORE [options]\n"
      "       gale bench spmm --generate rmat:scale=S,edge-factor=E [options]\n\n"
      "Times Gale's GAR and GAS SpMM kernels against cuSPARSE (CSR, ALG2) on GPU 0: median of --runs\n"
      "launches timed with CUDA events after --warmup launches, for each feature width.\n"
      "With --maxk 16,32: MaxK-GNN's top-k, SpGEMM and SSpMM instead ('gale bench spmm --maxk 32 --help').\n\n"
      "options");
  desc.add_options()
      ("help,h", "show this help")
      ("generate", po::value(&generate), "build this generated graph in a temporary store (deleted after)")
      ("dims", po::value(&dims_text), "feature widths, comma separated (default 32,64,128,256)")
      ("kernels", po::value(&kernels_text),
       "kernels to time, comma separated, from cusparse, gar, gas, memory-aware, auto, gar-scan (GAR "
       "finding its long rows by scanning and in chunks of 16 rows, as without the graph's list and chunk rule), sampled:S[:fastrand|:bucket] "
       "(ES-SpMM's edge-sampled estimate from at most S entries a row), tc[:32|:64] (TC-GNN's tensor-core SpMM in TF32, "
       "over the graph translated once on the host; 32 or 64 output columns a warp); default cusparse,gar,gas; "
       "speedups and errors are against cusparse when it is listed")
      ("runs", po::value(&runs), "timed launches per kernel and width (default 20)")
      ("warmup", po::value(&warmup), "untimed launches first (default 5)")
      ("json", po::bool_switch(&json), "one JSON object per result row instead of the table")
      ("store", po::value(&store_path), "store directory");
  po::positional_options_description pos;
  pos.add("store", 1);
  po::variables_map vm;
  if (!parse_command_line(args, desc, pos, &vm)) return 0;
  const std::vector<int> dims = parse_int_list(dims_text, "--dims");
  if (dims.empty()) throw InputError("--dims: expected at least one width");
  for (int d : dims)
    if (d < 1) throw InputError("--dims: widths must be at least 1, found " + std::to_string(d));
  if (runs < 1) throw InputError("--runs: expected at least 1, found " + std::to_string(runs));
  if (warmup < 0) throw InputError("--warmup: expected 0 or more, found " + std::to_string(warmup));
  // cuSPARSE, when listed, runs first: the speedups and errors are measured against it.
  // GAR and auto get the graph's long-row list, as training passes it; gar-scan runs GAR without.
  struct Kernel {
    SpmmKind kind;
    std::string name;
    bool listed = true;
    int64_t sample_width = 0;
    kernels::SpmmSampling sampling = kernels::SpmmSampling::kFastRand;
    int tc_slice = 0;
  };
  std::vector<Kernel> kinds;
  bool with_cusparse = false;
  for (const std::string& name : split_list(kernels_text)) {
    if (name == "cusparse") with_cusparse = true;
    else if (name == "gar") kinds.push_back({SpmmKind::kGar, name});
    else if (name == "gar-scan") kinds.push_back({SpmmKind::kGar, name, false});
    else if (name == "gas") kinds.push_back({SpmmKind::kGas, name});
    else if (name == "auto") kinds.push_back({SpmmKind::kAuto, name});
    else if (name == "memory-aware") kinds.push_back({SpmmKind::kMemoryAware, name});
    else if (name == "tc" || name == "tc:32" || name == "tc:64") {
      Kernel k{SpmmKind::kTensorCore, name};
      k.tc_slice = name == "tc" ? 0 : std::stoi(name.substr(3));
      kinds.push_back(k);
    }
    else if (name.rfind("sampled", 0) == 0) {
      Kernel k{SpmmKind::kSampled, name};
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
  if (with_cusparse) kinds.insert(kinds.begin(), {SpmmKind::kCusparse, "cusparse"});
  if (kinds.empty()) throw InputError("--kernels: expected at least one kernel");

  BenchStore::check(store_path, generate, "bench spmm");
  kernels::cuda::require_device(0);
  const BenchStore source(store_path, generate, "bench spmm");
  const storage::Store store = storage::Store::open(source.path());
  const kernels::CsrView host = store.csr();
  const int64_t rows = host.rows, cols = host.cols, nnz = host.nnz();

  const kernels::cuda::DeviceInfo info = kernels::cuda::device_info(0);
  kernels::cuda::DeviceGuard guard(0);
  kernels::cuda::MemoryPool pool(0);
  kernels::cuda::Stream stream(0);
  kernels::cuda::CublasHandle blas(stream, pool);
  using kernels::cuda::DeviceBuffer;
  // A store's indptr starts at 0, so the uploaded indices line up with it.
  GALE_ASSERT(host.indptr[0] == 0);
  const auto indptr = kernels::cuda::to_device(pool, host.indptr, static_cast<size_t>(rows + 1), stream);
  const auto indices = kernels::cuda::to_device(pool, host.indices, static_cast<size_t>(nnz), stream);
  const auto weights = kernels::cuda::to_device(pool, random_floats(1, static_cast<size_t>(nnz), 0.5f, 1.5f), stream);
  // GAR's long-row list, once per graph (as GraphOperand keeps it for training).
  const int64_t long_capacity = kernels::gar_long_rows_capacity(rows, nnz);
  DeviceBuffer<int64_t> long_rows(pool, static_cast<size_t>(std::max<int64_t>(long_capacity, 1)), stream);
  DeviceBuffer<int64_t> long_count(pool, 1, stream);
  kernels::gar_long_rows_cuda({rows, cols, indptr.data(), indices.data(), nullptr}, long_rows.data(), long_capacity,
                              long_count.data(), stream);
  const int64_t long_listed = kernels::cuda::to_host_and_wait(long_count.view(), stream)[0];
  // GAR's chunk for this graph, as GraphOperand finds it for training (gar, auto; gar-scan keeps 16).
  const int64_t chunk_rows = kernels::gar_chunk_rows_for(host);
  // TC-GNN's translation, once per graph on the host, when tc is timed.
  kernels::cuda::DeviceTcPlan tc_plan;
  std::string tc_line;
  if (std::any_of(kinds.begin(), kinds.end(), [](const Kernel& k) { return k.kind == SpmmKind::kTensorCore; })) {
    const auto t0 = std::chrono::steady_clock::now();
    const kernels::SpmmTcTranslation t = kernels::spmm_tc_translate(host);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    tc_plan = kernels::cuda::DeviceTcPlan(pool, t, stream);
    char line[256];
    std::snprintf(line, sizeof line, "tc plan: %.0f ms on %d threads, %zu blocks of 16 x 8 (%.1f%% full), %zu items, %.0f MB\n",
                  ms, tbb::this_task_arena::max_concurrency(), t.block_src.size() / kernels::kTcBlockCols,
                  100.0 * t.density(), t.item_window.size(), static_cast<double>(t.bytes()) / 1e6);
    tc_line = line;
  }

  if (!json) {
    std::printf("device: %s\ngraph: %s, %lld rows, %lld entries (avg degree %.1f), %lld rows of more than %lld, "
                "GAR chunks of %lld rows\n",
                info.name.c_str(), source.label().c_str(), static_cast<long long>(rows), static_cast<long long>(nnz),
                rows ? static_cast<double>(nnz) / rows : 0.0, static_cast<long long>(long_listed),
                static_cast<long long>(kernels::kGarLongRow), static_cast<long long>(chunk_rows));
    std::printf("%s", tc_line.c_str());
    std::printf("median of %d runs after %d warm-up, CUDA events; speedup = cusparse_ms / kernel_ms\n", runs, warmup);
    std::printf("%6s  %-18s %10s %9s %9s %12s %10s\n", "width", "kernel", "median_ms", "speedup", "GB/s", "max_abs_err",
                "rel_err");
  }
  kernels::cuda::Event start(0, kernels::cuda::Event::Timing::kEnabled);
  kernels::cuda::Event stop(0, kernels::cuda::Event::Timing::kEnabled);

  for (int width : dims) {
    const int64_t w = width;
    const auto x = kernels::cuda::to_device(
        pool, random_floats(kernels::derive_key(2, static_cast<uint64_t>(w)), static_cast<size_t>(cols * w), -1.0f, 1.0f),
        stream);
    // Bytes the product must move at least once: the CSR with its weights, the gathered source
    // rows, the output (the model `gale bench train`'s roofline takes for aggregations).
    const double bytes = engine::spmm_min_bytes(rows, nnz, w, 4);
    std::vector<Row> results;
    std::vector<DeviceBuffer<float>> outputs;
    for (const Kernel& kernel : kinds) {
      const SpmmKind kind = kernel.kind;
      outputs.emplace_back(pool, static_cast<size_t>(rows * w), stream);
      kernels::SpmmArgs a;
      a.graph = {rows, cols, indptr.data(), indices.data(), nullptr};
      a.x = kernels::ConstMatrixView{x.data(), cols, w, w};
      a.out = kernels::MatrixView{outputs.back().data(), rows, w, w};
      a.edge_weight = weights.data();
      a.nnz = nnz;
      a.sample_width = kernel.sample_width;
      a.sampling = kernel.sampling;
      if (kernel.listed) {
        a.long_rows = {long_rows.data(), long_count.data(), long_capacity};
        a.gar_chunk_rows = chunk_rows;
      }
      if (kind == SpmmKind::kTensorCore) a.tc = tc_plan.plan();
      a.tc_slice = kernel.tc_slice;
      Row row;
      row.width = w;
      row.kernel = kernel.name;
      row.skipped = kernels::spmm_cannot(kind, a);
      if (row.skipped.empty()) {
        for (int i = 0; i < warmup; ++i) kernels::spmm_cuda(kind, a, stream);
        std::vector<float> times;
        for (int i = 0; i < runs; ++i) {
          start.record(stream);
          kernels::spmm_cuda(kind, a, stream);
          stop.record(stream);
          times.push_back(kernels::cuda::elapsed_ms(start, stop));
        }
        row.ms = median(times);
        row.gbps = bytes / (row.ms * 1e6);
      }
      results.push_back(row);
    }
    const Row& base = results[0];
    const bool have_base = with_cusparse && base.skipped.empty();
    for (size_t k = 0; k < results.size(); ++k) {
      Row& row = results[k];
      if (!row.skipped.empty()) continue;
      row.speedup = have_base ? base.ms / row.ms : 0.0;
      if (k > 0 && have_base)
        row.max_abs_err = max_abs_difference(blas, outputs[k].data(), outputs[0].data(), rows * w, stream, &row.rel_err);
    }
    // Without cuSPARSE in the run there is no speedup and no error to report: null / "-".
    const auto number = [&](const char* format, double v) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), format, v);
      return std::string(have_base ? buf : json ? "null" : "-");
    };
    for (const Row& row : results) {
      if (json) {
        if (row.skipped.empty()) {
          std::printf("{\"bench\":\"spmm\",\"device\":\"%s\",\"rows\":%lld,\"nnz\":%lld,\"width\":%lld,"
                      "\"kernel\":\"%s\",\"median_ms\":%.4f,\"speedup_vs_cusparse\":%s,\"gbps\":%.1f,"
                      "\"max_abs_err\":%s,\"rel_err\":%s,\"runs\":%d,\"warmup\":%d}\n",
                      info.name.c_str(), static_cast<long long>(rows), static_cast<long long>(nnz),
                      static_cast<long long>(row.width), row.kernel.c_str(), row.ms,
                      number("%.3f", row.speedup).c_str(), row.gbps, number("%.3g", row.max_abs_err).c_str(),
                      number("%.3g", row.rel_err).c_str(), runs, warmup);
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
  return 0;
}

// `gale bench spmm --maxk 8,16,32 ...`: MaxK-GNN's kernels (kernels/maxk.cu) against cuSPARSE's SpMM
// at the dense width, on the same graph and edge weights: for each width and k, the top-k of a
// random dense x into CBSR, the forward SpGEMM over it and the backward SSpMM of a random
// gradient at its pattern, each the median of --runs launches timed with CUDA events. The
// SpGEMM output is checked against cuSPARSE on the densified CBSR input. The edge-group table is
// built once per graph on the GPU (its time is printed) and shared by both aggregations.
int bench_spmm_maxk(const std::vector<std::string>& args) {
  std::string store_path, generate, dims_text = "256", ks_text;
  int runs = 20, warmup = 5;
  bool json = false;
  po::options_description desc(
      "usage: gale bench spmm STORE|--generate SPEC --maxk 8,16,32 [options]\n\n"
      "Times MaxK-GNN's top-k, SpGEMM (forward) and SSpMM (backward) kernels against cuSPARSE SpMM\n"
      "(CSR, ALG2) at the dense width on GPU 0: median of --runs launches after --warmup.\n\n"
      "options");
  desc.add_options()
      ("help,h", "show this help")
      ("maxk", po::value(&ks_text)->required(), "kept values per row, comma separated (each 1 to the width)")
      ("generate", po::value(&generate), "build this generated graph in a temporary store (deleted after)")
      ("dims", po::value(&dims_text), "dense widths, comma separated (default 256)")
      ("runs", po::value(&runs), "timed launches per kernel (default 20)")
      ("warmup", po::value(&warmup), "untimed launches first (default 5)")
      ("json", po::bool_switch(&json), "one JSON object per result row instead of the table")
      ("store", po::value(&store_path), "store directory");
  po::positional_options_description pos;
  pos.add("store", 1);
  po::variables_map vm;
  if (!parse_command_line(args, desc, pos, &vm)) return 0;
  const std::vector<int> dims = parse_int_list(dims_text, "--dims");
  const std::vector<int> ks = parse_int_list(ks_text, "--maxk");
  if (dims.empty() || ks.empty()) throw InputError("--dims, --maxk: expected at least one value each");
  for (int d : dims)
    if (d < 1 || d > kernels::kMaxkCudaMaxWidth)
      throw InputError("--dims: widths must be 1 to " + std::to_string(kernels::kMaxkCudaMaxWidth) + " with --maxk, found " +
                       std::to_string(d));
  const int widest = *std::max_element(dims.begin(), dims.end());
  for (int k : ks) {
    if (k < 1) throw InputError("--maxk: expected values of at least 1, found " + std::to_string(k));
    if (k > widest)
      throw InputError("--maxk " + std::to_string(k) + ": expected at most the widest --dims width (" +
                       std::to_string(widest) + ")");
  }
  if (runs < 1) throw InputError("--runs: expected at least 1, found " + std::to_string(runs));
  if (warmup < 0) throw InputError("--warmup: expected 0 or more, found " + std::to_string(warmup));

  BenchStore::check(store_path, generate, "bench spmm --maxk");
  kernels::cuda::require_device(0);
  const BenchStore source(store_path, generate, "bench spmm --maxk");
  const storage::Store store = storage::Store::open(source.path());
  const kernels::CsrView host = store.csr();
  const int64_t rows = host.rows, cols = host.cols, nnz = host.nnz();
  GALE_ASSERT(host.indptr[0] == 0);

  const kernels::cuda::DeviceInfo info = kernels::cuda::device_info(0);
  kernels::cuda::DeviceGuard guard(0);
  kernels::cuda::MemoryPool pool(0);
  kernels::cuda::Stream stream(0);
  kernels::cuda::CublasHandle blas(stream, pool);
  using kernels::cuda::DeviceBuffer;
  const auto indptr = kernels::cuda::to_device(pool, host.indptr, static_cast<size_t>(rows + 1), stream);
  const auto indices = kernels::cuda::to_device(pool, host.indices, static_cast<size_t>(nnz), stream);
  const auto weights = kernels::cuda::to_device(pool, random_floats(1, static_cast<size_t>(nnz), 0.5f, 1.5f), stream);
  const kernels::CsrView graph{rows, cols, indptr.data(), indices.data(), nullptr};

  kernels::cuda::Event start(0, kernels::cuda::Event::Timing::kEnabled);
  kernels::cuda::Event stop(0, kernels::cuda::Event::Timing::kEnabled);
  const auto time_median = [&](const auto& launch) {
    for (int i = 0; i < warmup; ++i) launch();
    std::vector<float> times;
    for (int i = 0; i < runs; ++i) {
      start.record(stream);
      launch();
      stop.record(stream);
      times.push_back(kernels::cuda::elapsed_ms(start, stop));
    }
    return median(times);
  };

  // The edge groups, once per graph.
  const int64_t capacity = kernels::edge_groups_capacity(rows, nnz);
  DeviceBuffer<kernels::EdgeGroup> groups(pool, static_cast<size_t>(capacity), stream);
  DeviceBuffer<int64_t> group_count(pool, 1, stream);
  const size_t workspace_bytes = kernels::edge_groups_workspace_bytes(rows);
  DeviceBuffer<uint8_t> workspace(pool, workspace_bytes, stream);
  const double groups_ms = time_median([&] {
    kernels::edge_groups_cuda(graph, kernels::kMaxkEdgeGroupSize, groups.data(), capacity, group_count.data(),
                              workspace.data(), workspace_bytes, stream);
  });
  const kernels::EdgeGroupsView group_view{groups.data(), capacity, group_count.data()};
  const int64_t group_total = kernels::cuda::to_host_and_wait(group_count.view(), stream)[0];

  if (!json) {
    std::printf("device: %s\ngraph: %s, %lld rows, %lld entries (avg degree %.1f), %lld edge groups of <= %lld "
                "built in %.3f ms\n",
                info.name.c_str(), source.label().c_str(),
                static_cast<long long>(rows), static_cast<long long>(nnz), rows ? static_cast<double>(nnz) / rows : 0.0,
                static_cast<long long>(group_total), static_cast<long long>(kernels::kMaxkEdgeGroupSize), groups_ms);
    std::printf("median of %d runs after %d warm-up, CUDA events; speedup = cusparse_ms / kernel_ms\n", runs, warmup);
    std::printf("max_abs_err: spgemm against cuSPARSE on the densified input, sspmm-flat (global atomics only) "
                "against sspmm (with the hub plan)\n");
    std::printf("%6s %5s  %-10s %10s %9s %12s\n", "width", "k", "kernel", "median_ms", "speedup", "max_abs_err");
  }
  const auto report = [&](int64_t w, int64_t k, const char* kernel, double ms, double base_ms, double err) {
    const double speedup = ms > 0 ? base_ms / ms : 0.0;
    if (json) {
      std::printf("{\"bench\":\"spmm_maxk\",\"device\":\"%s\",\"rows\":%lld,\"nnz\":%lld,\"width\":%lld,\"k\":%lld,"
                  "\"kernel\":\"%s\",\"median_ms\":%.4f,\"speedup_vs_cusparse\":%.3f,\"max_abs_err\":%.3g,"
                  "\"edge_groups\":%lld,\"edge_groups_ms\":%.4f,\"runs\":%d,\"warmup\":%d}\n",
                  info.name.c_str(), static_cast<long long>(rows), static_cast<long long>(nnz),
                  static_cast<long long>(w), static_cast<long long>(k), kernel, ms, speedup, err,
                  static_cast<long long>(group_total), groups_ms, runs, warmup);
    } else {
      std::printf("%6lld %5lld  %-10s %10.3f %8.2fx %12.3g\n", static_cast<long long>(w), static_cast<long long>(k),
                  kernel, ms, speedup, err);
    }
  };

  for (int width : dims) {
    const int64_t w = width;
    const auto x = kernels::cuda::to_device(
        pool, random_floats(kernels::derive_key(2, static_cast<uint64_t>(w)), static_cast<size_t>(cols * w), -1.0f, 1.0f),
        stream);
    const auto grad = kernels::cuda::to_device(
        pool, random_floats(kernels::derive_key(3, static_cast<uint64_t>(w)), static_cast<size_t>(rows * w), -1.0f, 1.0f),
        stream);
    DeviceBuffer<float> dense_out(pool, static_cast<size_t>(rows * w), stream);
    kernels::SpmmArgs dense;
    dense.graph = graph;
    dense.x = kernels::ConstMatrixView{x.data(), cols, w, w};
    dense.out = kernels::MatrixView{dense_out.data(), rows, w, w};
    dense.edge_weight = weights.data();
    dense.nnz = nnz;
    const double base_ms = time_median([&] { kernels::spmm_cuda(SpmmKind::kCusparse, dense, stream); });
    report(w, w, "cusparse", base_ms, base_ms, 0.0);
    for (int kk : ks) {
      const int64_t k = kk;
      if (k > w) {  // a narrower width than this k: said, not measured
        std::fprintf(stderr, "gale: --maxk %lld skipped at width %lld (k is at most the width)\n",
                     static_cast<long long>(k), static_cast<long long>(w));
        continue;
      }
      DeviceBuffer<float> values(pool, static_cast<size_t>(cols * k), stream);
      DeviceBuffer<uint8_t> index(pool, static_cast<size_t>(kernels::cbsr_index_size_bytes(cols, w, k)), stream);
      const kernels::CbsrView cbsr{cols, w, k, values.data(), index.data()};
      const double topk_ms = time_median([&] { kernels::maxk_forward_cuda(dense.x, cbsr, stream); });
      DeviceBuffer<float> out(pool, static_cast<size_t>(rows * w), stream);
      kernels::SpgemmCbsrArgs f;
      f.graph = graph;
      f.x = cbsr;
      f.out = kernels::MatrixView{out.data(), rows, w, w};
      f.edge_weight = weights.data();
      const double spgemm_ms = time_median([&] { kernels::spgemm_cbsr_cuda(f, group_view, stream); });
      DeviceBuffer<float> grad_values(pool, static_cast<size_t>(cols * k), stream);
      kernels::SspmmCbsrArgs b;
      b.graph = graph;
      b.grad_out = kernels::ConstMatrixView{grad.data(), rows, w, w};
      b.pattern = cbsr;
      b.grad_values = grad_values.data();
      b.edge_weight = weights.data();
      // SSpMM with global atomics only (sspmm-flat), then as training runs it: with the graph's hub
      // plan for this k (built once per graph and k, like the edge groups) from k = 32 on, else
      // the same as sspmm-flat. Both write the same buffer: its lines' L2 priority (the atomics
      // mark half of them evict-last) outlives a run, and a second buffer would time the later
      // kernel against the first one's leftovers.
      const double flat_ms = time_median([&] { kernels::sspmm_cbsr_cuda(b, group_view, stream); });
      DeviceBuffer<float> flat_values(pool, static_cast<size_t>(cols * k), stream);
      kernels::cuda::copy_on_device(flat_values.data(), grad_values.data(), static_cast<size_t>(cols * k), stream);
      const int hub_capacity = kernels::sspmm_hub_capacity(k);
      DeviceBuffer<int32_t> hub_ids(pool, static_cast<size_t>(std::max(hub_capacity, 1)), stream);
      DeviceBuffer<uint32_t> hub_mask(pool, static_cast<size_t>(std::max<int64_t>(kernels::sspmm_hub_mask_words(nnz), 1)),
                                      stream);
      const size_t hub_ws_bytes = kernels::sspmm_hubs_workspace_bytes(cols);
      DeviceBuffer<uint8_t> hub_ws(pool, hub_ws_bytes, stream);
      if (hub_capacity > 0 && k >= kernels::kSspmmHubMinK) {
        kernels::sspmm_hubs_cuda(graph, hub_capacity, kernels::kSspmmHubMinEntries, hub_ids.data(), hub_mask.data(), nnz,
                                 hub_ws.data(), hub_ws_bytes, stream);
        b.hubs = kernels::SspmmHubsView{hub_ids.data(), hub_mask.data(), hub_capacity};
      }
      const double sspmm_ms = time_median([&] { kernels::sspmm_cbsr_cuda(b, group_view, stream); });
      const double sspmm_err = max_abs_difference(blas, flat_values.data(), grad_values.data(), cols * k, stream);
      // cuSPARSE on the densified CBSR gives the reference for SpGEMM's output.
      DeviceBuffer<float> densified(pool, static_cast<size_t>(cols * w), stream);
      kernels::cbsr_to_dense_cuda(cbsr, kernels::MatrixView{densified.data(), cols, w, w}, stream);
      DeviceBuffer<float> reference(pool, static_cast<size_t>(rows * w), stream);
      kernels::SpmmArgs check = dense;
      check.x = kernels::ConstMatrixView{densified.data(), cols, w, w};
      check.out = kernels::MatrixView{reference.data(), rows, w, w};
      kernels::spmm_cuda(SpmmKind::kCusparse, check, stream);
      const double err = max_abs_difference(blas, out.data(), reference.data(), rows * w, stream);
      report(w, k, "topk", topk_ms, base_ms, 0.0);
      report(w, k, "spgemm", spgemm_ms, base_ms, err);
      report(w, k, "sspmm", sspmm_ms, base_ms, 0.0);
      report(w, k, "sspmm-flat", flat_ms, base_ms, sspmm_err);
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

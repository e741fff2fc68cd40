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
#include <filesystem>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "kernels/error.hpp"

#if GALE_WITH_CUDA
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/random.hpp"
#include "kernels/spmm.hpp"
#include "storage/preprocess.hpp"
#include "storage/store.hpp"
#endif

namespace gale::apps {

namespace po = boost::program_options;

#if GALE_WITH_CUDA
namespace {

namespace fs = std::filesystem;
using kernels::SpmmKind;

// A directory under the system temp folder, removed with everything in it on scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "gale-bench-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw InputError("bench: cannot create a temporary directory in " +
                                                             fs::temp_directory_path().string());
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

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
  std::string skipped;        // spmm_cannot's reason when the kernel could not run
};

// max |a - b| over n elements, through cuBLAS (a is overwritten with a - b).
double max_abs_difference(const kernels::cuda::CublasHandle& blas, float* a, const float* b, int64_t n,
                          cudaStream_t stream) {
  if (n == 0) return 0.0;
  const float minus_one = -1.0f;
  GALE_CHECK_CUBLAS(cublasSaxpy_64(blas, n, &minus_one, b, 1, a, 1));
  int64_t index = 0;  // 1-based
  GALE_CHECK_CUBLAS(cublasIsamax_64(blas, n, a, 1, &index));
  float value = 0.0f;
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
      "launches timed with CUDA events after --warmup launches, for each feature width.\n\n"
      "options");
  desc.add_options()
      ("help,h", "show this help")
      ("generate", po::value(&generate), "build this generated graph in a temporary store (deleted after)")
      ("dims", po::value(&dims_text), "feature widths, comma separated (default 32,64,128,256)")
      ("kernels", po::value(&kernels_text),
       "kernels to time, comma separated, from cusparse, gar, gas, auto (default cusparse,gar,gas); "
       "speedups and errors are against cusparse when it is listed")
      ("runs", po::value(&runs), "timed launches per kernel and width (default 20)")
      ("warmup", po::value(&warmup), "untimed launches first (default 5)")
      ("json", po::bool_switch(&json), "one JSON object per result row instead of the table")
      ("store", po::value(&store_path), "store directory");
  po::positional_options_description pos;
  pos.add("store", 1);
  po::variables_map vm;
  if (!parse_command_line(args, desc, pos, &vm)) return 0;
  if (store_path.empty() == generate.empty())
    throw InputError("bench spmm: expected a STORE path or --generate SPEC (exactly one)");
  const std::vector<int> dims = parse_int_list(dims_text, "--dims");
  if (dims.empty()) throw InputError("--dims: expected at least one width");
  for (int d : dims)
    if (d < 1) throw InputError("--dims: widths must be at least 1, found " + std::to_string(d));
  if (runs < 1) throw InputError("--runs: expected at least 1, found " + std::to_string(runs));
  if (warmup < 0) throw InputError("--warmup: expected 0 or more, found " + std::to_string(warmup));
  // cuSPARSE, when listed, runs first: the speedups and errors are measured against it.
  std::vector<SpmmKind> kinds;
  bool with_cusparse = false;
  for (size_t at = 0; at <= kernels_text.size();) {
    const size_t comma = std::min(kernels_text.find(',', at), kernels_text.size());
    const std::string name = kernels_text.substr(at, comma - at);
    at = comma + 1;
    if (name == "cusparse") with_cusparse = true;
    else if (name == "gar") kinds.push_back(SpmmKind::kGar);
    else if (name == "gas") kinds.push_back(SpmmKind::kGas);
    else if (name == "auto") kinds.push_back(SpmmKind::kAuto);
    else throw InputError("--kernels: expected cusparse, gar, gas or auto, found '" + name + "'");
  }
  if (with_cusparse) kinds.insert(kinds.begin(), SpmmKind::kCusparse);
  if (kinds.empty()) throw InputError("--kernels: expected at least one kernel");

  kernels::cuda::require_device(0);
  std::optional<TempDir> temp;
  if (!generate.empty()) {
    temp.emplace();
    storage::PreprocessOptions o;
    o.generate = generate;
    o.output = (temp->path() / "graph.gale").string();
    o.temp_dir = temp->path().string();
    const auto t0 = std::chrono::steady_clock::now();
    const storage::PreprocessReport report = storage::preprocess(o);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "bench: generated %s: %lld nodes, %lld edges in %.1f s\n", generate.c_str(),
                 static_cast<long long>(report.num_nodes), static_cast<long long>(report.num_edges), secs);
    store_path = o.output;
  }
  const storage::Store store = storage::Store::open(store_path);
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

  if (!json) {
    std::printf("device: %s\ngraph: %s, %lld rows, %lld entries (avg degree %.1f)\n", info.name.c_str(),
                generate.empty() ? store_path.c_str() : generate.c_str(), static_cast<long long>(rows),
                static_cast<long long>(nnz), rows ? static_cast<double>(nnz) / rows : 0.0);
    std::printf("median of %d runs after %d warm-up, CUDA events; speedup = cusparse_ms / kernel_ms\n", runs, warmup);
    std::printf("%6s  %-9s %10s %9s %9s %12s\n", "width", "kernel", "median_ms", "speedup", "GB/s", "max_abs_err");
  }
  kernels::cuda::Event start(0, kernels::cuda::Event::Timing::kEnabled);
  kernels::cuda::Event stop(0, kernels::cuda::Event::Timing::kEnabled);

  for (int width : dims) {
    const int64_t w = width;
    const auto x = kernels::cuda::to_device(
        pool, random_floats(kernels::derive_key(2, static_cast<uint64_t>(w)), static_cast<size_t>(cols * w), -1.0f, 1.0f),
        stream);
    // Bytes the product must move at least once: the CSR, the gathered source rows, the output.
    const double bytes = static_cast<double>(rows + 1) * 8 + static_cast<double>(nnz) * (4 + 4) +
                         static_cast<double>(nnz) * w * 4 + static_cast<double>(rows) * w * 4;
    std::vector<Row> results;
    std::vector<DeviceBuffer<float>> outputs;
    for (SpmmKind kind : kinds) {
      outputs.emplace_back(pool, static_cast<size_t>(rows * w), stream);
      kernels::SpmmArgs a;
      a.graph = {rows, cols, indptr.data(), indices.data(), nullptr};
      a.x = kernels::ConstMatrixView{x.data(), cols, w, w};
      a.out = kernels::MatrixView{outputs.back().data(), rows, w, w};
      a.edge_weight = weights.data();
      a.nnz = nnz;
      Row row;
      row.width = w;
      row.kernel = kernels::spmm_kind_name(kind);
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
        row.max_abs_err = max_abs_difference(blas, outputs[k].data(), outputs[0].data(), rows * w, stream);
    }
    for (const Row& row : results) {
      if (json) {
        if (row.skipped.empty()) {
          std::printf("{\"bench\":\"spmm\",\"device\":\"%s\",\"rows\":%lld,\"nnz\":%lld,\"width\":%lld,"
                      "\"kernel\":\"%s\",\"median_ms\":%.4f,\"speedup_vs_cusparse\":%.3f,\"gbps\":%.1f,"
                      "\"max_abs_err\":%.3g,\"runs\":%d,\"warmup\":%d}\n",
                      info.name.c_str(), static_cast<long long>(rows), static_cast<long long>(nnz),
                      static_cast<long long>(row.width), row.kernel.c_str(), row.ms, row.speedup, row.gbps,
                      row.max_abs_err, runs, warmup);
        } else {
          std::printf("{\"bench\":\"spmm\",\"width\":%lld,\"kernel\":\"%s\",\"skipped\":\"%s\"}\n",
                      static_cast<long long>(row.width), row.kernel.c_str(), row.skipped.c_str());
        }
      } else if (row.skipped.empty()) {
        std::printf("%6lld  %-9s %10.3f %8.2fx %9.1f %12.3g\n", static_cast<long long>(row.width), row.kernel.c_str(),
                    row.ms, row.speedup, row.gbps, row.max_abs_err);
      } else {
        std::printf("%6lld  %-9s skipped: %s\n", static_cast<long long>(row.width), row.kernel.c_str(),
                    row.skipped.c_str());
      }
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
#endif

int run_bench(const std::vector<std::string>& args) {
#if GALE_WITH_CUDA
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::puts("usage: gale bench spmm STORE|--generate SPEC [--dims 32,64,128,256] [--kernels cusparse,gar,gas]\n"
              "                  [--runs 20] [--warmup 5] [--json]");
    return args.empty() ? static_cast<int>(ExitCode::kInput) : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "spmm") return bench_spmm(rest);
  throw InputError("bench: unknown benchmark '" + args[0] + "' (expected spmm)");
#else
  (void)args;
  throw DeviceError("bench: this build has no CUDA backend");
#endif
}

}  // namespace gale::apps

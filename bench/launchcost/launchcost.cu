// bench/launchcost — host time of the CUDA calls a training step makes, with one thread driving
// one GPU and with one thread per GPU at once (what `gale train --gpus 0,1` does in one process).
//
//   gale_launchcost [GPUS] [CALLS]    (GPUS: 1 or more, default every visible GPU; CALLS: 20000)
//
// For each kind of call, each thread enqueues CALLS of them on its own stream and device and times
// only the enqueueing (the stream is drained every 256 calls, untimed, so the launch queue never
// fills). Kinds: an empty kernel; Gale's GEMM (kernels::gemm_cuda through cuBLASLt, a sampled
// block's 6144 x 256 x 256) and a bare cublasLtMatmul with its descriptors made once; an event
// record; a pool allocation and its free; a 1 MiB memset. Prints microseconds per call, alone and
// with every thread at once, and the ratio: a ratio above 1 is a lock the threads share.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/dense.hpp"
#include "kernels/error.hpp"

namespace {

__global__ void empty_kernel(float* p) {
  if (p != nullptr && threadIdx.x == 1024) p[0] = 0.0f;  // never true: keeps the launch real
}

constexpr int64_t kM = 6144, kN = 256, kK = 256;
constexpr size_t kWorkspace = size_t{32} << 20;

// One GPU's state: its stream, operands, handles and pool.
struct Worker {
  int device = 0;
  cudaStream_t stream = nullptr;
  float *a = nullptr, *b = nullptr, *c = nullptr;
  void* workspace = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulHeuristicResult_t algo{};
  cudaMemPool_t pool = nullptr;
  cudaEvent_t event = nullptr;

  void open(int d) {
    device = d;
    GALE_CHECK_CUDA(cudaSetDevice(d));
    GALE_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    GALE_CHECK_CUDA(cudaMalloc(&a, kM * kK * sizeof(float)));
    GALE_CHECK_CUDA(cudaMalloc(&b, kK * kN * sizeof(float)));
    GALE_CHECK_CUDA(cudaMalloc(&c, kM * kN * sizeof(float)));
    GALE_CHECK_CUDA(cudaMalloc(&workspace, kWorkspace));
    GALE_CHECK_CUDA(cudaMemset(a, 0, kM * kK * sizeof(float)));
    GALE_CHECK_CUDA(cudaMemset(b, 0, kK * kN * sizeof(float)));
    GALE_CHECK_CUBLAS(cublasCreate(&blas));
    GALE_CHECK_CUBLAS(cublasSetStream(blas, stream));
    GALE_CHECK_CUBLAS(cublasLtCreate(&lt));
    GALE_CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    GALE_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, kN, kK, kN));
    GALE_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, kK, kM, kK));
    GALE_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, kN, kM, kN));
    cublasLtMatmulPreference_t pref = nullptr;
    GALE_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    GALE_CHECK_CUBLAS(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace, sizeof(kWorkspace)));
    int count = 0;
    GALE_CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &algo, &count));
    cublasLtMatmulPreferenceDestroy(pref);
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = d;
    GALE_CHECK_CUDA(cudaMemPoolCreate(&pool, &props));
    uint64_t keep = ~uint64_t{0};
    GALE_CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    GALE_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
};

struct Kind {
  const char* name;
  std::function<void(Worker&)> call;
};

// Microseconds per call of `call` on w, the queue drained every 256 calls outside the timing.
double time_calls(Worker& w, const Kind& kind, int calls) {
  GALE_CHECK_CUDA(cudaSetDevice(w.device));
  for (int i = 0; i < 64; ++i) kind.call(w);
  GALE_CHECK_CUDA(cudaStreamSynchronize(w.stream));
  double seconds = 0;
  for (int done = 0; done < calls;) {
    const int n = std::min(256, calls - done);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) kind.call(w);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    GALE_CHECK_CUDA(cudaStreamSynchronize(w.stream));
    done += n;
  }
  return 1e6 * seconds / calls;
}

}  // namespace

int run(int argc, char** argv) {
  int visible = 0;
  GALE_CHECK_CUDA(cudaGetDeviceCount(&visible));
  const int gpus = argc > 1 ? std::atoi(argv[1]) : visible;
  const int calls = argc > 2 ? std::atoi(argv[2]) : 20000;
  if (gpus < 1 || gpus > visible || calls < 256) {
    std::fprintf(stderr, "launchcost: expected GPUS in 1..%d and CALLS >= 256\n", visible);
    return 2;
  }
  std::vector<Worker> workers(static_cast<size_t>(gpus));
  for (int d = 0; d < gpus; ++d) workers[static_cast<size_t>(d)].open(d);
  const float one = 1.0f, zero = 0.0f;
  const std::vector<Kind> kinds = {
      {"empty kernel", [](Worker& w) { empty_kernel<<<1, 32, 0, w.stream>>>(nullptr); }},
      {"gale gemm (cuBLASLt)",
       [](Worker& w) {
         gale::kernels::gemm_cuda(w.blas, false, false, kM, kN, kK, 1.0f, w.a, kK, w.b, kN, 0.0f, w.c, kN,
                                  false, w.workspace, kWorkspace);
       }},
      {"cublasLtMatmul, made once",
       [&](Worker& w) {
         GALE_CHECK_CUBLAS(cublasLtMatmul(w.lt, w.desc, &one, w.b, w.la, w.a, w.lb, &zero, w.c, w.lc, w.c, w.lc,
                                          &w.algo.algo, w.workspace, kWorkspace, w.stream));
       }},
      {"cublasGemmEx",
       [&](Worker& w) {
         GALE_CHECK_CUBLAS(cublasGemmEx(w.blas, CUBLAS_OP_N, CUBLAS_OP_N, kN, kM, kK, &one, w.b, CUDA_R_32F, kN, w.a,
                                        CUDA_R_32F, kK, &zero, w.c, CUDA_R_32F, kN, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
       }},
      {"event record", [](Worker& w) { GALE_CHECK_CUDA(cudaEventRecord(w.event, w.stream)); }},
      {"pool alloc + free",
       [](Worker& w) {
         void* p = nullptr;
         GALE_CHECK_CUDA(cudaMallocFromPoolAsync(&p, 1 << 20, w.pool, w.stream));
         GALE_CHECK_CUDA(cudaFreeAsync(p, w.stream));
       }},
      {"memset 1 MiB", [](Worker& w) { GALE_CHECK_CUDA(cudaMemsetAsync(w.c, 0, 1 << 20, w.stream)); }},
  };
  std::printf("%-28s %12s %12s %8s   (%d GPUs, %d calls each)\n", "call", "alone us", "together us", "ratio",
              gpus, calls);
  for (const Kind& kind : kinds) {
    const double alone = time_calls(workers[0], kind, calls);
    std::vector<double> each(static_cast<size_t>(gpus));
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> failed(static_cast<size_t>(gpus));
    for (int d = 0; d < gpus; ++d) {
      threads.emplace_back([&, d] {
        ready.fetch_add(1);
        while (ready.load() < gpus) std::this_thread::yield();
        try {
          each[static_cast<size_t>(d)] = time_calls(workers[static_cast<size_t>(d)], kind, calls);
        } catch (...) {
          failed[static_cast<size_t>(d)] = std::current_exception();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : failed)
      if (e) std::rethrow_exception(e);
    const double together = *std::max_element(each.begin(), each.end());
    std::printf("%-28s %12.2f %12.2f %8.2f\n", kind.name, alone, together, together / alone);
  }
  return 0;
}

// A failing CUDA or cuBLAS call ends the bench with its one-line error and its error's exit code
// (kernels/error.hpp), as gale's own commands do.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const gale::Error& e) {
    std::fprintf(stderr, "launchcost: %s\n", e.what());
    return static_cast<int>(e.code());
  }
}

// kernels/cuda/check.hpp — the one error path for CUDA and cuBLAS calls.
//
//   GALE_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
//   GALE_CHECK_CUBLAS(cublasSgemm(handle, ...));
//
// A failed call throws gale::DeviceError("cudaMemcpyAsync(...) failed: invalid argument
// (cudaErrorInvalidValue) at kernels/x.cpp:42"); running out of device memory throws
// gale::ResourceError instead, so the CLI reports it like an exceeded budget (both exit code 4,
// but the message tells the user to lower the batch size or the budget, not to check a driver).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "kernels/error.hpp"

namespace gale::kernels::cuda {

// "cudaMemcpyAsync(dst, src, n, k, s)" -> "cudaMemcpyAsync(...)": the arguments are source text,
// not values, and only make the line long.
inline std::string call_name(const char* call) {
  std::string s(call);
  const auto paren = s.find('(');
  return paren == std::string::npos ? s : s.substr(0, paren) + "(...)";
}

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file,
                                          int line) {
  const std::string message = call_name(call) + " failed: " + cudaGetErrorString(err) + " (" +
                              cudaGetErrorName(err) + ") at " + file + ":" + std::to_string(line);
  // The failed call also left its error as the thread's last error. This report is its one report:
  // clear it, so that the next cudaGetLastError() (every launch's check) does not blame an
  // unrelated kernel where a caller goes on (out of memory, a lost op time, a failed probe). A
  // sticky error (the device itself is failing) stays: every later call reports that.
  (void)cudaGetLastError();
  if (err == cudaErrorMemoryAllocation) throw ResourceError(message);
  throw DeviceError(message);
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call,
                                            const char* file, int line) {
  const std::string message = call_name(call) + " failed: " + cublasGetStatusString(status) +
                              " at " + file + ":" + std::to_string(line);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) throw ResourceError(message);
  throw DeviceError(message);
}

}  // namespace gale::kernels::cuda

#define GALE_CHECK_CUDA(call)                                                          \
  do {                                                                                 \
    const cudaError_t gale_cuda_status_ = (call);                                      \
    if (gale_cuda_status_ != cudaSuccess)                                              \
      ::gale::kernels::cuda::throw_cuda_error(gale_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define GALE_CHECK_CUBLAS(call)                                                          \
  do {                                                                                   \
    const cublasStatus_t gale_cublas_status_ = (call);                                   \
    if (gale_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                    \
      ::gale::kernels::cuda::throw_cublas_error(gale_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)

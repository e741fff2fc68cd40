#include "kernels/cuda/pinned.hpp"

#include <cuda_runtime_api.h>

#include <utility>

#include "kernels/cuda/check.hpp"
#include "kernels/error.hpp"

namespace gale::kernels::cuda {

PinnedBuffer::PinnedBuffer(size_t bytes, MemoryBudget* budget, const std::string& what) : bytes_(bytes) {
  if (bytes == 0) return;
  if (budget) budget->charge(bytes);
  budget_ = budget;
  const cudaError_t err = cudaHostAlloc(&host_, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error state of a failed allocation
    host_ = nullptr;
    if (budget_) budget_->release(bytes);
    budget_ = nullptr;
    throw ResourceError(what + ": cannot pin " + format_bytes(bytes) + " of host memory (" +
                        cudaGetErrorString(err) + ")");
  }
  GALE_CHECK_CUDA(cudaHostGetDevicePointer(&device_, host_, 0));
}

PinnedBuffer::~PinnedBuffer() { reset(); }

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : host_(std::exchange(o.host_, nullptr)),
      device_(std::exchange(o.device_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      budget_(std::exchange(o.budget_, nullptr)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    host_ = std::exchange(o.host_, nullptr);
    device_ = std::exchange(o.device_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    budget_ = std::exchange(o.budget_, nullptr);
  }
  return *this;
}

void PinnedBuffer::reset() noexcept {
  if (host_ != nullptr) (void)cudaFreeHost(host_);
  if (budget_ != nullptr) budget_->release(bytes_);
  host_ = device_ = nullptr;
  budget_ = nullptr;
  bytes_ = 0;
}

}  // namespace gale::kernels::cuda

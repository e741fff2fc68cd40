// kernels/cuda/pinned.hpp — page-locked host memory mapped into the GPU's address space: the
// host feature tier, which GPU kernels read directly over UVA (no staging copy), and staging
// buffers for host-to-device copies that overlap compute.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/budget.hpp"

namespace gale::kernels::cuda {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  // `bytes` of page-locked, mapped, portable host memory (cudaHostAlloc). When `budget` is given
  // the bytes are charged to it first (a --host-mem-budget), and a refused charge or a failed
  // allocation is a ResourceError naming `what`.
  explicit PinnedBuffer(size_t bytes, MemoryBudget* budget = nullptr, const std::string& what = "pinned host memory");
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* host() const noexcept { return host_; }
  // The same memory as a device pointer (UVA): kernels on any GPU read it over PCIe / NVLink-C2C.
  void* device() const noexcept { return device_; }
  size_t bytes() const noexcept { return bytes_; }

 private:
  void reset() noexcept;

  void* host_ = nullptr;
  void* device_ = nullptr;
  size_t bytes_ = 0;
  MemoryBudget* budget_ = nullptr;
};

}  // namespace gale::kernels::cuda

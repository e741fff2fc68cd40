#include "engine/devices.hpp"

#include "kernels/error.hpp"
#if GALE_WITH_CUDA
#include "engine/device_context.hpp"
#include "kernels/cuda/runtime.hpp"
#endif

namespace gale::engine {

Device default_device() {
#if GALE_WITH_CUDA
  if (kernels::cuda::device_count() > 0) return Device::cuda(0);
#endif
  return Device::cpu();
}

void require(const Device& device) {
  if (device.is_cpu()) return;
#if GALE_WITH_CUDA
  try {
    kernels::cuda::require_device(device.ordinal);
  } catch (const DeviceError& e) {
    throw DeviceError("--device " + device.name() + ": " + e.what());
  }
#else
  throw DeviceError("--device " + device.name() + ": this build has no CUDA backend");
#endif
}

void set_gpu_budget(const Device& device, uint64_t bytes, const std::string& text) {
  if (device.is_cpu()) return;
#if GALE_WITH_CUDA
  DeviceContext::set_budget(device.ordinal, bytes == 0 ? kernels::cuda::MemoryBudget::kUnlimited : bytes,
                            bytes == 0 ? std::string() : text);
#else
  (void)bytes;
  (void)text;
#endif
}

uint64_t gpu_peak_bytes(const Device& device) {
#if GALE_WITH_CUDA
  if (device.is_cuda()) return DeviceContext::get(device.ordinal).pool().peak();
#endif
  (void)device;
  return 0;
}

void reset_gpu_peak(const Device& device) {
#if GALE_WITH_CUDA
  if (device.is_cuda()) DeviceContext::get(device.ordinal).pool().reset_peak();
#endif
  (void)device;
}

void synchronize(const Device& device) {
#if GALE_WITH_CUDA
  if (device.is_cuda()) DeviceContext::get(device.ordinal).synchronize();
#endif
  (void)device;
}

uint64_t device_memory(const Device& device) {
#if GALE_WITH_CUDA
  if (device.is_cuda()) return kernels::cuda::device_info(device.ordinal).total_memory;
#endif
  (void)device;
  return 0;
}

std::string device_name(const Device& device) {
#if GALE_WITH_CUDA
  if (device.is_cuda()) return kernels::cuda::device_info(device.ordinal).name;
#endif
  return device.name();
}

}  // namespace gale::engine

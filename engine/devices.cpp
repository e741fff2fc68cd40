#include "engine/devices.hpp"

#include <fcntl.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <optional>
#include <vector>

#include "engine/tensor.hpp"
#include "kernels/error.hpp"
#if GALE_WITH_CUDA
#include "engine/device_context.hpp"
#include "kernels/gather.hpp"
#include "kernels/cuda/pinned.hpp"
#include "kernels/cuda/runtime.hpp"
#endif

namespace gale::engine {

Device default_device() {
#if GALE_WITH_CUDA
  if (kernels::cuda::device_count() > 0) return Device::cuda(0);
#endif
  return Device::cpu();
}

int gpu_count() {
#if GALE_WITH_CUDA
  return kernels::cuda::device_count();
#else
  return 0;
#endif
}

void load_kernels_eagerly() {
#if GALE_WITH_CUDA
  kernels::cuda::request_eager_module_loading();
#endif
}

std::string kernel_loading() {
#if GALE_WITH_CUDA
  return kernels::cuda::module_loading();
#else
  return "";
#endif
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

void GpuHolders::claim(const std::vector<int>& ordinals, const std::string& holder) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int d : ordinals) {
    if (auto it = holders_.find(d); it != holders_.end())
      throw ResourceError("cuda:" + std::to_string(d) + " is in use by " + it->second +
                          "; one run holds a GPU at a time: start this one when that run has ended, or on another GPU");
  }
  for (int d : ordinals) holders_[d] = holder;
}

void GpuHolders::release(const std::vector<int>& ordinals) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int d : ordinals) holders_.erase(d);
}

std::string GpuHolders::holder(int ordinal) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = holders_.find(ordinal);
  return it == holders_.end() ? std::string() : it->second;
}

GpuHolders& gpu_holders() {
  static GpuHolders* holders = new GpuHolders;  // never destroyed, as the device contexts
  return *holders;
}

DeviceBudgetLease::DeviceBudgetLease(const std::vector<Device>& devices, uint64_t bytes, const std::string& text,
                                     const std::string& holder) {
  std::vector<int> ordinals;
  for (const Device& d : devices)
    if (d.is_cuda() && std::find(ordinals.begin(), ordinals.end(), d.ordinal) == ordinals.end())
      ordinals.push_back(d.ordinal);
  if (ordinals.empty()) return;
  gpu_holders().claim(ordinals, holder + (bytes > 0 ? " under --gpu-mem-budget " + text : " (no --gpu-mem-budget)"));
#if GALE_WITH_CUDA
  std::vector<DeviceContext*> contexts;  // those reached, the failing one's included
  try {
    for (int d : ordinals) {
      contexts.push_back(&DeviceContext::get(d));
      contexts.back()->begin_budget(bytes == 0 ? kernels::cuda::MemoryBudget::kUnlimited : bytes,
                                    bytes == 0 ? std::string() : text);
    }
  } catch (...) {
    for (DeviceContext* ctx : contexts) ctx->end_budget();  // unbudgeted, as before the lease
    gpu_holders().release(ordinals);
    throw;
  }
#else
  (void)bytes;
  (void)text;
#endif
  ordinals_ = std::move(ordinals);
}

DeviceBudgetLease::~DeviceBudgetLease() { end(); }

DeviceBudgetLease::DeviceBudgetLease(DeviceBudgetLease&& other) noexcept : ordinals_(std::move(other.ordinals_)) {
  other.ordinals_.clear();
}

DeviceBudgetLease& DeviceBudgetLease::operator=(DeviceBudgetLease&& other) noexcept {
  if (this != &other) {
    end();
    ordinals_ = std::move(other.ordinals_);
    other.ordinals_.clear();
  }
  return *this;
}

void DeviceBudgetLease::end() noexcept {
  if (ordinals_.empty()) return;
#if GALE_WITH_CUDA
  for (int d : ordinals_) {
    try {
      DeviceContext::get(d).end_budget();
    } catch (...) {  // the context exists (the lease made it); get cannot fail here
    }
  }
#endif
  gpu_holders().release(ordinals_);
  ordinals_.clear();
}

uint64_t gpu_room(const Device& device, uint64_t gpu_mem_budget) {
  return gpu_mem_budget > 0 ? gpu_mem_budget : device_memory(device) / 10 * 9;
}

uint64_t gpu_room_left(const Device& device, uint64_t gpu_mem_budget) {
  const uint64_t room = gpu_room(device, gpu_mem_budget), in_use = gpu_in_use_bytes(device);
  return room > in_use ? room - in_use : 0;
}

uint64_t gpu_in_use_bytes(const Device& device) {
#if GALE_WITH_CUDA
  if (device.is_cuda()) return DeviceContext::get(device.ordinal).pool().in_use();
#endif
  (void)device;
  return 0;
}

uint64_t gpu_peak_bytes(const Device& device) {
#if GALE_WITH_CUDA
  if (device.is_cuda()) return DeviceContext::get(device.ordinal).pool().peak();
#endif
  (void)device;
  return 0;
}

GpuAllocationCounts gpu_allocation_counts(const Device& device) {
#if GALE_WITH_CUDA
  if (device.is_cuda()) {
    const auto c = DeviceContext::get(device.ordinal).pool().counts();
    return {c.allocations, c.reused};
  }
#endif
  (void)device;
  return {};
}

void reset_gpu_peak(const Device& device) {
#if GALE_WITH_CUDA
  if (device.is_cuda()) DeviceContext::get(device.ordinal).pool().reset_peak();
#endif
  (void)device;
}

void synchronize(const Device& device) {
#if GALE_WITH_CUDA
  if (device.is_cuda()) {
    DeviceContext& ctx = DeviceContext::get(device.ordinal);
    ctx.io_stream().synchronize();
    ctx.synchronize();
  }
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

int64_t device_l2_bytes(const Device& device) {
#if GALE_WITH_CUDA
  if (device.is_cuda()) return kernels::cuda::device_info(device.ordinal).l2_cache_bytes;
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

UseDevice::UseDevice(const Device& device) {
#if GALE_WITH_CUDA
  if (!device.is_cuda()) return;
  GALE_CHECK_CUDA(cudaGetDevice(&previous_));
  if (previous_ != device.ordinal) {
    GALE_CHECK_CUDA(cudaSetDevice(device.ordinal));
  } else {
    previous_ = -1;  // nothing to restore
  }
#else
  (void)device;
#endif
}

UseDevice::~UseDevice() {
#if GALE_WITH_CUDA
  if (previous_ >= 0) cudaSetDevice(previous_);
#endif
}

struct IoTimer::Impl {
  Device device;
#if GALE_WITH_CUDA
  std::vector<std::pair<kernels::cuda::Event, kernels::cuda::Event>> spans;
#endif
};

IoTimer::IoTimer(const Device& device) : impl_(std::make_unique<Impl>()) { impl_->device = device; }
IoTimer::~IoTimer() = default;

void IoTimer::begin() {
#if GALE_WITH_CUDA
  if (!impl_->device.is_cuda()) return;
  const int d = impl_->device.ordinal;
  impl_->spans.emplace_back(kernels::cuda::Event(d, kernels::cuda::Event::Timing::kEnabled),
                            kernels::cuda::Event(d, kernels::cuda::Event::Timing::kEnabled));
  impl_->spans.back().first.record(DeviceContext::get(d).io_stream());
#endif
}

void IoTimer::end() {
#if GALE_WITH_CUDA
  if (!impl_->device.is_cuda() || impl_->spans.empty()) return;
  impl_->spans.back().second.record(DeviceContext::get(impl_->device.ordinal).io_stream());
#endif
}

double IoTimer::take_seconds() {
  double ms = 0;
#if GALE_WITH_CUDA
  for (const auto& [start, stop] : impl_->spans) ms += kernels::cuda::elapsed_ms(start, stop);
  impl_->spans.clear();
#endif
  return ms * 1e-3;
}

struct LaggedReads::Impl {
  Device device;
  int64_t values = 0;
  std::vector<std::vector<float>> host;  // the CPU's slots
#if GALE_WITH_CUDA
  kernels::cuda::PinnedBuffer pinned;  // slots x values floats
  std::vector<kernels::cuda::Event> made, copied;  // per slot: its tensor made (compute), copied (side)
  std::optional<kernels::cuda::Stream> side;
#endif
};

LaggedReads::LaggedReads(const Device& device, int slots, int64_t values) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  impl_->values = values;
  if (!device.is_cuda()) {
    impl_->host.assign(static_cast<size_t>(slots), std::vector<float>(static_cast<size_t>(values)));
    return;
  }
#if GALE_WITH_CUDA
  impl_->pinned = kernels::cuda::PinnedBuffer(static_cast<size_t>(slots * values) * sizeof(float));
  impl_->side.emplace(device.ordinal);
  for (int i = 0; i < slots; ++i) {
    impl_->made.emplace_back(device.ordinal);
    impl_->copied.emplace_back(device.ordinal);
  }
#endif
}

LaggedReads::~LaggedReads() {
#if GALE_WITH_CUDA
  if (impl_->side) impl_->side->synchronize_unchecked();  // no copy may land in the freed page-locked slots
#endif
}

void LaggedReads::copy(int slot, const Tensor& t) {
  GALE_ASSERT(t.numel() == impl_->values && t.dtype() == DType::kF32 && t.device() == impl_->device);
  if (!impl_->device.is_cuda()) {
    std::memcpy(impl_->host[static_cast<size_t>(slot)].data(), t.data<float>(), static_cast<size_t>(impl_->values) * sizeof(float));
    return;
  }
#if GALE_WITH_CUDA
  // The copy waits for the compute stream's work so far on the side stream: a copy to the host
  // on the compute stream held every later kernel behind it (measured: 5-10 us of a step).
  const auto i = static_cast<size_t>(slot);
  impl_->made[i].record(DeviceContext::get(impl_->device.ordinal).stream().get());
  impl_->side->wait(impl_->made[i]);
  float* dst = static_cast<float*>(impl_->pinned.host()) + slot * impl_->values;
  kernels::cuda::copy_to_host(dst, t.data<float>(), static_cast<size_t>(impl_->values), *impl_->side);
  impl_->copied[i].record(*impl_->side);
#endif
}

const float* LaggedReads::read(int slot) {
  if (!impl_->device.is_cuda()) return impl_->host[static_cast<size_t>(slot)].data();
#if GALE_WITH_CUDA
  impl_->copied[static_cast<size_t>(slot)].synchronize();
  return static_cast<const float*>(impl_->pinned.host()) + slot * impl_->values;
#else
  return nullptr;
#endif
}

struct MappedHostTable::Impl {
  Device device;
  int64_t rows = 0, cols = 0;
#if GALE_WITH_CUDA
  kernels::cuda::PinnedBuffer pinned;  // rows x cols floats
#endif
  int fd = -1;  // spilled: the unlinked scratch file
  std::string spill_name;  // for messages

  uint64_t row_bytes() const { return static_cast<uint64_t>(cols) * sizeof(float); }
  // A whole pread / pwrite at `offset`, or a ResourceError naming the scratch file (no room left).
  void io(bool write, char* data, uint64_t bytes, uint64_t offset) const {
    while (bytes > 0) {
      const ssize_t done = write ? ::pwrite(fd, data, bytes, static_cast<off_t>(offset))
                                 : ::pread(fd, data, bytes, static_cast<off_t>(offset));
      if (done < 0 && errno == EINTR) continue;
      if (done <= 0)
        throw ResourceError(spill_name + ": " + (write ? "writing" : "reading") + " layer outputs failed at byte " +
                            std::to_string(offset) + ": " + (done < 0 ? std::strerror(errno) : "end of file"));
      data += done;
      bytes -= static_cast<uint64_t>(done);
      offset += static_cast<uint64_t>(done);
    }
  }
  ~Impl() {
    if (fd >= 0) ::close(fd);
  }
};

MappedHostTable::MappedHostTable(const Device& device, int64_t rows, int64_t cols, kernels::cuda::MemoryBudget* host_budget,
                                 const std::filesystem::path& spill_dir)
    : impl_(std::make_unique<Impl>()) {
  GALE_ASSERT(device.is_cuda());
  impl_->device = device;
  impl_->rows = rows;
  impl_->cols = cols;
  const uint64_t bytes = static_cast<uint64_t>(std::max<int64_t>(1, rows * cols)) * sizeof(float);
#if GALE_WITH_CUDA
  try {
    impl_->pinned = kernels::cuda::PinnedBuffer(bytes, host_budget, "a layer's outputs in pinned host memory");
    return;
  } catch (const ResourceError&) {
    if (spill_dir.empty()) throw;
  }
#else
  (void)host_budget;
#endif
  // Beyond the host budget: a scratch file, unlinked at once.
  std::string pattern = (spill_dir / "gale-layer-outputs-XXXXXX").string();
  impl_->fd = ::mkstemp(pattern.data());
  if (impl_->fd < 0)
    throw InputError(spill_dir.string() + ": cannot create a scratch file for layer outputs (" + std::strerror(errno) +
                     "); give --temp-dir a writable directory");
  ::unlink(pattern.c_str());
  impl_->spill_name = pattern + " (unlinked)";
  if (::ftruncate(impl_->fd, static_cast<off_t>(bytes)) != 0)
    throw ResourceError(spill_dir.string() + ": no room for " + kernels::cuda::format_bytes(bytes) +
                        " of layer outputs (" + std::strerror(errno) + "); give --temp-dir a larger file system");
}

MappedHostTable::~MappedHostTable() = default;

bool MappedHostTable::spilled() const { return impl_->fd >= 0; }

void MappedHostTable::write_rows(int64_t begin, const Tensor& t) {
  GALE_ASSERT(t.dtype() == DType::kF32 && t.cols() == impl_->cols && begin >= 0 && begin + t.rows() <= impl_->rows);
  GALE_ASSERT(t.device() == impl_->device);
  if (spilled()) {
    std::vector<float> host = t.to_vector();
    impl_->io(true, reinterpret_cast<char*>(host.data()), host.size() * sizeof(float),
              static_cast<uint64_t>(begin) * impl_->row_bytes());
    return;
  }
#if GALE_WITH_CUDA
  const cudaStream_t s = DeviceContext::get(impl_->device.ordinal).stream().get();
  float* dst = static_cast<float*>(impl_->pinned.host()) + begin * impl_->cols;
  kernels::cuda::copy_to_host(dst, t.f32(), static_cast<size_t>(t.numel()), s);
#endif
}

Tensor MappedHostTable::gather(const Tensor& ids) const {
  GALE_ASSERT(ids.dtype() == DType::kI64 && ids.device() == impl_->device);
  if (spilled()) {  // the host reads the rows, and they go to the device
    const Tensor at = ids.to(Device::cpu());
    const int64_t* id = at.data<int64_t>();
    const int64_t n = ids.rows();
    Tensor rows = Tensor::empty(n, impl_->cols);
    const Impl& s = *impl_;
    const uint64_t rb = s.row_bytes();
    if (static_cast<uint64_t>(n) * 16 < static_cast<uint64_t>(s.rows)) {  // few rows: one read each, in parallel
      tbb::parallel_for(int64_t{0}, n, [&](int64_t i) {
        s.io(false, reinterpret_cast<char*>(rows.f32() + i * s.cols), rb, static_cast<uint64_t>(id[i]) * rb);
      });
      return rows.to(impl_->device);
    }
    // Many (a layer-wise chunk's sources): one pass over the file in ascending order, blocks of
    // up to 32 MiB spanning the rows needed, each block's rows copied out in parallel.
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return id[a] < id[b]; });
    const int64_t block_rows = std::max<int64_t>(1, (int64_t{32} << 20) / static_cast<int64_t>(rb));
    std::vector<char> block(static_cast<size_t>(block_rows) * rb);
    for (size_t k = 0; k < order.size();) {
      const int64_t first = id[order[k]];
      size_t end = k;
      while (end < order.size() && id[order[end]] < first + block_rows) ++end;
      const int64_t last = id[order[end - 1]];
      s.io(false, block.data(), static_cast<uint64_t>(last - first + 1) * rb, static_cast<uint64_t>(first) * rb);
      tbb::parallel_for(k, end, [&](size_t j) {
        std::memcpy(rows.f32() + order[j] * s.cols, block.data() + static_cast<uint64_t>(id[order[j]] - first) * rb, rb);
      });
      k = end;
    }
    return rows.to(impl_->device);
  }
  Tensor out = Tensor::empty(ids.rows(), impl_->cols, DType::kF32, impl_->device);
#if GALE_WITH_CUDA
  const kernels::ConstMatrixView table{static_cast<const float*>(impl_->pinned.device()), impl_->rows, impl_->cols,
                                       impl_->cols};
  kernels::gather_rows_cuda(table, ids.data<int64_t>(), ids.rows(), out.view(),
                            DeviceContext::get(impl_->device.ordinal).stream().get());
#endif
  return out;
}

Tensor MappedHostTable::to_host() const {
  Tensor out = Tensor::empty(impl_->rows, impl_->cols);
  if (spilled()) {
    impl_->io(false, reinterpret_cast<char*>(out.f32()), out.nbytes(), 0);
    return out;
  }
#if GALE_WITH_CUDA
  synchronize(impl_->device);  // the writes queued on the compute stream
  std::memcpy(out.f32(), impl_->pinned.host(), out.nbytes());
#endif
  return out;
}

}  // namespace gale::engine

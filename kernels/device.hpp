// kernels/device.hpp — where an op runs: the CPU or one CUDA device (by ordinal).
#pragma once

#include <string>

namespace gale {

struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int ordinal = 0;

  static Device cpu() { return Device{Kind::kCpu, 0}; }
  static Device cuda(int ordinal) { return Device{Kind::kCuda, ordinal}; }
  bool is_cpu() const { return kind == Kind::kCpu; }
  bool is_cuda() const { return kind == Kind::kCuda; }
  std::string name() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(ordinal); }
  bool operator==(const Device& o) const { return kind == o.kind && ordinal == o.ordinal; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

}  // namespace gale

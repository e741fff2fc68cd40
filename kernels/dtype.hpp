// kernels/dtype.hpp — element types Gale stores and computes with, and f16/bf16 conversion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace gale {

enum class DType { kF32, kF16, kBF16, kF64, kI32, kI64, kU8 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kF64: case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 0;
}

// Names used on the command line and in manifest.json: f32 f16 bf16 f64 i32 i64 u8.
std::string dtype_name(DType t);
// Parses a dtype name; returns false when unknown.
bool parse_dtype(const std::string& name, DType* out);

// IEEE half and bfloat16 conversions with round-to-nearest-even (NaN kept quiet).
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Element i of an array of T that may sit at any byte address (a user's .npy may pad its header to
// any length, so its data need not be aligned to its element size).
template <typename T>
T load_unaligned(const void* src, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(src) + i * sizeof(T), sizeof(T));
  return v;
}

// Converts n values of type `from` at src (at any address) into f32 at dst (from may be f32,
// f16, bf16, f64).
void convert_to_f32(DType from, const void* src, float* dst, size_t n);
// Converts n f32 values into type `to` (f32, f16, bf16) at dst.
void convert_from_f32(DType to, const float* src, void* dst, size_t n);

}  // namespace gale

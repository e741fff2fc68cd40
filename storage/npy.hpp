// storage/npy.hpp — NumPy .npy arrays with data aligned to 4096 bytes.
//
// Gale writes NumPy format v1.0 headers padded with spaces so the data starts at byte 4096 (what
// O_DIRECT reads need); numpy.load(path, mmap_mode="r") opens every file. bf16 has no NumPy
// dtype: it is written as '<u2' and the manifest names the real type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.hpp"

namespace gale::storage {

constexpr size_t kNpyDataAlignment = 4096;

struct NpyHeader {
  DType dtype = DType::kF32;      // '<u2' reads back as kBF16 (the only u2 Gale writes); see descr
  std::string descr;              // the NumPy descr string, e.g. "<f4"
  std::vector<int64_t> shape;
  bool fortran_order = false;
  size_t data_offset = 0;         // where the data starts in the file
  int64_t count() const;          // product of shape (1 for a scalar)
};

// "(2, 3)": a shape as messages print it.
std::string shape_text(const std::vector<int64_t>& shape);

// The descr of a store's page sums (storage/page_sums.hpp): u32 has no DType, so these arrays are
// written by descr and read back only where a caller asks for them.
constexpr const char* kPageSumsDescr = "<u4";

// Reads and validates a header; throws InputError (for user-supplied arrays) naming the file and
// what is wrong. Accepts any v1/v2/v3 header, little-endian numeric descr; '<u4' only when
// `page_sums` is set (it then reads back as kI32, the same width, with descr kPageSumsDescr), so a
// user's u4 array is never taken for i32.
NpyHeader read_npy_header(const std::string& path, bool page_sums = false);

// Streams an array to disk: header padded to 4096 bytes, then data; hashes as it writes, the
// whole file with XXH64 and each 4096-byte page with XXH32 (the store's page sums).
class NpyWriter {
 public:
  // `stored` is the element type; bf16 is written with descr '<u2'.
  NpyWriter(const std::string& path, DType stored, std::vector<int64_t> shape);
  // An array of `item_size`-byte elements with NumPy descr `descr` (kPageSumsDescr for page sums).
  NpyWriter(const std::string& path, const std::string& descr, size_t item_size, std::vector<int64_t> shape);
  ~NpyWriter();
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;

  void write(const void* data, size_t bytes);
  // Checks that exactly count*itemsize bytes were written, fsyncs and closes.
  void finish();
  uint64_t file_size() const;   // valid after finish()
  uint64_t xxh64() const;       // xxHash64 (seed 0) of the whole file, valid after finish()
  // page_sum() of each 4096-byte page of the file, header page included; valid after finish(),
  // empty when they were sent elsewhere.
  const std::vector<uint32_t>& page_sums() const;
  // Sends the page sums to `sums` (a u32 array of page_count(file size) entries, which the caller
  // finishes after this writer) in batches as pages complete, so a large array's sums are never
  // all held in memory. Call before the first write().
  void send_page_sums_to(NpyWriter* sums);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace gale::storage

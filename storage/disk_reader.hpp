// storage/disk_reader.hpp — batched reads of one file, O_DIRECT, through io_uring or a pread pool.
//
// The disk tier (storage/disk_features.hpp) asks for many extents of features.npy at once and
// wants them all in memory on return. Two engines offer the same face: io_uring (liburing; fixed
// file, optional registered buffers, the queue kept full as completions arrive) and a pool of
// threads calling pread, for hosts where io_uring is refused (seccomp in containers, old kernels).
// The file is opened with O_DIRECT so the page cache neither doubles the memory held nor escapes
// the host budget; a filesystem that refuses O_DIRECT (tmpfs) gets buffered reads instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>

namespace gale::storage {

// What open_disk_reader uses. kAuto: io_uring, or pread where io_uring_queue_init is refused
// (EPERM, ENOSYS, EACCES); the environment variable GALE_IO_ENGINE=auto|io_uring|pread overrides it.
enum class IoEngine { kAuto, kUring, kPread };

// The engine GALE_IO_ENGINE names; kAuto when unset or empty. Throws InputError naming the
// variable on any other value.
IoEngine io_engine_from_env();

// O_DIRECT needs offsets, lengths and destinations aligned to the logical block size; 4096 covers
// every device Gale meets and is the page of the store's page sums.
constexpr size_t kDirectAlignment = 4096;

// One extent to read: `length` bytes at byte `offset` of the file into `dest`. When the reader is
// direct(), offset and length are multiples of kDirectAlignment and dest is aligned to it.
// Bytes past the end of the file read as zero.
struct ReadRequest {
  uint64_t offset = 0;
  uint32_t length = 0;
  void* dest = nullptr;
};

class DiskReader {
 public:
  virtual ~DiskReader();
  DiskReader(const DiskReader&) = delete;
  DiskReader& operator=(const DiskReader&) = delete;

  // Reads requests[0..n); all are complete on return, done in any order. Safe to call from
  // several threads at once. Throws InputError "FILE: read failed at byte OFFSET: reason" on an
  // I/O error (ResourceError for ENOMEM); the destinations are no longer written once it throws.
  virtual void read(const ReadRequest* requests, size_t n) = 0;

  // "io_uring" or "pread", for logs and `describe()` lines.
  virtual const char* engine_name() const = 0;

  // Optional: io_uring reads whose destination lies inside a registered buffer use
  // IORING_OP_READ_FIXED (no page pinning per read). The buffer must stay alive until
  // unregister_buffer(data), unregister_buffers() or the reader's end. A no-op for pread; a
  // registration the kernel refuses (RLIMIT_MEMLOCK) silently falls back to plain reads. A call
  // under way keeps the registrations its ring started with; idle rings drop an unregistered
  // buffer at once, a busy one when its call ends, and every ring takes up new ones when a call
  // takes it.
  virtual void register_buffer(void* data, size_t bytes);
  virtual void unregister_buffer(const void* data);
  virtual void unregister_buffers();
  // Reads submitted into a registered buffer (IORING_OP_READ_FIXED), and registrations the kernel
  // refused, since open; 0 for pread.
  virtual int64_t fixed_reads() const { return 0; }
  virtual int64_t refused_registrations() const { return 0; }

  // Whether the file was opened with O_DIRECT (false where the filesystem refused it).
  bool direct() const { return direct_; }
  // Size at open.
  uint64_t file_size() const { return file_size_; }
  const std::filesystem::path& path() const { return path_; }

 protected:
  DiskReader(std::filesystem::path path, int fd, bool direct, uint64_t file_size);
  int fd() const { return fd_; }

 private:
  std::filesystem::path path_;
  int fd_;          // owned; closed by ~DiskReader
  bool direct_;
  uint64_t file_size_;
};

// What `size`-byte reads cost on `reader`'s disk: at random `size`-aligned offsets (or one after
// the other, `sequential`), `depth` in flight, for about `seconds`. `gale bench io` prints these; the
// disk tier measures two of them to plan its reads (request_pages). `staging` is size x depth bytes,
// 4096-aligned.
struct ReadCeiling {
  uint64_t read_bytes = 0;
  int64_t reads = 0;
  double seconds = 0;
  double reads_per_s() const { return seconds > 0 ? static_cast<double>(reads) / seconds : 0; }
  double bytes_per_s() const { return seconds > 0 ? static_cast<double>(read_bytes) / seconds : 0; }
};
ReadCeiling measure_reads(DiskReader& reader, uint32_t size, bool sequential, int depth, double seconds,
                          uint64_t seed, void* staging);

// What a request costs on top of its pages, in 4 KiB pages read in bulk: with many reads in flight
// a read of n pages takes about (n + request_pages) x p, p the time of a page in `large` reads.
// That is a random 4 KiB read's time over p, less the page itself. The H200 machines: 70-80K random
// 4 KiB reads/s and 1.4-1.75 GB/s in reads of 256 KiB or 1 MiB, so 3.3-4.4; their window reads
// fit 10.7 us a request and 2.5 us a page (4.3). 0 for a device with no cost per request.
double request_pages(const ReadCeiling& random_4k, const ReadCeiling& large);

// Opens `file` for reading. Throws InputError naming the file when it cannot be opened, and
// ResourceError when io_uring was asked for by name (engine or GALE_IO_ENGINE) and is refused.
// queue_depth: reads in flight per calling thread (io_uring ring size; pread pool size, at most 64).
std::unique_ptr<DiskReader> open_disk_reader(const std::filesystem::path& file,
                                             IoEngine engine = IoEngine::kAuto, int queue_depth = 64);

}  // namespace gale::storage

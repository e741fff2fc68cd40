#include "storage/disk_reader.hpp"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/error.hpp"

namespace gale::storage {

namespace fs = std::filesystem;

namespace {

std::string errno_text(int err) { return std::strerror(err); }

// The error a failed read raises: ENOMEM is the host running out, anything else is the file's.
std::exception_ptr read_error(const fs::path& path, uint64_t offset, int err) {
  const std::string message =
      path.string() + ": read failed at byte " + std::to_string(offset) + ": " + errno_text(err);
  if (err == ENOMEM) return std::make_exception_ptr(ResourceError(message));
  return std::make_exception_ptr(InputError(message));
}

// A request can need several reads: a short read mid-file continues where it stopped (at the last
// aligned byte under O_DIRECT, re-reading a partial block), a short read at the end of the file
// zero-fills the rest. Returns kDone, kAgain (submit the rest), or kStuck (no progress, repeatedly).
enum class Step { kDone, kAgain, kStuck };
constexpr int kMaxStalls = 16;

struct Progress {
  uint32_t done = 0;
  int stalls = 0;
};

Step advance(const ReadRequest& r, Progress& p, uint64_t res, uint64_t file_size, bool direct) {
  const uint32_t before = p.done;
  if (res == 0 || r.offset + p.done + res >= file_size) {
    p.done += static_cast<uint32_t>(std::min<uint64_t>(res, r.length - p.done));
    std::memset(static_cast<char*>(r.dest) + p.done, 0, r.length - p.done);
    p.done = r.length;
    return Step::kDone;
  }
  p.done += static_cast<uint32_t>(res);
  if (p.done >= r.length) return Step::kDone;
  if (direct) p.done &= ~static_cast<uint32_t>(kDirectAlignment - 1);
  if (p.done <= before && ++p.stalls > kMaxStalls) return Step::kStuck;
  return Step::kAgain;
}

std::exception_ptr stuck_error(const fs::path& path, const ReadRequest& r, const Progress& p) {
  return std::make_exception_ptr(InputError(path.string() + ": read failed at byte " +
                                            std::to_string(r.offset + p.done) +
                                            ": repeated short reads"));
}

// ---------------------------------------------------------------------------------------------
// io_uring

// One ring with the file registered at index 0. A ring serves one read() call at a time.
class Ring {
 public:
  // Returns 0 or the negative errno of io_uring_queue_init / io_uring_register_files.
  int init(unsigned entries, int fd) {
    const int rc = io_uring_queue_init(entries, &ring_, 0);
    if (rc < 0) return rc;
    initialised_ = true;
    const int reg = io_uring_register_files(&ring_, &fd, 1);
    if (reg < 0) return reg;
    return 0;
  }
  ~Ring() {
    if (initialised_) io_uring_queue_exit(&ring_);
  }
  Ring() = default;
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  io_uring* get() { return &ring_; }

  // Brings the ring's registered buffers up to `generation` (what register_buffer last set).
  // Returns false where the kernel refused the registration (the ring then reads without it).
  bool sync_buffers(const std::vector<iovec>& buffers, uint64_t generation) {
    if (generation == generation_) return true;
    if (!buffers_.empty()) io_uring_unregister_buffers(&ring_);
    buffers_.clear();
    generation_ = generation;
    if (buffers.empty()) return true;
    if (io_uring_register_buffers(&ring_, buffers.data(), static_cast<unsigned>(buffers.size())) != 0) return false;
    buffers_ = buffers;
    return true;
  }

  // Index of the registered buffer holding [p, p + len), or -1.
  int buffer_of(const void* p, size_t len) const {
    const auto* c = static_cast<const char*>(p);
    for (size_t i = 0; i < buffers_.size(); ++i) {
      const auto* base = static_cast<const char*>(buffers_[i].iov_base);
      if (c >= base && c + len <= base + buffers_[i].iov_len) return static_cast<int>(i);
    }
    return -1;
  }

 private:
  io_uring ring_{};
  bool initialised_ = false;
  std::vector<iovec> buffers_;
  uint64_t generation_ = 0;
};

class UringReader final : public DiskReader {
 public:
  UringReader(fs::path path, int fd, bool direct, uint64_t size, unsigned depth,
              std::unique_ptr<Ring> first)
      : DiskReader(std::move(path), fd, direct, size), depth_(depth) {
    free_.push_back(std::move(first));
  }

  const char* engine_name() const override { return "io_uring"; }

  void register_buffer(void* data, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    buffers_.push_back(iovec{data, bytes});
    ++generation_;
  }
  int64_t fixed_reads() const override { return fixed_.load(std::memory_order_relaxed); }
  int64_t refused_registrations() const override { return refused_.load(std::memory_order_relaxed); }

  void unregister_buffer(const void* data) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = std::find_if(buffers_.begin(), buffers_.end(), [&](const iovec& b) { return b.iov_base == data; });
    if (it == buffers_.end()) return;
    buffers_.erase(it);
    ++generation_;
    sync_idle_rings();
  }
  void unregister_buffers() override {
    std::lock_guard<std::mutex> lock(mu_);
    buffers_.clear();
    ++generation_;
    sync_idle_rings();
  }

  void read(const ReadRequest* requests, size_t n) override {
    if (n == 0) return;
    std::unique_ptr<Ring> ring = take_ring();
    const Outcome outcome = run(*ring, requests, n);
    // A ring whose submission failed may still hold reads in flight: it is destroyed, never reused.
    if (outcome.ring_usable) {
      std::lock_guard<std::mutex> lock(mu_);
      // A buffer unregistered during the call stays pinned by this ring until it syncs: now.
      sync(*ring, buffers_, generation_);
      free_.push_back(std::move(ring));
    }
    if (outcome.error) std::rethrow_exception(outcome.error);
  }

 private:
  // An unregistered buffer's pages stay pinned (resident, and counted by a cgroup, though the
  // budget has let them go) while any ring still has them registered: the idle rings drop them at
  // once, a ring in use when its call ends. Holds mu_.
  void sync_idle_rings() {
    for (const std::unique_ptr<Ring>& ring : free_) sync(*ring, buffers_, generation_);
  }
  // Ring::sync_buffers, counting a refusal.
  void sync(Ring& ring, const std::vector<iovec>& buffers, uint64_t generation) {
    if (!ring.sync_buffers(buffers, generation)) refused_.fetch_add(1, std::memory_order_relaxed);
  }

  // A ring for this call: an idle one, or a new one when every ring is busy in another thread.
  std::unique_ptr<Ring> take_ring() {
    std::unique_ptr<Ring> ring;
    std::vector<iovec> buffers;
    uint64_t generation;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        ring = std::move(free_.back());
        free_.pop_back();
      }
      buffers = buffers_;
      generation = generation_;
    }
    if (!ring) {
      ring = std::make_unique<Ring>();
      const int rc = ring->init(depth_, fd());
      if (rc < 0) {
        const std::string message = path().string() + ": cannot start another io_uring ring: " + errno_text(-rc);
        if (rc == -ENOMEM) throw ResourceError(message);
        throw InputError(message);
      }
    }
    sync(*ring, buffers, generation);
    return ring;
  }

  struct Outcome {
    bool ring_usable = true;
    std::exception_ptr error;
  };

  // Reads every request through `ring`, keeping up to depth_ reads in flight: each completion
  // frees a slot that the next request (or the rest of a short read) fills at once. The first
  // error stops new submissions; the reads in flight are drained before it is rethrown, so no
  // destination is written after read() returns.
  Outcome run(Ring& ring, const ReadRequest* requests, size_t n) {
    io_uring* r = ring.get();
    std::vector<Progress> progress(n);
    std::vector<size_t> again;
    size_t next = 0;
    unsigned in_flight = 0;
    int64_t fixed = 0;  // added to fixed_ once, as the call ends
    std::exception_ptr error;

    auto submit_one = [&](size_t i) {
      io_uring_sqe* sqe = io_uring_get_sqe(r);
      GALE_ASSERT(sqe != nullptr);  // in_flight <= depth_ = SQ size, and every SQE is submitted
      const ReadRequest& q = requests[i];
      char* dest = static_cast<char*>(q.dest) + progress[i].done;
      const unsigned len = q.length - progress[i].done;
      const uint64_t off = q.offset + progress[i].done;
      const int buf = ring.buffer_of(dest, len);
      if (buf >= 0) {
        ++fixed;
        io_uring_prep_read_fixed(sqe, 0, dest, len, off, buf);
      } else {
        io_uring_prep_read(sqe, 0, dest, len, off);
      }
      sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data64(sqe, i);
      ++in_flight;
    };

    while (true) {
      while (!error && in_flight < depth_) {
        if (!again.empty()) {
          submit_one(again.back());
          again.pop_back();
        } else if (next < n) {
          const size_t i = next++;
          if (requests[i].length > 0) submit_one(i);
        } else {
          break;
        }
      }
      if (in_flight == 0) break;
      const int rc = io_uring_submit_and_wait(r, 1);
      if (rc < 0) {
        if (rc == -EINTR || rc == -EAGAIN) continue;
        fixed_.fetch_add(fixed, std::memory_order_relaxed);
        return Outcome{false, read_error(path(), requests[0].offset, -rc)};
      }
      io_uring_cqe* cqe;
      unsigned head;
      unsigned seen = 0;
      io_uring_for_each_cqe(r, head, cqe) {
        ++seen;
        --in_flight;
        const size_t i = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
        const int res = cqe->res;
        if (error) continue;  // draining
        const ReadRequest& q = requests[i];
        if (res < 0) {
          if ((res == -EINTR || res == -EAGAIN) && ++progress[i].stalls <= kMaxStalls) {
            again.push_back(i);
          } else {
            error = read_error(path(), q.offset + progress[i].done, -res);
          }
          continue;
        }
        switch (advance(q, progress[i], static_cast<uint64_t>(res), file_size(), direct())) {
          case Step::kDone: break;
          case Step::kAgain: again.push_back(i); break;
          case Step::kStuck: error = stuck_error(path(), q, progress[i]); break;
        }
      }
      io_uring_cq_advance(r, seen);
    }
    fixed_.fetch_add(fixed, std::memory_order_relaxed);
    return Outcome{true, error};
  }

  const unsigned depth_;
  std::atomic<int64_t> fixed_{0}, refused_{0};
  std::mutex mu_;
  std::vector<std::unique_ptr<Ring>> free_;
  std::vector<iovec> buffers_;
  uint64_t generation_ = 0;
};

// ---------------------------------------------------------------------------------------------
// pread pool

class PreadReader final : public DiskReader {
 public:
  PreadReader(fs::path path, int fd, bool direct, uint64_t size, int threads)
      : DiskReader(std::move(path), fd, direct, size) {
    workers_.reserve(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t) workers_.emplace_back([this] { work_loop(); });
  }
  ~PreadReader() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  const char* engine_name() const override { return "pread"; }

  // The caller works on its own requests too, and the pool's threads join in: each takes the
  // next request until none is left. On return no worker touches the call's requests any more.
  void read(const ReadRequest* requests, size_t n) override {
    if (n == 0) return;
    Job job;
    job.requests = requests;
    job.n = n;
    const size_t helpers = std::min(n - 1, workers_.size());
    if (helpers > 0) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (size_t h = 0; h < helpers; ++h) queue_.push_back(&job);
      }
      if (helpers == 1) wake_.notify_one(); else wake_.notify_all();
    }
    work(job);
    {
      std::unique_lock<std::mutex> lock(mu_);
      queue_.erase(std::remove(queue_.begin(), queue_.end(), &job), queue_.end());
      job.done.wait(lock, [&] { return job.active == 0; });
    }
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  struct Job {
    const ReadRequest* requests = nullptr;
    size_t n = 0;
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex error_mu;
    std::exception_ptr error;
    int active = 0;                // workers inside work(); guarded by the pool's mu_
    std::condition_variable done;  // active reached 0
  };

  void work_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      Job* job = queue_.front();
      queue_.pop_front();
      ++job->active;
      lock.unlock();
      work(*job);
      lock.lock();
      // Notified under the lock: the caller cannot see active == 0 and free the job before this.
      if (--job->active == 0) job->done.notify_all();
    }
  }

  void work(Job& job) {
    while (!job.failed.load(std::memory_order_relaxed)) {
      const size_t i = job.next.fetch_add(1, std::memory_order_relaxed);
      if (i >= job.n) return;
      std::exception_ptr error = read_one(job.requests[i]);
      if (error) {
        std::lock_guard<std::mutex> lock(job.error_mu);
        if (!job.error) job.error = error;
        job.failed.store(true, std::memory_order_relaxed);
      }
    }
  }

  std::exception_ptr read_one(const ReadRequest& q) const {
    Progress p;
    while (p.done < q.length) {
      const ssize_t got = ::pread(fd(), static_cast<char*>(q.dest) + p.done, q.length - p.done,
                                  static_cast<off_t>(q.offset + p.done));
      if (got < 0) {
        if ((errno == EINTR || errno == EAGAIN) && ++p.stalls <= kMaxStalls) continue;
        return read_error(path(), q.offset + p.done, errno);
      }
      switch (advance(q, p, static_cast<uint64_t>(got), file_size(), direct())) {
        case Step::kDone: return nullptr;
        case Step::kAgain: break;
        case Step::kStuck: return stuck_error(path(), q, p);
      }
    }
    return nullptr;
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Job*> queue_;
  bool stop_ = false;
};

}  // namespace

// ---------------------------------------------------------------------------------------------

IoEngine io_engine_from_env() {
  const char* value = std::getenv("GALE_IO_ENGINE");
  if (value == nullptr || *value == '\0') return IoEngine::kAuto;
  const std::string v(value);
  if (v == "auto") return IoEngine::kAuto;
  if (v == "io_uring") return IoEngine::kUring;
  if (v == "pread") return IoEngine::kPread;
  throw InputError("GALE_IO_ENGINE=" + v + ": expected auto, io_uring or pread");
}

DiskReader::DiskReader(fs::path path, int fd, bool direct, uint64_t file_size)
    : path_(std::move(path)), fd_(fd), direct_(direct), file_size_(file_size) {}

DiskReader::~DiskReader() { ::close(fd_); }

void DiskReader::register_buffer(void*, size_t) {}
void DiskReader::unregister_buffer(const void*) {}
void DiskReader::unregister_buffers() {}

std::unique_ptr<DiskReader> open_disk_reader(const fs::path& file, IoEngine engine, int queue_depth) {
  if (queue_depth < 1) throw InputError("disk reader queue depth " + std::to_string(queue_depth) + ": expected >= 1");
  if (engine == IoEngine::kAuto) engine = io_engine_from_env();
  const bool by_name = engine != IoEngine::kAuto;

  bool direct = true;
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd < 0 && errno == EINVAL) {  // the filesystem has no O_DIRECT (tmpfs)
    direct = false;
    fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (fd < 0) throw InputError(file.string() + ": cannot open for reading: " + errno_text(errno));
  // Owns fd until a reader takes it.
  struct FdGuard {
    int fd;
    ~FdGuard() { if (fd >= 0) ::close(fd); }
  } guard{fd};

  struct stat st {};
  if (::fstat(fd, &st) != 0) throw InputError(file.string() + ": cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) throw InputError(file.string() + ": not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);

  if (engine == IoEngine::kUring || engine == IoEngine::kAuto) {
    auto ring = std::make_unique<Ring>();
    const unsigned depth = static_cast<unsigned>(std::min(queue_depth, 4096));
    const int rc = ring->init(depth, fd);
    if (rc == 0) {
      auto reader = std::make_unique<UringReader>(file, fd, direct, size, depth, std::move(ring));
      guard.fd = -1;
      return reader;
    }
    const bool refused = rc == -EPERM || rc == -ENOSYS || rc == -EACCES;
    if (by_name || !refused) {
      const std::string message = file.string() + ": io_uring is not available (" + errno_text(-rc) +
                                  ")" + (by_name ? std::string("; GALE_IO_ENGINE=pread reads without it") : "");
      throw ResourceError(message);
    }
    // kAuto and refused: fall through to the pread pool.
  }
  const int threads = std::clamp(queue_depth, 1, 64);
  auto reader = std::make_unique<PreadReader>(file, fd, direct, size, threads);
  guard.fd = -1;
  return reader;
}

ReadCeiling measure_reads(DiskReader& reader, uint32_t size, bool sequential, int depth, double seconds,
                          uint64_t seed, void* staging) {
  // A file smaller than the read size is read whole (in pages) each time.
  size = static_cast<uint32_t>(std::min<uint64_t>(size, reader.file_size() / kDirectAlignment * kDirectAlignment));
  if (size == 0)
    throw InputError(reader.path().string() + ": smaller than one " + std::to_string(kDirectAlignment) + "-byte page");
  const uint64_t slots = reader.file_size() / size;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint64_t> pick(0, slots - 1);
  std::vector<ReadRequest> batch(static_cast<size_t>(depth));
  ReadCeiling c;
  uint64_t next = 0;
  const auto t0 = std::chrono::steady_clock::now();
  do {
    for (int i = 0; i < depth; ++i) {
      const uint64_t slot = sequential ? next++ % slots : pick(rng);
      batch[static_cast<size_t>(i)] = {slot * size, size, static_cast<char*>(staging) + static_cast<size_t>(i) * size};
    }
    reader.read(batch.data(), batch.size());
    c.reads += depth;
    c.read_bytes += static_cast<uint64_t>(size) * static_cast<uint64_t>(depth);
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (c.seconds < seconds && !(sequential && next >= slots));
  return c;
}

double request_pages(const ReadCeiling& random_4k, const ReadCeiling& large) {
  if (random_4k.reads_per_s() <= 0) return 0;
  const double pages = large.bytes_per_s() / static_cast<double>(kDirectAlignment) / random_4k.reads_per_s();
  return std::max(0.0, pages - 1);
}

}  // namespace gale::storage

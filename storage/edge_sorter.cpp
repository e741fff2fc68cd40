#include "storage/edge_sorter.hpp"

#include <tbb/parallel_sort.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <queue>
#include <random>

#include "kernels/error.hpp"
#include "storage/temp_paths.hpp"

namespace gale::storage {

namespace fs = std::filesystem;

namespace {

// Buffered sequential reader of one sorted run.
class RunReader {
 public:
  explicit RunReader(const fs::path& file) : f_(std::fopen(file.c_str(), "rb")), path_(file.string()) {
    if (!f_) throw InputError(path_ + ": cannot reopen sorted run: " + std::strerror(errno));
    buf_.resize(1 << 14);
  }
  ~RunReader() {
    if (f_) std::fclose(f_);
  }
  bool next(Edge* e) {
    if (pos_ == len_) {
      len_ = std::fread(buf_.data(), sizeof(Edge), buf_.size(), f_);
      pos_ = 0;
      if (len_ == 0) {
        if (std::ferror(f_)) throw InputError(path_ + ": read error in sorted run");
        return false;
      }
    }
    *e = buf_[pos_++];
    return true;
  }

 private:
  FILE* f_;
  std::string path_;
  std::vector<Edge> buf_;
  size_t pos_ = 0, len_ = 0;
};

}  // namespace

EdgeSorter::EdgeSorter(uint64_t budget, fs::path temp_parent) : temp_parent_(std::move(temp_parent)) {
  capacity_ = std::max<uint64_t>(16, budget / sizeof(Edge));
}

EdgeSorter::~EdgeSorter() {
  if (!dir_.empty()) {
    const auto lock = lock_temps();
    std::error_code ec;
    fs::remove_all(dir_, ec);
    unregister_temp(dir_);
  }
}

fs::path EdgeSorter::run_dir() {
  if (dir_.empty()) {
    std::error_code ec;
    remove_stale_temps(temp_parent_, ".gale-sort-");  // what a killed run left
    const fs::path dir = temp_parent_ / temp_name(".gale-sort-");
    const auto lock = lock_temps();
    fs::create_directory(dir, ec);
    if (ec) throw InputError(dir.string() + ": cannot create the directory for sorted runs: " + ec.message());
    dir_ = dir;
    register_temp(dir_);  // a stop signal removes it (apps/stop_cleanup.hpp)
  }
  return dir_;
}

void EdgeSorter::spill() {
  if (buffer_.empty()) return;
  tbb::parallel_sort(buffer_.begin(), buffer_.end(), edge_less);
  const fs::path file = run_dir() / ("run-" + std::to_string(runs_.size()) + ".bin");
  FILE* f = std::fopen(file.c_str(), "wb");
  if (!f) {
    const int err = errno;
    const std::string msg = file.string() + ": cannot create sorted run: " + std::strerror(err);
    if (err == ENOSPC || err == EDQUOT) throw ResourceError(msg);  // out of room (or inodes): exit 4
    throw InputError(msg);
  }
  const bool written = std::fwrite(buffer_.data(), sizeof(Edge), buffer_.size(), f) == buffer_.size();
  int err = written ? 0 : errno;
  if (std::fclose(f) != 0 && err == 0) err = errno;
  if (!written || err != 0)
    throw ResourceError(file.string() + ": cannot write sorted run: " + (err != 0 ? std::strerror(err) : "short write"));
  runs_.push_back(file);
  buffer_.clear();
}

void EdgeSorter::finish(bool dedup, bool drop_self_loops, const std::function<void(const Edge&)>& emit) {
  bool have_last = false;
  Edge last{};
  auto out = [&](const Edge& e) {
    if (drop_self_loops && e.src == e.dst) return;
    if (dedup && have_last && last.dst == e.dst && last.src == e.src) return;
    last = e;
    have_last = true;
    emit(e);
  };
  if (runs_.empty()) {
    tbb::parallel_sort(buffer_.begin(), buffer_.end(), edge_less);
    for (const Edge& e : buffer_) out(e);
    buffer_.clear();
    buffer_.shrink_to_fit();
    return;
  }
  spill();
  buffer_.shrink_to_fit();
  // k-way merge: a min-heap of the runs' current heads.
  std::vector<std::unique_ptr<RunReader>> readers;
  using Head = std::pair<Edge, size_t>;
  auto greater = [](const Head& a, const Head& b) { return edge_less(b.first, a.first); };
  std::priority_queue<Head, std::vector<Head>, decltype(greater)> heap(greater);
  for (size_t r = 0; r < runs_.size(); ++r) {
    readers.push_back(std::make_unique<RunReader>(runs_[r]));
    Edge e;
    if (readers.back()->next(&e)) heap.push({e, r});
  }
  while (!heap.empty()) {
    const Head h = heap.top();
    heap.pop();
    out(h.first);
    Edge e;
    if (readers[h.second]->next(&e)) heap.push({e, h.second});
  }
}

}  // namespace gale::storage

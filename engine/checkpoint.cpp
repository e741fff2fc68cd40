#include "engine/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "kernels/error.hpp"
#include "storage/temp_paths.hpp"

namespace gale::engine {

namespace {

constexpr char kMagic[8] = {'G', 'A', 'L', 'E', 'C', 'K', 'P', 'T'};

void append(std::string* buf, const void* data, size_t n) {
  buf->append(static_cast<const char*>(data), n);
}

// A failed system call on a checkpoint's file: no room (a full disk, a quota, a file-size limit;
// fsync reports it too on file systems that allocate late) is exit 4, anything else exit 2.
[[noreturn]] void throw_io(const std::filesystem::path& file, const char* what, int err) {
  const std::string why = std::strerror(err);
  if (err == ENOSPC || err == EDQUOT || err == EFBIG)
    throw ResourceError(file.string() + ": no room left writing the checkpoint: " + why);
  throw InputError(file.string() + ": " + what + ": " + why);
}

void write_all(int fd, const char* data, size_t n, const std::filesystem::path& file) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_io(file, "cannot write checkpoint", errno);
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_dir(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

void save_checkpoint(const std::filesystem::path& file, const CheckpointState& state) {
  nlohmann::json header;
  header["epoch"] = state.epoch;
  if (state.batches_done > 0) {
    header["batches_done"] = state.batches_done;
    header["partial_loss_sums"] = state.partial_loss_sums;
  }
  header["adam_steps"] = state.adam_steps;
  header["best_valid_acc"] = state.best_valid_acc;
  header["test_acc_at_best_valid"] = state.test_acc_at_best_valid;
  header["best_epoch"] = state.best_epoch;
  header["improved_epoch"] = state.improved_epoch;
  if (state.lr_reductions > 0) {
    header["lr_reductions"] = state.lr_reductions;
    header["lr_reduced_epoch"] = state.lr_reduced_epoch;
  }
  header["config"] = state.config_json;
  nlohmann::json table = nlohmann::json::array();
  for (size_t i = 0; i < state.names.size(); ++i)
    table.push_back({{"name", state.names[i]}, {"rows", state.params[i].rows()}, {"cols", state.params[i].cols()}});
  header["tensors"] = table;
  if (!state.buffers.empty()) {
    nlohmann::json buffers = nlohmann::json::array();
    for (size_t i = 0; i < state.buffers.size(); ++i)
      buffers.push_back(
          {{"name", state.buffer_names[i]}, {"rows", state.buffers[i].rows()}, {"cols", state.buffers[i].cols()}});
    header["buffers"] = buffers;
  }
  const std::string text = header.dump();

  std::string buf;
  append(&buf, kMagic, sizeof(kMagic));
  const uint32_t version = kCheckpointVersion;
  append(&buf, &version, 4);
  const uint64_t len = text.size();
  append(&buf, &len, 8);
  buf += text;
  for (const auto* group : {&state.params, &state.adam_m, &state.adam_v, &state.buffers}) {
    for (const Tensor& t : *group) append(&buf, t.f32(), t.nbytes());
  }
  const uint64_t hash = XXH64(buf.data(), buf.size(), 0);
  append(&buf, &hash, 8);

  std::error_code ec;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
  if (ec) throw InputError(file.parent_path().string() + ": cannot create checkpoint directory: " + ec.message());
  // A hidden temporary beside the file, named for this host and pid, so that the next save
  // removes what a killed run (SIGKILL, a crash, a second Ctrl-C) left half-written.
  const std::string prefix = "." + file.filename().string() + ".tmp-";
  const std::filesystem::path dir = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  storage::remove_stale_temps(dir, prefix);
  const std::filesystem::path tmp = dir / storage::temp_name(prefix);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_io(tmp, "cannot create checkpoint", errno);
  try {
    write_all(fd, buf.data(), buf.size(), tmp);
    if (::fsync(fd) != 0) throw_io(tmp, "fsync failed", errno);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), file.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw InputError(file.string() + ": cannot replace checkpoint: " + why);
  }
  fsync_dir(dir);
}

CheckpointState load_checkpoint(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw InputError(file.string() + ": cannot open checkpoint");
  std::string buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string where = file.string() + ": ";
  if (buf.size() < 28 || std::memcmp(buf.data(), kMagic, 8) != 0)
    throw CorruptStoreError(where + "not a Gale checkpoint (bad magic or too short)");
  uint64_t stored_hash;
  std::memcpy(&stored_hash, buf.data() + buf.size() - 8, 8);
  if (XXH64(buf.data(), buf.size() - 8, 0) != stored_hash)
    throw CorruptStoreError(where + "checksum mismatch: the checkpoint is torn or corrupt");
  uint32_t version;
  std::memcpy(&version, buf.data() + 8, 4);
  if (version != kCheckpointVersion)
    throw CorruptStoreError(where + "checkpoint version " + std::to_string(version) + ", this Gale reads version " +
                            std::to_string(kCheckpointVersion));
  uint64_t len;
  std::memcpy(&len, buf.data() + 12, 8);
  if (20 + len + 8 > buf.size()) throw CorruptStoreError(where + "header length exceeds the file");
  CheckpointState s;
  size_t pos = 20 + len;
  try {
    const nlohmann::json header = nlohmann::json::parse(buf.substr(20, len));
    s.epoch = header.at("epoch").get<int64_t>();
    s.batches_done = header.value("batches_done", int64_t{0});
    if (s.batches_done < 0) throw CorruptStoreError(where + "negative batches_done in the header");
    if (s.batches_done > 0) {
      // One worker's checkpoints before several could stop inside an epoch wrote a single sum.
      if (header.contains("partial_loss_sums"))
        s.partial_loss_sums = header.at("partial_loss_sums").get<std::vector<double>>();
      else
        s.partial_loss_sums = {header.at("partial_loss_sum").get<double>()};
      if (s.partial_loss_sums.empty()) throw CorruptStoreError(where + "batches_done without the workers' loss sums");
    }
    s.adam_steps = header.at("adam_steps").get<int64_t>();
    s.best_valid_acc = header.at("best_valid_acc").get<double>();
    s.test_acc_at_best_valid = header.at("test_acc_at_best_valid").get<double>();
    s.best_epoch = header.at("best_epoch").get<int64_t>();
    s.improved_epoch = header.value("improved_epoch", s.best_epoch);
    s.lr_reductions = header.value("lr_reductions", int64_t{0});
    s.lr_reduced_epoch = header.value("lr_reduced_epoch", int64_t{-1});
    if (s.lr_reductions < 0) throw CorruptStoreError(where + "negative lr_reductions in the header");
    s.config_json = header.at("config").get<std::string>();
    std::vector<std::pair<int64_t, int64_t>> shapes;
    for (const auto& t : header.at("tensors")) {
      s.names.push_back(t.at("name").get<std::string>());
      shapes.emplace_back(t.at("rows").get<int64_t>(), t.at("cols").get<int64_t>());
    }
    std::vector<std::pair<int64_t, int64_t>> buffer_shapes;
    if (header.contains("buffers")) {
      for (const auto& t : header.at("buffers")) {
        s.buffer_names.push_back(t.at("name").get<std::string>());
        buffer_shapes.emplace_back(t.at("rows").get<int64_t>(), t.at("cols").get<int64_t>());
      }
    }
    auto read_group = [&](const std::vector<std::pair<int64_t, int64_t>>& group_shapes, std::vector<Tensor>* group) {
      for (const auto& [rows, cols] : group_shapes) {
        if (rows < 0 || cols < 0) throw CorruptStoreError(where + "negative tensor shape in the header");
        Tensor t = Tensor::empty(rows, cols);
        if (pos + t.nbytes() > buf.size() - 8) throw CorruptStoreError(where + "tensor data exceeds the file");
        std::memcpy(t.f32(), buf.data() + pos, t.nbytes());
        pos += t.nbytes();
        group->push_back(t);
      }
    };
    for (auto* group : {&s.params, &s.adam_m, &s.adam_v}) read_group(shapes, group);
    read_group(buffer_shapes, &s.buffers);
  } catch (const nlohmann::json::exception& e) {
    throw CorruptStoreError(where + "malformed header: " + e.what());
  }
  if (pos != buf.size() - 8) throw CorruptStoreError(where + "trailing bytes after the tensors");
  return s;
}

void restore_buffers(const CheckpointState& state, Model* model, const std::filesystem::path& file) {
  const std::vector<Buffer*> buffers = model->buffers();
  if (buffers.size() != state.buffers.size())
    throw CorruptStoreError(file.string() + ": holds " + std::to_string(state.buffers.size()) +
                            " buffers (running statistics), the model " + std::to_string(buffers.size()));
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Tensor& saved = state.buffers[i];
    if (state.buffer_names[i] != buffers[i]->name || saved.rows() != buffers[i]->value.rows() ||
        saved.cols() != buffers[i]->value.cols())
      throw CorruptStoreError(file.string() + ": buffer " + state.buffer_names[i] + " does not match the model");
    // A copy of its own even on the host: each replica updates its buffers in place.
    buffers[i]->value = model->device().is_cpu() ? saved.clone() : saved.to(model->device());
  }
}

void restore_weights(const CheckpointState& state, Model* model, const std::filesystem::path& file) {
  auto params = model->parameters();
  if (params.size() != state.names.size()) throw CorruptStoreError(file.string() + ": parameter count differs");
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i]->name != state.names[i] || params[i]->value.rows() != state.params[i].rows() ||
        params[i]->value.cols() != state.params[i].cols())
      throw CorruptStoreError(file.string() + ": parameter " + state.names[i] + " does not match the model");
    params[i]->value = model->device().is_cpu() ? state.params[i].clone() : state.params[i].to(model->device());
  }
  restore_buffers(state, model, file);
}

struct CheckpointWriter::Impl {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::pair<std::filesystem::path, CheckpointState>> queue;
  bool busy = false;  // a write in progress (taken off the queue)
  bool closing = false;
  std::exception_ptr error;  // the first failed write's, until reported
  std::thread thread;

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      changed.wait(lock, [&] { return closing || !queue.empty(); });
      if (queue.empty()) return;  // closing, and everything written
      auto job = std::move(queue.front());
      queue.pop_front();
      busy = true;
      lock.unlock();
      std::exception_ptr failed;
      try {
        save_checkpoint(job.first, job.second);
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      if (failed && !error) error = failed;
      busy = false;
      changed.notify_all();
    }
  }
  // Throws the error a write left, once (the caller holds the mutex).
  void rethrow_error() {
    if (!error) return;
    std::exception_ptr e = std::exchange(error, nullptr);
    std::rethrow_exception(e);
  }
};

CheckpointWriter::CheckpointWriter() : impl_(std::make_unique<Impl>()) {
  impl_->thread = std::thread([this] { impl_->run(); });
}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->closing = true;
  }
  impl_->changed.notify_all();
  impl_->thread.join();
}

void CheckpointWriter::submit(std::filesystem::path file, CheckpointState state) {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->rethrow_error();
  impl_->queue.emplace_back(std::move(file), std::move(state));
  impl_->changed.notify_all();
}

void CheckpointWriter::wait() {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->changed.wait(lock, [&] { return impl_->queue.empty() && !impl_->busy; });
  impl_->rethrow_error();
}

}  // namespace gale::engine

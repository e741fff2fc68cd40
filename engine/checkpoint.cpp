#include "engine/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
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

// ----- the file's layout, each section written and read by a pair of functions ---------------
//
//   magic (8 bytes) | version (u32) | header length (u64) | header (JSON) | tensor data | xxHash64
//
// the numbers in host order, the hash of every byte before it. The tensor data is kDataGroups in
// order, each tensor's f32 values in its header table's shape.

constexpr char kMagic[8] = {'G', 'A', 'L', 'E', 'C', 'K', 'P', 'T'};
constexpr size_t kVersionAt = 8, kLengthAt = 12, kHeaderAt = 20, kHashBytes = 8;

using Shapes = std::vector<std::pair<int64_t, int64_t>>;

// The shapes of the header's two tables, "tensors" (the parameters') and "buffers".
struct Tables {
  Shapes tensors, buffers;
};

// A group of the tensor data and the header table that shapes its tensors.
struct DataGroup {
  std::vector<Tensor> CheckpointState::*tensors;
  Shapes Tables::*shapes;
};

// The tensor data's groups in file order: the parameters and Adam's two moments (all three shaped
// by the "tensors" table), then the buffers.
constexpr DataGroup kDataGroups[] = {{&CheckpointState::params, &Tables::tensors},
                                     {&CheckpointState::adam_m, &Tables::tensors},
                                     {&CheckpointState::adam_v, &Tables::tensors},
                                     {&CheckpointState::buffers, &Tables::buffers}};

void append(std::string* buf, const void* data, size_t n) {
  buf->append(static_cast<const char*>(data), n);
}

// Writes the fixed prefix: the magic, the version and the header's length.
void append_prefix(std::string* buf, uint64_t header_length) {
  append(buf, kMagic, sizeof(kMagic));
  const uint32_t version = kCheckpointVersion;
  append(buf, &version, 4);
  append(buf, &header_length, 8);
}

// Writes the checksum of everything in buf so far.
void append_checksum(std::string* buf) {
  const uint64_t hash = XXH64(buf->data(), buf->size(), 0);
  append(buf, &hash, 8);
}

// Reads the prefix and the checksum back, checking the magic, the checksum, the version and the
// header's length in that order; returns the header's length.
uint64_t check_frame(const std::string& buf, const std::string& where) {
  if (buf.size() < kHeaderAt + kHashBytes || std::memcmp(buf.data(), kMagic, 8) != 0)
    throw CorruptStoreError(where + "not a Gale checkpoint (bad magic or too short)");
  uint64_t stored_hash;
  std::memcpy(&stored_hash, buf.data() + buf.size() - kHashBytes, 8);
  if (XXH64(buf.data(), buf.size() - kHashBytes, 0) != stored_hash)
    throw CorruptStoreError(where + "checksum mismatch: the checkpoint is torn or corrupt");
  uint32_t version;
  std::memcpy(&version, buf.data() + kVersionAt, 4);
  if (version != kCheckpointVersion)
    throw CorruptStoreError(where + "checkpoint version " + std::to_string(version) + ", this Gale reads version " +
                            std::to_string(kCheckpointVersion));
  uint64_t len;
  std::memcpy(&len, buf.data() + kLengthAt, 8);
  if (kHeaderAt + len + kHashBytes > buf.size()) throw CorruptStoreError(where + "header length exceeds the file");
  return len;
}

// A header table: each tensor's name and shape. Names and tensors run in parallel; the shorter
// bounds the table (the parameters' table was bounded by the names, the buffers' by the tensors).
nlohmann::json tensor_table(const std::vector<std::string>& names, const std::vector<Tensor>& tensors) {
  nlohmann::json table = nlohmann::json::array();
  const size_t n = std::min(names.size(), tensors.size());
  for (size_t i = 0; i < n; ++i)
    table.push_back({{"name", names[i]}, {"rows", tensors[i].rows()}, {"cols", tensors[i].cols()}});
  return table;
}

// Reads a header table: the names into *names, the shapes returned.
Shapes read_tensor_table(const nlohmann::json& table, std::vector<std::string>* names) {
  Shapes shapes;
  for (const auto& t : table) {
    names->push_back(t.at("name").get<std::string>());
    shapes.emplace_back(t.at("rows").get<int64_t>(), t.at("cols").get<int64_t>());
  }
  return shapes;
}

// The header: the run's bookkeeping, the config, and the tables (buffers' only when there are any).
nlohmann::json header_json(const CheckpointState& state) {
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
  header["tensors"] = tensor_table(state.names, state.params);
  if (!state.buffers.empty()) header["buffers"] = tensor_table(state.buffer_names, state.buffers);
  return header;
}

// Reads the header's fields before its tables into *s, with the defaults of the keys that older
// checkpoints lack.
void read_header_fields(const nlohmann::json& header, const std::string& where, CheckpointState* s) {
  s->epoch = header.at("epoch").get<int64_t>();
  s->batches_done = header.value("batches_done", int64_t{0});
  if (s->batches_done < 0) throw CorruptStoreError(where + "negative batches_done in the header");
  if (s->batches_done > 0) {
    // One worker's checkpoints before several could stop inside an epoch wrote a single sum.
    if (header.contains("partial_loss_sums"))
      s->partial_loss_sums = header.at("partial_loss_sums").get<std::vector<double>>();
    else
      s->partial_loss_sums = {header.at("partial_loss_sum").get<double>()};
    if (s->partial_loss_sums.empty()) throw CorruptStoreError(where + "batches_done without the workers' loss sums");
  }
  s->adam_steps = header.at("adam_steps").get<int64_t>();
  s->best_valid_acc = header.at("best_valid_acc").get<double>();
  s->test_acc_at_best_valid = header.at("test_acc_at_best_valid").get<double>();
  s->best_epoch = header.at("best_epoch").get<int64_t>();
  s->improved_epoch = header.value("improved_epoch", s->best_epoch);
  s->lr_reductions = header.value("lr_reductions", int64_t{0});
  s->lr_reduced_epoch = header.value("lr_reduced_epoch", int64_t{-1});
  if (s->lr_reductions < 0) throw CorruptStoreError(where + "negative lr_reductions in the header");
  s->config_json = header.at("config").get<std::string>();
}

// Reads the header (the `len` bytes after the prefix): its fields and names into *s, its tables'
// shapes returned; any JSON error (bad syntax, a key missing, a wrong type) is a malformed header.
Tables read_header(const std::string& buf, uint64_t len, const std::string& where, CheckpointState* s) {
  try {
    const nlohmann::json header = nlohmann::json::parse(buf.substr(kHeaderAt, len));
    read_header_fields(header, where, s);
    Tables tables;
    tables.tensors = read_tensor_table(header.at("tensors"), &s->names);
    if (header.contains("buffers")) tables.buffers = read_tensor_table(header.at("buffers"), &s->buffer_names);
    return tables;
  } catch (const nlohmann::json::exception& e) {
    throw CorruptStoreError(where + "malformed header: " + e.what());
  }
}

// Writes the tensor data: every group's tensors, in kDataGroups' order.
void append_tensor_data(std::string* buf, const CheckpointState& state) {
  for (const DataGroup& group : kDataGroups) {
    for (const Tensor& t : state.*group.tensors) append(buf, t.f32(), t.nbytes());
  }
}

// Reads one group's tensors, of the table's shapes, from *pos on (short of the checksum).
void read_tensor_group(const std::string& buf, const Shapes& shapes, const std::string& where, size_t* pos,
                       std::vector<Tensor>* group) {
  for (const auto& [rows, cols] : shapes) {
    if (rows < 0 || cols < 0) throw CorruptStoreError(where + "negative tensor shape in the header");
    Tensor t = Tensor::empty(rows, cols);
    if (*pos + t.nbytes() > buf.size() - kHashBytes) throw CorruptStoreError(where + "tensor data exceeds the file");
    std::memcpy(t.f32(), buf.data() + *pos, t.nbytes());
    *pos += t.nbytes();
    group->push_back(t);
  }
}

// Reads the tensor data after the header, every group in kDataGroups' order; it must end at the
// checksum.
void read_tensor_data(const std::string& buf, uint64_t len, const Tables& tables, const std::string& where,
                      CheckpointState* s) {
  size_t pos = kHeaderAt + len;
  for (const DataGroup& group : kDataGroups)
    read_tensor_group(buf, tables.*group.shapes, where, &pos, &(s->*group.tensors));
  if (pos != buf.size() - kHashBytes) throw CorruptStoreError(where + "trailing bytes after the tensors");
}

// ----- atomic writing -------------------------------------------------------------------------

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

// Creates `tmp` holding buf, fsynced; on a failure removes it and throws.
void write_synced(const std::filesystem::path& tmp, const std::string& buf) {
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
}

// Puts buf at `file` atomically: its directory made, a temporary beside it written, renamed over
// it, and the directory fsynced.
void write_atomically(const std::filesystem::path& file, const std::string& buf) {
  std::error_code ec;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
  if (ec) throw InputError(file.parent_path().string() + ": cannot create checkpoint directory: " + ec.message());
  // A hidden temporary beside the file, named for this host and pid, so that the next save
  // removes what a killed run (SIGKILL, a crash, a second Ctrl-C) left half-written.
  const std::string prefix = "." + file.filename().string() + ".tmp-";
  const std::filesystem::path dir = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  storage::remove_stale_temps(dir, prefix);
  const std::filesystem::path tmp = dir / storage::temp_name(prefix);
  write_synced(tmp, buf);
  if (::rename(tmp.c_str(), file.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw InputError(file.string() + ": cannot replace checkpoint: " + why);
  }
  fsync_dir(dir);
}

// The file's bytes; InputError when it cannot be opened.
std::string read_whole(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw InputError(file.string() + ": cannot open checkpoint");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

void save_checkpoint(const std::filesystem::path& file, const CheckpointState& state) {
  const std::string text = header_json(state).dump();
  std::string buf;
  append_prefix(&buf, text.size());
  buf += text;
  append_tensor_data(&buf, state);
  append_checksum(&buf);
  write_atomically(file, buf);
}

CheckpointState load_checkpoint(const std::filesystem::path& file) {
  const std::string buf = read_whole(file);
  const std::string where = file.string() + ": ";
  const uint64_t len = check_frame(buf, where);
  CheckpointState s;
  const Tables tables = read_header(buf, len, where, &s);
  read_tensor_data(buf, len, tables, where, &s);
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

#include "storage/store.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <fstream>
#include <numeric>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>

#include "kernels/error.hpp"
#include "storage/temp_paths.hpp"
#include "storage/text_reader.hpp"

namespace gale::storage {

namespace fs = std::filesystem;

namespace {

// The first i in [0, count) where ok(i) is false, and how many such i there are; first = -1 when
// none. In parallel: open() runs it over every entry of the graph.
struct Misfits {
  int64_t first = -1;
  int64_t count = 0;
};
template <typename Ok>
Misfits find_misfits(int64_t count, const Ok& ok, int64_t grain = int64_t{1} << 16) {
  return tbb::parallel_reduce(
      tbb::blocked_range<int64_t>(0, count, grain), Misfits{},
      [&](const tbb::blocked_range<int64_t>& r, Misfits m) {
        for (int64_t i = r.begin(); i < r.end(); ++i) {
          if (ok(i)) continue;
          if (m.first < 0 || i < m.first) m.first = i;
          ++m.count;
        }
        return m;
      },
      [](Misfits a, const Misfits& b) {
        if (a.first < 0 || (b.first >= 0 && b.first < a.first)) a.first = b.first;
        a.count += b.count;
        return a;
      });
}

// Throws CorruptStoreError naming `file` when any of `count` values lies outside [lo, hi).
template <typename T>
void expect_within(const fs::path& file, const T* v, int64_t count, int64_t lo, int64_t hi, const char* what) {
  const Misfits bad = find_misfits(count, [&](int64_t i) { return static_cast<int64_t>(v[i]) >= lo && v[i] < hi; });
  if (bad.count > 0)
    throw CorruptStoreError(file.string() + ": expected " + what + " in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "), found " + std::to_string(bad.count) + " outside (the first, entry " +
                            std::to_string(bad.first) + ", is " + std::to_string(v[bad.first]) +
                            "; run gale info --verify)");
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

// The hidden temporary names of a store being written beside `store`: ".NAME.tmp-HOST-PID-...".
std::string temp_prefix_of(const fs::path& store) { return "." + store.filename().string() + ".tmp-"; }

// A failed system call on `path`; a full disk or quota is ResourceError, as in npy.cpp.
[[noreturn]] void throw_io(const fs::path& path, const char* what, int err) {
  const std::string msg = path.string() + ": " + what + ": " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) throw ResourceError(msg);  // out of room: exit 4
  throw InputError(msg);
}

void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw_io(p, "cannot open for fsync", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw_io(p, "fsync failed", err);
}

// Writes a small file with the same discipline as NpyWriter: every error checked, fsynced.
void write_file_synced(const fs::path& p, const std::string& text) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_io(p, "cannot create", errno);
  const char* data = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t w = ::write(fd, data, left);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int err = errno;
      ::close(fd);
      throw_io(p, "write failed", err);
    }
    data += w;
    left -= static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw_io(p, "fsync failed", err);
  }
  if (::close(fd) != 0) throw_io(p, "close failed", errno);
}

// A manifest names files inside the store only: no absolute paths, no "..", nothing hidden.
bool is_store_relative(const std::string& rel) {
  if (rel.empty() || rel.front() == '/') return false;
  for (const auto& part : fs::path(rel)) {
    const std::string s = part.string();
    if (s.empty() || s == "." || s == ".." || s.front() == '.') return false;
  }
  return true;
}

bool is_hex64(const std::string& s) {
  return s.size() == 16 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// The first page of pages [first, last) of `bytes` (a whole file of `size` bytes) whose sum is
// not sums[page], or -1; in parallel.
int64_t first_bad_page(const char* bytes, uint64_t size, const uint32_t* sums, uint64_t first, uint64_t last) {
  // 64 pages (256 KiB) a task: enough work to hide the scheduling, small enough to spread a
  // few-MiB file over every core.
  const Misfits bad = find_misfits(
      static_cast<int64_t>(last - first),
      [&](int64_t i) {
        const uint64_t p = first + static_cast<uint64_t>(i);
        const uint64_t begin = p * kPageSumPage;
        return page_sum(bytes + begin, std::min<uint64_t>(kPageSumPage, size - begin)) == sums[p];
      },
      64);
  return bad.first < 0 ? -1 : static_cast<int64_t>(first) + bad.first;
}

[[noreturn]] void throw_bad_page(const fs::path& file, int64_t page) {
  throw CorruptStoreError(file.string() + ": page checksum mismatch at byte offset " +
                          std::to_string(static_cast<uint64_t>(page) * kPageSumPage) + " (page " + std::to_string(page) +
                          "): the store is corrupt; run gale info --verify");
}

// One sequential read of a whole file: its size, its xxHash64 and, when `sums` is given, the sum
// of each page. Throws CorruptStoreError when the file cannot be opened.
struct FileHashes {
  uint64_t size = 0;
  std::string xxh64;
};
FileHashes hash_file(const fs::path& file, std::vector<char>* buf, std::vector<uint32_t>* sums) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw CorruptStoreError(file.string() + ": missing (listed in the manifest)");
  GALE_ASSERT(buf->size() % kPageSumPage == 0);   // so every read but the last is whole pages
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  FileHashes h;
  if (sums) sums->clear();
  while (in) {
    in.read(buf->data(), static_cast<std::streamsize>(buf->size()));
    const auto got = static_cast<size_t>(in.gcount());
    if (got == 0) break;
    XXH64_update(st, buf->data(), got);
    for (size_t at = 0; sums && at < got; at += kPageSumPage)
      sums->push_back(page_sum(buf->data() + at, std::min(kPageSumPage, got - at)));
    h.size += got;
  }
  h.xxh64 = hex64(XXH64_digest(st));
  XXH64_freeState(st);
  return h;
}

}  // namespace

bool is_page_sums_path(const std::string& rel) { return rel.rfind("pages/", 0) == 0; }

std::string manifest_to_json(const Manifest& m) {
  nlohmann::json j;
  j["format_version"] = m.format_version;
  j["num_nodes"] = m.num_nodes;
  j["num_edges"] = m.num_edges;
  j["weighted"] = m.weighted;
  j["feature_dim"] = m.feature_dim;
  j["feature_dtype"] = m.feature_dtype;
  j["num_classes"] = m.num_classes;
  j["splits"] = m.splits;
  j["num_partitions"] = m.num_partitions;
  // Only partitioned stores carry the key, so stores without partition.npy keep their bytes.
  if (m.num_partitions > 0) j["partition_method"] = m.partition_method;
  j["relabelled"] = m.relabelled;
  if (m.relabelled && !m.relabel_order.empty()) j["relabel_order"] = m.relabel_order;
  // Only stores with page sums carry the key, so a store written before them keeps its bytes.
  if (m.page_size != 0) j["page_size"] = m.page_size;
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [path, e] : m.files)
    files[path] = {{"dtype", e.dtype}, {"shape", e.shape}, {"size", e.size}, {"xxh64", e.xxh64}};
  j["files"] = files;
  return j.dump(2) + "\n";
}

namespace {

// The first floating-point number in `j`, by its path, or "" when there is none. A manifest holds
// counts, shapes and sizes only, and nlohmann converts a JSON float to an integer with a plain
// cast, undefined beyond the integer's range (1e300: found by fuzzing), so floats are refused.
std::string first_float(const nlohmann::json& j, const std::string& path) {
  if (j.is_number_float()) return path.empty() ? "the top level" : path;
  if (j.is_object() || j.is_array()) {
    for (const auto& [key, value] : j.items()) {
      const std::string found = first_float(value, path.empty() ? key : path + "." + key);
      if (!found.empty()) return found;
    }
  }
  return "";
}

// A manifest's text as JSON, refused when it is not JSON or holds a float anywhere.
nlohmann::json parse_manifest_json(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw CorruptStoreError(source + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (const std::string at = first_float(j, ""); !at.empty())
    throw CorruptStoreError(source + ": expected whole numbers, found a fraction or exponent at '" + quote_token(at) + "'");
  return j;
}

// A parsed manifest's keys into a Manifest, each checked as it is read and then against the
// others; `source` names the manifest in messages.
class ManifestReader {
 public:
  ManifestReader(const nlohmann::json& j, const std::string& source) : j_(j), source_(source) {}

  Manifest read() const {
    Manifest m;
    get("format_version", &m.format_version);
    if (m.format_version < kOldestStoreFormatVersion || m.format_version > kStoreFormatVersion)
      throw CorruptStoreError(source_ + ": format version " + std::to_string(m.format_version) + ", this Gale reads versions " +
                              std::to_string(kOldestStoreFormatVersion) + " to " + std::to_string(kStoreFormatVersion));
    get("num_nodes", &m.num_nodes);
    get("num_edges", &m.num_edges);
    get("weighted", &m.weighted);
    get("feature_dim", &m.feature_dim);
    get("feature_dtype", &m.feature_dtype);
    get("num_classes", &m.num_classes);
    get("splits", &m.splits);
    get("num_partitions", &m.num_partitions);
    get("relabelled", &m.relabelled);
    if (j_.contains("partition_method")) get("partition_method", &m.partition_method);
    if (j_.contains("relabel_order")) get("relabel_order", &m.relabel_order);
    page_size(&m);
    check_counts(m);
    files(&m);
    return m;
  }

 private:
  // A required key into `out`, of its type.
  template <typename T>
  void get(const char* key, T* out) const {
    if (!j_.contains(key)) throw CorruptStoreError(source_ + ": missing key '" + key + "'");
    try {
      j_.at(key).get_to(*out);
    } catch (const nlohmann::json::exception&) {
      throw CorruptStoreError(source_ + ": key '" + key + "' has the wrong type");
    }
  }
  // The optional page_size: kPageSumPage or absent, and present exactly when the version has page sums.
  void page_size(Manifest* m) const {
    if (j_.contains("page_size")) {
      get("page_size", &m->page_size);
      if (!j_.at("page_size").is_number_integer() || m->page_size != kPageSumPage)
        throw CorruptStoreError(source_ + ": expected page_size " + std::to_string(kPageSumPage) + " (or no key), found " +
                                j_.at("page_size").dump());
    }
    // Version 2 is version 1 with page sums: an older Gale refuses it by its version, not by a sidecar.
    if ((m->format_version >= 2) != (m->page_size != 0))
      throw CorruptStoreError(source_ + ": format version " + std::to_string(m->format_version) +
                              (m->page_size != 0 ? " has no page sums, found page_size" : " has page sums, found no page_size"));
  }
  // The counts are non-negative (checked in the std::map's alphabetical order), and num_partitions fits an int32.
  void check_counts(const Manifest& m) const {
    for (const auto& [key, value] : std::map<std::string, int64_t>{{"num_nodes", m.num_nodes},
                                                                   {"num_edges", m.num_edges},
                                                                   {"feature_dim", m.feature_dim},
                                                                   {"num_classes", m.num_classes},
                                                                   {"num_partitions", m.num_partitions}}) {
      if (value < 0) throw CorruptStoreError(source_ + ": expected a non-negative " + key + ", found " + std::to_string(value));
    }
    if (m.num_partitions > INT32_MAX)
      throw CorruptStoreError(source_ + ": expected num_partitions below 2^31, found " + std::to_string(m.num_partitions));
  }
  // The files object's entries, each with its four fields, a path inside the store and a well-formed hash.
  void files(Manifest* m) const {
    if (!j_.contains("files") || !j_.at("files").is_object()) throw CorruptStoreError(source_ + ": missing key 'files'");
    for (const auto& [path, e] : j_.at("files").items()) {
      FileEntry f;
      try {
        e.at("dtype").get_to(f.dtype);
        e.at("shape").get_to(f.shape);
        e.at("size").get_to(f.size);
        e.at("xxh64").get_to(f.xxh64);
      } catch (const nlohmann::json::exception&) {
        throw CorruptStoreError(source_ + ": malformed entry for file '" + path + "'");
      }
      if (!is_store_relative(path))
        throw CorruptStoreError(source_ + ": expected file paths inside the store, found '" + path + "'");
      if (!is_hex64(f.xxh64))
        throw CorruptStoreError(source_ + ": file '" + path + "': expected an xxh64 of 16 lowercase hex digits, found '" +
                                f.xxh64 + "'");
      m->files[path] = f;
    }
  }

  const nlohmann::json& j_;
  const std::string& source_;
};

}  // namespace

Manifest manifest_from_json(const std::string& text, const std::string& source) {
  const nlohmann::json j = parse_manifest_json(text, source);
  return ManifestReader(j, source).read();
}

// ---------------------------------------------------------------------------------------------
// StoreWriter

StoreWriter::StoreWriter(fs::path path, bool overwrite) : path_(std::move(path)), overwrite_(overwrite) {
  if (path_.filename().empty()) path_ = path_.parent_path();
  if (path_.empty()) throw InputError("-o/--output: expected a store path");
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path_, ec);
  if (fs::exists(st) && !overwrite_)
    throw InputError(path_.string() + ": already exists (pass --force to replace it)");
  if (fs::exists(st) && !fs::is_directory(st))
    throw InputError(path_.string() + ": exists and is not a store directory");
  // --force replaces a store (or an empty directory), never a directory of other files.
  if (fs::exists(st) && !fs::exists(path_ / "manifest.json", ec) && !fs::is_empty(path_, ec))
    throw InputError(path_.string() + ": exists and is not a store (no manifest.json); --force replaces only a store, "
                     "so remove it or choose another path");
  fs::path parent = path_.parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec))
    throw InputError(path_.string() + ": parent directory " + parent.string() + " does not exist");
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    throw InputError(path_.string() + ": parent directory " + parent.string() + " is not writable: " + std::strerror(errno));
  const std::string prefix = temp_prefix_of(path_);
  remove_stale_temps(parent, prefix, path_);  // what a killed run of this store left
  temp_ = parent / temp_name(prefix);
  const auto lock = lock_temps();
  if (!fs::create_directory(temp_, ec) || ec)
    throw InputError(temp_.string() + ": cannot create: " + (ec ? ec.message() : "already exists"));
  register_temp(temp_);  // a stop signal removes it (apps/stop_cleanup.hpp)
  manifest_.page_size = kPageSumPage;
  manifest_.format_version = kStoreFormatVersion;
}

StoreWriter::~StoreWriter() {
  open_.clear();
  open_sums_.clear();
  const auto lock = lock_temps();
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(temp_, ec);
  }
  unregister_temp(temp_);
}

NpyWriter& StoreWriter::begin_array(const std::string& rel_path, DType dtype, std::vector<int64_t> shape) {
  GALE_ASSERT(!committed_ && open_.count(rel_path) == 0 && !is_page_sums_path(rel_path));
  const fs::path file = temp_ / rel_path;
  std::error_code ec;
  {
    const auto lock = lock_temps();  // never recreate temp_ after a stop signal removed it
    if (!fs::is_directory(temp_, ec)) throw InputError(temp_.string() + ": removed while the store was written");
    fs::create_directories(file.parent_path(), ec);
  }
  if (ec) throw InputError(file.parent_path().string() + ": cannot create: " + ec.message());
  auto writer = std::make_unique<NpyWriter>(file.string(), dtype, shape);
  if (manifest_.page_size != 0) {
    // The sidecar is written like any array (4096-aligned, hashed, listed) but gets no sums itself.
    uint64_t count = 1;
    for (int64_t d : shape) count *= static_cast<uint64_t>(d);
    const uint64_t size = kNpyDataAlignment + count * dtype_size(dtype);   // what NpyWriter will write
    const fs::path sums_file = temp_ / page_sums_path(rel_path);
    {
      const auto lock = lock_temps();
      if (!fs::is_directory(temp_, ec)) throw InputError(temp_.string() + ": removed while the store was written");
      fs::create_directories(sums_file.parent_path(), ec);
    }
    if (ec) throw InputError(sums_file.parent_path().string() + ": cannot create: " + ec.message());
    auto sums = std::make_unique<NpyWriter>(sums_file.string(), kPageSumsDescr, sizeof(uint32_t),
                                            std::vector<int64_t>{static_cast<int64_t>(page_count(size))});
    writer->send_page_sums_to(sums.get());
    open_sums_[rel_path] = std::move(sums);
  }
  NpyWriter& ref = *writer;
  open_[rel_path] = std::move(writer);
  open_meta_[rel_path] = {dtype, std::move(shape)};
  return ref;
}

void StoreWriter::end_array(const std::string& rel_path) {
  auto it = open_.find(rel_path);
  GALE_ASSERT(it != open_.end());
  it->second->finish();
  FileEntry e;
  e.dtype = dtype_name(open_meta_[rel_path].first);
  e.shape = open_meta_[rel_path].second;
  e.size = it->second->file_size();
  e.xxh64 = hex64(it->second->xxh64());
  manifest_.files[rel_path] = e;
  open_.erase(it);
  open_meta_.erase(rel_path);
  auto sums = open_sums_.find(rel_path);
  if (sums == open_sums_.end()) return;   // a store without page sums
  NpyWriter& w = *sums->second;
  w.finish();   // the array's finish() sent the last sums
  manifest_.files[page_sums_path(rel_path)] =
      FileEntry{kPageSumsDtype, {static_cast<int64_t>(page_count(e.size))}, w.file_size(), hex64(w.xxh64())};
  open_sums_.erase(sums);
}

void StoreWriter::write_array(const std::string& rel_path, DType dtype, std::vector<int64_t> shape,
                              const void* data) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  NpyWriter& w = begin_array(rel_path, dtype, std::move(shape));
  w.write(data, static_cast<size_t>(count) * dtype_size(dtype));
  end_array(rel_path);
}

void StoreWriter::commit() {
  GALE_ASSERT(!committed_);
  if (!open_.empty()) throw InternalError("StoreWriter::commit: array " + open_.begin()->first + " was not ended");
  const fs::path manifest_file = temp_ / "manifest.json";
  write_file_synced(manifest_file, manifest_to_json(manifest_));
  // Every directory of the store, deepest first, then the parent once the rename is done.
  std::vector<fs::path> dirs;
  for (const auto& e : fs::recursive_directory_iterator(temp_)) {
    if (e.is_directory()) dirs.push_back(e.path());
  }
  std::sort(dirs.rbegin(), dirs.rend());
  for (const auto& d : dirs) fsync_path(d, true);
  fsync_path(temp_, true);

  fs::path parent = path_.parent_path();
  if (parent.empty()) parent = ".";
  std::error_code ec;
  // A stop signal's cleanup (remove_registered_temps) waits for the renames, or comes first and
  // leaves nothing to rename.
  const auto lock = lock_temps();
  if (!fs::is_directory(temp_, ec)) throw InputError(temp_.string() + ": removed while the store was written");
  if (fs::exists(fs::symlink_status(path_, ec))) {
    if (!overwrite_) throw InputError(path_.string() + ": already exists (pass --force to replace it)");
    if (!fs::is_directory(fs::symlink_status(path_, ec)))
      throw InputError(path_.string() + ": exists and is not a store directory");
    // Swap old and new in one atomic step where the filesystem can: at every instant NAME.gale
    // is either the complete old store or the complete new one. temp_ then holds the old store.
    if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_EXCHANGE) == 0) {
      committed_ = true;
      fs::remove_all(temp_, ec);
      fsync_path(parent, true);
      remove_stale_temps(parent, temp_prefix_of(path_), path_);
      return;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) throw_io(path_, "cannot replace", errno);
    // No exchange here: move the old store aside first, so a crash leaves the old store, or the
    // new one, or both under temporary names (never opened as NAME.gale), and nothing half-written.
    const fs::path aside = temp_.string() + ".old";
    fs::rename(path_, aside, ec);
    if (ec) throw InputError(path_.string() + ": cannot replace: " + ec.message());
    fs::rename(temp_, path_, ec);
    if (ec) {
      std::error_code ignore;
      fs::rename(aside, path_, ignore);
      throw InputError(path_.string() + ": cannot replace: " + ec.message());
    }
    fs::remove_all(aside, ec);
  } else if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_NOREPLACE) != 0) {
    // A plain rename would silently replace an empty directory created since the check above.
    if (errno == EEXIST) throw InputError(path_.string() + ": already exists (pass --force to replace it)");
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) throw_io(path_, "cannot create", errno);
    fs::rename(temp_, path_, ec);
    if (ec) throw InputError(path_.string() + ": cannot create: " + ec.message());
  }
  committed_ = true;
  fsync_path(parent, true);
  // A killed run's finished store (or the old one it moved aside) was kept while NAME held no
  // store; now that it does, they are leftovers.
  remove_stale_temps(parent, temp_prefix_of(path_), path_);
}

// ---------------------------------------------------------------------------------------------
// MappedArray

MappedArray::MappedArray(const fs::path& file, const NpyHeader& header) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CorruptStoreError(file.string() + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw CorruptStoreError(file.string() + ": cannot stat: " + std::strerror(err));
  }
  map_size_ = static_cast<size_t>(st.st_size);
  count_ = header.count();
  if (map_size_ > 0) {
    map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_SHARED, fd, 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      ::close(fd);
      throw ResourceError(file.string() + ": cannot map: " + std::strerror(errno));
    }
    data_ = static_cast<const char*>(map_) + header.data_offset;
  }
  ::close(fd);
}

MappedArray::~MappedArray() {
  if (map_) ::munmap(map_, map_size_);
}

MappedArray::MappedArray(MappedArray&& o) noexcept { *this = std::move(o); }

MappedArray& MappedArray::operator=(MappedArray&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, map_size_);
    map_ = o.map_;
    map_size_ = o.map_size_;
    data_ = o.data_;
    count_ = o.count_;
    o.map_ = nullptr;
    o.data_ = nullptr;
    o.map_size_ = 0;
    o.count_ = 0;
  }
  return *this;
}

// ---------------------------------------------------------------------------------------------
// Store

namespace {

// A listed array file, mapped: present, of the recorded size, with an npy header that matches the
// manifest's dtype and shape and leaves its data aligned to its elements.
MappedArray map_listed_array(const fs::path& store, const std::string& rel, const FileEntry& e) {
  const fs::path file = store / rel;
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  if (ec) throw CorruptStoreError(file.string() + ": missing (listed in the manifest)");
  if (size != e.size)
    throw CorruptStoreError(file.string() + ": expected " + std::to_string(e.size) + " bytes, found " +
                            std::to_string(size) + " (truncated or replaced)");
  const bool sidecar = is_page_sums_path(rel);
  NpyHeader h;
  try {
    h = read_npy_header(file.string(), sidecar);
  } catch (const InputError& err) {
    throw CorruptStoreError(err.what());
  }
  DType want;
  const bool dtype_ok = sidecar ? e.dtype == kPageSumsDtype && h.descr == kPageSumsDescr
                                : parse_dtype(e.dtype, &want) && want == h.dtype && h.descr != kPageSumsDescr;
  if (!dtype_ok || h.shape != e.shape || h.fortran_order)
    throw CorruptStoreError(file.string() + ": expected " + e.dtype + " " + shape_text(e.shape) +
                            " as the manifest says, found " + h.descr + " " + shape_text(h.shape) +
                            (h.fortran_order ? " in Fortran order" : "") + " in the npy header");
  if (h.data_offset % dtype_size(h.dtype) != 0)  // Gale pads every header to 64 bytes
    throw CorruptStoreError(file.string() + ": data starts at byte " + std::to_string(h.data_offset) +
                            ", not a multiple of its " + std::to_string(dtype_size(h.dtype)) + "-byte elements");
  const uint64_t data_bytes = static_cast<uint64_t>(h.count()) * dtype_size(h.dtype);
  if (h.data_offset + data_bytes != size)
    throw CorruptStoreError(file.string() + ": expected " + std::to_string(h.data_offset + data_bytes) +
                            " bytes for its npy header's shape, found " + std::to_string(size));
  return MappedArray(file, h);
}

// The manifest's file list against its counts and flags, before any file is opened: each array's
// shape and dtype (the typed accessors, labels() as int32, relabel() as int64, ... rely on them),
// the files a flag promises, the splits, and a page-sums sidecar of the right length beside every
// array when page_size is set.
class ManifestCheck {
 public:
  ManifestCheck(const fs::path& store, const Manifest& m) : store_(store), file_((store / "manifest.json").string()), m_(m) {}

  void run() const {
    const int64_t n = m_.num_nodes, e = m_.num_edges;
    require("graph/indptr.npy");
    require("graph/indices.npy");
    expect_shape("graph/indptr.npy", {n + 1});
    expect_shape("graph/indices.npy", {e});
    expect_dtype("graph/indptr.npy", "i64");
    const std::string idx_dtype = m_.files.at("graph/indices.npy").dtype;
    if (idx_dtype != "i32" && idx_dtype != "i64")
      throw CorruptStoreError((store_ / "graph/indices.npy").string() + ": expected dtype i32 or i64, found " + idx_dtype);
    expect_presence("graph/weights.npy", m_.weighted, "weighted");
    expect_presence("features.npy", m_.feature_dim > 0, "feature_dim");
    expect_presence("partition.npy", m_.num_partitions > 0, "num_partitions");
    expect_presence("relabel.npy", m_.relabelled, "relabelled");
    if (m_.feature_dim > 0) {
      DType ft;
      if (!parse_dtype(m_.feature_dtype, &ft) || !(ft == DType::kF32 || ft == DType::kF16 || ft == DType::kBF16))
        throw CorruptStoreError(file_ + ": expected feature_dtype f32, f16 or bf16, found '" + m_.feature_dtype + "'");
    }
    splits();
    for (const auto& [rel, entry] : m_.files) array(rel, entry);
    for (const auto& [rel, entry] : m_.files) page_sums(rel, entry);
  }

 private:
  void require(const std::string& rel) const {
    if (!m_.files.count(rel)) throw CorruptStoreError(file_ + ": no entry for required file " + rel);
  }
  void expect_shape(const std::string& rel, const std::vector<int64_t>& shape) const {
    if (m_.files.at(rel).shape != shape)
      throw CorruptStoreError((store_ / rel).string() + ": expected shape " + shape_text(shape) + ", found " +
                              shape_text(m_.files.at(rel).shape));
  }
  void expect_dtype(const std::string& rel, const std::string& dtype) const {
    if (m_.files.at(rel).dtype != dtype)
      throw CorruptStoreError((store_ / rel).string() + ": expected dtype " + dtype + ", found " + m_.files.at(rel).dtype);
  }
  // A manifest flag and the file it describes must agree.
  void expect_presence(const std::string& rel, bool flag, const char* key) const {
    if (flag != (m_.files.count(rel) > 0))
      throw CorruptStoreError(file_ + ": expected " + rel + (flag ? " to be listed" : " to be absent") + " because " + key +
                              " is " + (flag ? "set" : "unset") + ", found it " + (flag ? "missing" : "listed"));
  }
  void splits() const {
    for (const auto& [name, size] : m_.splits) {
      const std::string rel = "splits/" + name + ".npy";
      if (!m_.files.count(rel))
        throw CorruptStoreError(file_ + ": expected " + rel + " for split '" + name + "', found no entry");
      if (m_.files.at(rel).shape != std::vector<int64_t>{size})
        throw CorruptStoreError((store_ / rel).string() + ": expected " + std::to_string(size) +
                                " node ids as the manifest's splits say, found shape " + shape_text(m_.files.at(rel).shape));
    }
  }
  void array(const std::string& rel, const FileEntry& entry) const {
    const int64_t n = m_.num_nodes;
    if (rel == "graph/weights.npy") { expect_shape(rel, {m_.num_edges}); expect_dtype(rel, "f32"); }
    else if (rel == "features.npy") { expect_shape(rel, {n, m_.feature_dim}); expect_dtype(rel, m_.feature_dtype); }
    else if (rel == "labels.npy") { expect_shape(rel, {n}); expect_dtype(rel, "i32"); }
    else if (rel == "partition.npy") { expect_shape(rel, {n}); expect_dtype(rel, "i32"); }
    else if (rel == "relabel.npy") { expect_shape(rel, {n}); expect_dtype(rel, "i64"); }
    else if (rel.rfind("splits/", 0) == 0) {
      // Ids in [0, N): check_values().
      if (entry.dtype != "i64" || entry.shape.size() != 1)
        throw CorruptStoreError((store_ / rel).string() + ": expected a 1-D i64 array of node ids, found " + entry.dtype +
                                " " + shape_text(entry.shape));
      if (!m_.splits.count(fs::path(rel).stem().string()))
        throw CorruptStoreError((store_ / rel).string() + ": expected a matching entry in the manifest's splits, found none");
    }
  }
  // Every array file has its sidecar, of one u32 per page; every sidecar its file.
  void page_sums(const std::string& rel, const FileEntry& entry) const {
    if (is_page_sums_path(rel)) {
      const std::string of = rel.substr(std::string("pages/").size());
      if (!m_.files.count(of) || is_page_sums_path(of))
        throw CorruptStoreError(file_ + ": expected " + rel + " to be the page sums of a listed file, found no " + of);
      return;
    }
    if (m_.page_size == 0) return;
    const std::string sums = page_sums_path(rel);
    if (!m_.files.count(sums))
      throw CorruptStoreError(file_ + ": expected " + sums + " (the page sums of " + rel +
                              ") to be listed because page_size is set, found no entry");
    const FileEntry& se = m_.files.at(sums);
    const std::vector<int64_t> want{static_cast<int64_t>(page_count(entry.size))};
    if (se.dtype != kPageSumsDtype || se.shape != want)
      throw CorruptStoreError((store_ / sums).string() + ": expected " + kPageSumsDtype + " " + shape_text(want) +
                              " (one sum per 4096-byte page of " + rel + "), found " + se.dtype + " " + shape_text(se.shape));
  }

  const fs::path& store_;
  const std::string file_;  // manifest.json's path, for messages
  const Manifest& m_;
};

}  // namespace

Store Store::open(const fs::path& path) {
  if (!fs::is_directory(path))
    throw InputError(path.string() + (fs::exists(path) ? ": not a store (a store is a directory made by gale preprocess)"
                                                         : ": no such store directory"));
  Store s;
  s.path_ = path;
  const fs::path manifest_file = path / "manifest.json";
  std::ifstream in(manifest_file, std::ios::binary);
  if (!in) throw CorruptStoreError(manifest_file.string() + ": missing; not a Gale store or an incomplete one");
  std::stringstream text;
  text << in.rdbuf();
  s.manifest_ = manifest_from_json(text.str(), manifest_file.string());
  const Manifest& m = s.manifest_;
  ManifestCheck(path, m).run();
  s.indices64_ = m.files.at("graph/indices.npy").dtype == "i64";
  s.map_files();
  // Every page of what the commands read whole, before any value is used: a flipped byte is
  // reported as such even when the value it makes is still in range. features.npy is read by
  // rows and left to check_feature_pages.
  if (s.has_page_sums()) {
    std::vector<std::pair<std::string, const MappedArray*>> whole{
        {"graph/indptr.npy", &s.indptr_}, {"graph/indices.npy", &s.indices_}, {"graph/weights.npy", &s.weights_},
        {"labels.npy", &s.labels_},       {"partition.npy", &s.partition_},  {"relabel.npy", &s.relabel_}};
    for (const auto& [name, a] : s.splits_) whole.emplace_back("splits/" + name + ".npy", &a);
    for (const auto& [rel, a] : whole) {
      if (m.files.count(rel)) s.check_pages(rel, *a, 0, page_count(m.files.at(rel).size));
    }
  }
  const int64_t n = m.num_nodes, e = m.num_edges;
  const int64_t* ip = s.indptr();
  if (ip[0] != 0 || ip[n] != e)
    throw CorruptStoreError((path / "graph/indptr.npy").string() + ": expected indptr[0] = 0 and indptr[N] = " +
                            std::to_string(e) + ", found " + std::to_string(ip[0]) + " and " + std::to_string(ip[n]));
  s.check_values();
  return s;
}

// Maps every listed file into its member (the page sums by the file they cover).
void Store::map_files() {
  for (const auto& [rel, entry] : manifest_.files) {
    MappedArray a = map_listed_array(path_, rel, entry);
    if (is_page_sums_path(rel)) {
      if (manifest_.page_size != 0) page_sums_[rel.substr(std::string("pages/").size())] = std::move(a);
      continue;
    }
    if (rel == "graph/indptr.npy") indptr_ = std::move(a);
    else if (rel == "graph/indices.npy") indices_ = std::move(a);
    else if (rel == "graph/weights.npy") weights_ = std::move(a);
    else if (rel == "features.npy") features_ = std::move(a);
    else if (rel == "labels.npy") labels_ = std::move(a);
    else if (rel == "partition.npy") partition_ = std::move(a);
    else if (rel == "relabel.npy") relabel_ = std::move(a);
    else if (rel.rfind("splits/", 0) == 0) splits_[fs::path(rel).stem().string()] = std::move(a);
  }
}

// Every value that indexes something, so that no command reads or writes out of bounds on a
// damaged store: one parallel pass over the topology (it reads the ids once, at memory or disk
// speed), the labels, the splits, the parts and the original ids. Features and weights index
// nothing and are left to verify().
void Store::check_values() const {
  const Manifest& m = manifest_;
  const int64_t n = m.num_nodes, e = m.num_edges;
  const int64_t* ip = indptr();
  const Misfits down = find_misfits(n, [&](int64_t v) { return ip[v] <= ip[v + 1]; });
  if (down.count > 0)
    throw CorruptStoreError((path_ / "graph/indptr.npy").string() + ": expected non-decreasing offsets, found " +
                            std::to_string(down.count) + " decreasing (the first: indptr[" + std::to_string(down.first) +
                            "] = " + std::to_string(ip[down.first]) + " > indptr[" + std::to_string(down.first + 1) +
                            "] = " + std::to_string(ip[down.first + 1]) + "; run gale info --verify)");
  const fs::path indices_file = path_ / "graph/indices.npy";
  if (indices64_) expect_within(indices_file, indices_.as<int64_t>(), e, 0, n, "node ids");
  else expect_within(indices_file, indices_.as<int32_t>(), e, 0, n, "node ids");
  if (has_labels()) expect_within(path_ / "labels.npy", labels(), n, -1, m.num_classes, "classes (-1 = unlabelled)");
  for (const auto& [name, ids] : splits_)
    expect_within(path_ / ("splits/" + name + ".npy"), ids.as<int64_t>(), ids.count(), 0, n, "node ids");
  if (has_partition()) expect_within(path_ / "partition.npy", partition(), n, 0, m.num_partitions, "parts");
  // gale predict writes row s of its outputs at relabel[s].
  if (relabel() != nullptr) expect_within(path_ / "relabel.npy", relabel(), n, 0, n, "original node ids");
}

uint64_t Store::verify() const {
  std::vector<char> buf(8u << 20);   // whole pages: every read but a file's last fills it
  std::vector<uint32_t> sums;
  // A page that disagrees with its sum is reported only once every hash has passed: if the
  // sidecar is the damaged file, its own hash names it.
  fs::path bad_file;
  int64_t bad_page = -1;
  uint64_t pages = 0;
  for (const auto& [rel, e] : manifest_.files) {
    const fs::path file = path_ / rel;
    const uint32_t* want = is_page_sums_path(rel) ? nullptr : page_sums(rel);
    const FileHashes got = hash_file(file, &buf, want ? &sums : nullptr);
    const uint64_t size = got.size;
    const std::string& digest = got.xxh64;
    if (size != e.size)
      throw CorruptStoreError(file.string() + ": expected " + std::to_string(e.size) + " bytes, found " + std::to_string(size));
    if (digest != e.xxh64)
      throw CorruptStoreError(file.string() + ": xxHash64 mismatch (manifest " + e.xxh64 + ", file " + digest +
                              "): the store is corrupt");
    if (want == nullptr) continue;
    pages += sums.size();   // open() checked the sidecar holds page_count(size) sums
    for (size_t p = 0; p < sums.size() && bad_page < 0; ++p) {
      if (sums[p] != want[p]) {
        bad_file = file;
        bad_page = static_cast<int64_t>(p);
      }
    }
  }
  if (bad_page >= 0) throw_bad_page(bad_file, bad_page);
  return pages;
}

const uint32_t* Store::page_sums(const std::string& rel) const {
  auto it = page_sums_.find(rel);
  return it == page_sums_.end() ? nullptr : it->second.as<uint32_t>();
}

void Store::check_pages(const std::string& rel, const MappedArray& file, uint64_t first, uint64_t last) const {
  const uint32_t* sums = page_sums(rel);
  GALE_ASSERT(sums != nullptr && last <= page_count(file.file_size()));
  const int64_t bad = first_bad_page(file.file_bytes(), file.file_size(), sums, first, last);
  if (bad >= 0) throw_bad_page(path_ / rel, bad);
}

void Store::check_feature_pages(int64_t begin_row, int64_t end_row) const {
  GALE_ASSERT(0 <= begin_row && begin_row <= end_row && end_row <= num_nodes());
  if (!has_page_sums() || !has_features() || begin_row == end_row) return;
  const uint64_t row = static_cast<uint64_t>(feature_dim()) * dtype_size(feature_dtype());
  const uint64_t offset = static_cast<uint64_t>(features_.as<char>() - features_.file_bytes());  // the header
  const uint64_t begin = offset + static_cast<uint64_t>(begin_row) * row;
  const uint64_t end = offset + static_cast<uint64_t>(end_row) * row;
  check_pages("features.npy", features_, begin / kPageSumPage, (end + kPageSumPage - 1) / kPageSumPage);
}

size_t add_page_sums(const fs::path& path) {
  const Store store = Store::open(path);   // checks everything a store without sums can
  if (store.has_page_sums()) return 0;
  Manifest m = store.manifest();
  std::vector<char> buf(8u << 20);   // whole pages, as in verify()
  std::vector<uint32_t> sums;
  size_t files = 0;
  for (const auto& [rel, e] : store.manifest().files) {
    if (is_page_sums_path(rel)) continue;
    const fs::path file = path / rel;
    const FileHashes got = hash_file(file, &buf, &sums);
    // Summing a damaged file would vouch for the damage.
    if (got.size != e.size || got.xxh64 != e.xxh64)
      throw CorruptStoreError(file.string() + ": xxHash64 mismatch (manifest " + e.xxh64 + ", file " + got.xxh64 +
                              "): the store is corrupt; page sums not added");
    // Into place: the old manifest does not list them, so until it is replaced they are ignored.
    const std::string sums_rel = page_sums_path(rel);
    const fs::path sums_file = path / sums_rel;
    std::error_code ec;
    fs::create_directories(sums_file.parent_path(), ec);
    if (ec) throw InputError(sums_file.parent_path().string() + ": cannot create: " + ec.message());
    const int64_t count = static_cast<int64_t>(sums.size());
    NpyWriter w(sums_file.string(), kPageSumsDescr, sizeof(uint32_t), {count});
    w.write(sums.data(), sums.size() * sizeof(uint32_t));
    w.finish();   // fsynced
    m.files[sums_rel] = FileEntry{kPageSumsDtype, {count}, w.file_size(), hex64(w.xxh64())};
    ++files;
  }
  // The directories holding the sidecars, deepest first, before the manifest names them.
  std::vector<fs::path> dirs;
  for (const auto& d : fs::recursive_directory_iterator(path / "pages"))
    if (d.is_directory()) dirs.push_back(d.path());
  std::sort(dirs.rbegin(), dirs.rend());
  for (const auto& d : dirs) fsync_path(d, true);
  fsync_path(path / "pages", true);
  fsync_path(path, true);
  m.page_size = kPageSumPage;
  m.format_version = kStoreFormatVersion;
  const fs::path manifest_file = path / "manifest.json", temp = path / "manifest.json.tmp";
  write_file_synced(temp, manifest_to_json(m));
  if (::rename(temp.c_str(), manifest_file.c_str()) != 0) throw_io(manifest_file, "cannot replace", errno);
  fsync_path(path, true);
  return files;
}

const int32_t* Store::indices32() const {
  if (indices64_)
    throw InputError(path_.string() + ": the graph has 2^31 nodes or more (int64 indices); this operation needs int32 ids");
  return indices_.as<int32_t>();
}

kernels::CsrView Store::csr() const {
  return {num_nodes(), num_nodes(), indptr(), indices32(), weights()};
}

DType Store::feature_dtype() const {
  DType t = DType::kF32;
  parse_dtype(manifest_.feature_dtype, &t);
  return t;
}

void Store::read_features(int64_t begin, int64_t end, float* out) const {
  GALE_ASSERT(0 <= begin && begin <= end && end <= num_nodes() && has_features());
  const DType t = feature_dtype();
  const size_t row = static_cast<size_t>(feature_dim()) * dtype_size(t);
  convert_to_f32(t, static_cast<const char*>(features_.data()) + static_cast<size_t>(begin) * row, out,
                 static_cast<size_t>((end - begin) * feature_dim()));
}

void Store::read_feature_rows(const int64_t* ids, int64_t n, float* out) const {
  const int64_t d = feature_dim();
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 1024), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) read_features(ids[i], ids[i] + 1, out + i * d);
  });
}

std::vector<int64_t> Store::split(const std::string& name) const {
  auto it = splits_.find(name);
  if (it == splits_.end()) return {};
  const int64_t* p = it->second.as<int64_t>();
  return std::vector<int64_t>(p, p + it->second.count());
}

std::vector<int64_t> hottest_nodes(const Store& store, int64_t count, const std::vector<uint8_t>* preferred,
                                   const std::vector<uint32_t>* reads) {
  const int64_t n = store.num_nodes();
  count = std::clamp<int64_t>(count, 0, n);
  if (preferred && static_cast<int64_t>(preferred->size()) != n)
    throw InternalError("hottest_nodes: the preferred flags do not cover every node");
  if (reads && static_cast<int64_t>(reads->size()) != n)
    throw InternalError("hottest_nodes: the read counts do not cover every node");
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const int64_t* indptr = store.indptr();
  std::partial_sort(order.begin(), order.begin() + count, order.end(), [&](int64_t a, int64_t b) {
    if (preferred && (*preferred)[a] != (*preferred)[b]) return (*preferred)[a] > (*preferred)[b];
    if (reads && (*reads)[a] != (*reads)[b]) return (*reads)[a] > (*reads)[b];
    const int64_t da = indptr[a + 1] - indptr[a], db = indptr[b + 1] - indptr[b];
    return da != db ? da > db : a < b;
  });
  order.resize(static_cast<size_t>(count));
  return order;
}

int64_t cache_rows_within(const Store& store, uint64_t bytes) {
  const uint64_t row_bytes = static_cast<uint64_t>(store.feature_dim()) * sizeof(float);
  const uint64_t slots = static_cast<uint64_t>(store.num_nodes()) * sizeof(int32_t);
  if (row_bytes == 0 || bytes <= slots) return 0;
  return static_cast<int64_t>(std::min<uint64_t>((bytes - slots) / row_bytes, static_cast<uint64_t>(store.num_nodes())));
}

namespace {

// min / mean / median / p99 / max of a degree list, and how many nodes have none.
void describe_degrees(std::vector<int64_t> deg, const char* name, const Manifest& m, std::ostream& o) {
  if (deg.empty()) return;
  int64_t empty = 0;
  for (int64_t d : deg) empty += d == 0;
  std::sort(deg.begin(), deg.end());
  const double mean = m.num_nodes > 0 ? static_cast<double>(m.num_edges) / static_cast<double>(m.num_nodes) : 0;
  const auto at = [&](double q) { return deg[std::min<size_t>(deg.size() - 1, static_cast<size_t>(q * deg.size()))]; };
  char line[256];
  std::snprintf(line, sizeof(line), "%-10s min %lld  mean %.2f  median %lld  p99 %lld  max %lld  (%lld nodes with none)\n",
                name, static_cast<long long>(deg.front()), mean, static_cast<long long>(at(0.5)),
                static_cast<long long>(at(0.99)), static_cast<long long>(deg.back()), static_cast<long long>(empty));
  o << line;
}

// In-degrees from indptr, out-degrees by counting sources (int32 indices only).
void describe_topology(const Store& store, std::ostream& o) {
  const Manifest& m = store.manifest();
  const int64_t n = m.num_nodes;
  if (n <= 0) return;
  const int64_t* ip = store.indptr();
  std::vector<int64_t> in(static_cast<size_t>(n)), out(static_cast<size_t>(n), 0);
  for (int64_t v = 0; v < n; ++v) in[v] = ip[v + 1] - ip[v];
  describe_degrees(std::move(in), "in-degree", m, o);
  if (m.files.at("graph/indices.npy").dtype == "i32") {
    const int32_t* idx = store.indices32();  // in range: open() checked them
    for (int64_t k = 0; k < m.num_edges; ++k) out[idx[k]]++;
    describe_degrees(std::move(out), "out-degree", m, o);
  } else {
    o << "out-degree not computed (int64 indices)\n";
  }
}

// Edge weights, so a user can see they were read as meant (the models aggregate with them).
void describe_weights(const Store& store, std::ostream& o) {
  const int64_t e = store.manifest().num_edges;
  const float* w = store.weights();
  if (w == nullptr || e == 0) return;
  double sum = 0;
  float lo = w[0], hi = w[0];
  int64_t non_positive = 0;
  for (int64_t k = 0; k < e; ++k) {
    sum += w[k];
    lo = std::min(lo, w[k]);
    hi = std::max(hi, w[k]);
    non_positive += w[k] <= 0.0f;
  }
  char line[256];
  std::snprintf(line, sizeof(line), "weights    min %.6g  mean %.6g  max %.6g  (%lld not positive)\n", lo,
                sum / static_cast<double>(e), hi, static_cast<long long>(non_positive));
  o << line;
}

// Classes, labelled nodes and the smallest and largest class.
void describe_labels(const Store& store, std::ostream& o) {
  const Manifest& m = store.manifest();
  if (!store.has_labels()) {
    o << "labels     none\n";
    return;
  }
  int64_t labelled = 0;
  std::vector<int64_t> per_class(static_cast<size_t>(m.num_classes), 0);
  for (int64_t v = 0; v < m.num_nodes; ++v) {
    const int32_t y = store.labels()[v];  // in [-1, num_classes): open() checked them
    if (y < 0) continue;
    ++labelled;
    ++per_class[static_cast<size_t>(y)];
  }
  o << "labels     " << m.num_classes << " classes, " << labelled << " labelled nodes\n";
  if (!per_class.empty()) {
    const auto [lo, hi] = std::minmax_element(per_class.begin(), per_class.end());
    o << "classes    smallest " << *lo << " nodes (class " << (lo - per_class.begin()) << "), largest " << *hi
      << " nodes (class " << (hi - per_class.begin()) << ")";
    o << "\n";
  }
}

// The parts' sizes and, with int32 indices, the edge cut.
void describe_partition(const Store& store, std::ostream& o) {
  if (!store.has_partition()) return;
  const Manifest& m = store.manifest();
  const int64_t n = m.num_nodes;
  const int32_t* part = store.partition();  // in range: open() checked them
  std::vector<int64_t> per_part(static_cast<size_t>(m.num_partitions), 0);
  for (int64_t v = 0; v < n; ++v) ++per_part[static_cast<size_t>(part[v])];
  const auto [lo, hi] = std::minmax_element(per_part.begin(), per_part.end());
  o << "partitions " << m.num_partitions;
  if (!m.partition_method.empty()) o << " (" << m.partition_method << ")";
  o << ", nodes per part min " << *lo << " max " << *hi;
  if (m.files.at("graph/indices.npy").dtype == "i32") {
    // Entries whose source and destination lie in different parts (self loops excluded).
    const int64_t* ip = store.indptr();
    const int32_t* idx = store.indices32();
    int64_t cut = 0, counted = 0;
    for (int64_t d = 0; d < n; ++d)
      for (int64_t k = ip[d]; k < ip[d + 1]; ++k) {
        if (idx[k] == d) continue;
        ++counted;
        cut += part[idx[k]] != part[d];
      }
    char line[96];
    std::snprintf(line, sizeof(line), ", edge cut %lld (%.1f%% of edges)", static_cast<long long>(cut),
                  counted > 0 ? 100.0 * static_cast<double>(cut) / static_cast<double>(counted) : 0.0);
    o << line;
  }
  o << "\n";
}

// The array files, and their page-sum sidecars summarised in one line rather than listed beside them.
void describe_files(const Store& store, std::ostream& o) {
  const Manifest& m = store.manifest();
  uint64_t total = 0, sums_total = 0;
  size_t arrays = 0, sidecars = 0;
  for (const auto& [rel, e] : m.files) {
    if (is_page_sums_path(rel)) {
      sums_total += e.size;
      ++sidecars;
    } else {
      total += e.size;
      ++arrays;
    }
  }
  o << "files      " << arrays << ", " << total << " bytes\n";
  for (const auto& [rel, e] : m.files) {
    if (is_page_sums_path(rel)) continue;
    char line[256];
    std::snprintf(line, sizeof(line), "  %-22s %-4s %-16s %14llu bytes\n", rel.c_str(), e.dtype.c_str(),
                  shape_text(e.shape).c_str(), static_cast<unsigned long long>(e.size));
    o << line;
  }
  if (store.has_page_sums())
    o << "page sums  " << sidecars << " files under pages/, " << sums_total << " bytes (XXH32 per " << m.page_size
      << "-byte page)\n";
  else
    o << "page sums  none (gale info --add-page-sums adds them)\n";
}

}  // namespace

std::string describe_store(const Store& store) {
  const Manifest& m = store.manifest();
  std::ostringstream o;
  o << "store      " << store.path().string() << " (format version " << m.format_version << ")\n";
  o << "nodes      " << m.num_nodes << "\n";
  o << "edges      " << m.num_edges << (m.weighted ? " (weighted)" : "") << "\n";
  describe_topology(store, o);
  describe_weights(store, o);
  o << "indices    " << m.files.at("graph/indices.npy").dtype << "\n";
  if (m.feature_dim > 0) o << "features   " << m.feature_dim << " x " << m.feature_dtype << "\n";
  else o << "features   none\n";
  describe_labels(store, o);
  if (m.splits.empty()) {
    o << "splits     none\n";
  } else {
    o << "splits    ";
    for (const auto& [name, size] : m.splits) o << " " << name << " " << size;
    o << "\n";
  }
  describe_partition(store, o);
  if (m.relabelled)
    o << "relabelled yes" << (m.relabel_order.empty() ? "" : ", " + m.relabel_order + " order")
      << " (relabel.npy maps stored ids to original ids)\n";
  describe_files(store, o);
  return o.str();
}

}  // namespace gale::storage

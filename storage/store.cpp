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
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "kernels/error.hpp"

namespace gale::storage {

namespace fs = std::filesystem;

namespace {

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw InputError(p.string() + ": cannot open for fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw InputError(p.string() + ": fsync failed: " + std::strerror(errno));
}

// Size, dtype and shape a file must have, as the manifest records them.
std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

}  // namespace

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
  j["relabelled"] = m.relabelled;
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [path, e] : m.files)
    files[path] = {{"dtype", e.dtype}, {"shape", e.shape}, {"size", e.size}, {"xxh64", e.xxh64}};
  j["files"] = files;
  return j.dump(2) + "\n";
}

Manifest manifest_from_json(const std::string& text, const std::string& source) {
  Manifest m;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw CorruptStoreError(source + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  auto get = [&](const char* key, auto* out) {
    if (!j.contains(key)) throw CorruptStoreError(source + ": missing key '" + key + "'");
    try {
      j.at(key).get_to(*out);
    } catch (const nlohmann::json::exception&) {
      throw CorruptStoreError(source + ": key '" + key + "' has the wrong type");
    }
  };
  get("format_version", &m.format_version);
  if (m.format_version != kStoreFormatVersion)
    throw CorruptStoreError(source + ": format version " + std::to_string(m.format_version) + ", this Gale reads version " +
                            std::to_string(kStoreFormatVersion));
  get("num_nodes", &m.num_nodes);
  get("num_edges", &m.num_edges);
  get("weighted", &m.weighted);
  get("feature_dim", &m.feature_dim);
  get("feature_dtype", &m.feature_dtype);
  get("num_classes", &m.num_classes);
  get("splits", &m.splits);
  get("num_partitions", &m.num_partitions);
  get("relabelled", &m.relabelled);
  if (!j.contains("files") || !j["files"].is_object()) throw CorruptStoreError(source + ": missing key 'files'");
  for (const auto& [path, e] : j["files"].items()) {
    FileEntry f;
    try {
      e.at("dtype").get_to(f.dtype);
      e.at("shape").get_to(f.shape);
      e.at("size").get_to(f.size);
      e.at("xxh64").get_to(f.xxh64);
    } catch (const nlohmann::json::exception&) {
      throw CorruptStoreError(source + ": malformed entry for file '" + path + "'");
    }
    m.files[path] = f;
  }
  return m;
}

// ---------------------------------------------------------------------------------------------
// StoreWriter

StoreWriter::StoreWriter(fs::path path, bool overwrite) : path_(std::move(path)), overwrite_(overwrite) {
  if (path_.filename().empty()) path_ = path_.parent_path();
  if (path_.empty()) throw InputError("-o/--output: expected a store path");
  if (fs::exists(path_) && !overwrite_)
    throw InputError(path_.string() + ": already exists (pass --force to replace it)");
  if (fs::exists(path_) && !fs::is_directory(path_))
    throw InputError(path_.string() + ": exists and is not a store directory");
  fs::path parent = path_.parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent)) throw InputError(path_.string() + ": parent directory " + parent.string() + " does not exist");
  std::random_device rd;
  temp_ = parent / ("." + path_.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                    hex64((static_cast<uint64_t>(rd()) << 32) | rd()).substr(8));
  std::error_code ec;
  if (!fs::create_directory(temp_, ec) || ec)
    throw InputError(temp_.string() + ": cannot create: " + (ec ? ec.message() : "already exists"));
}

StoreWriter::~StoreWriter() {
  open_.clear();
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(temp_, ec);
  }
}

NpyWriter& StoreWriter::begin_array(const std::string& rel_path, DType dtype, std::vector<int64_t> shape) {
  GALE_ASSERT(!committed_ && open_.count(rel_path) == 0);
  const fs::path file = temp_ / rel_path;
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  if (ec) throw InputError(file.parent_path().string() + ": cannot create: " + ec.message());
  auto writer = std::make_unique<NpyWriter>(file.string(), dtype, shape);
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
  {
    const std::string text = manifest_to_json(manifest_);
    std::ofstream out(manifest_file, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) throw InputError(manifest_file.string() + ": cannot write");
  }
  fsync_path(manifest_file, false);
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
  if (fs::exists(path_)) {
    if (!overwrite_) throw InputError(path_.string() + ": already exists (pass --force to replace it)");
    // Move the old store aside first, so a crash leaves either the old or the new store in place
    // (the aside copy is named like a temporary and never opens as NAME.gale).
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
  } else {
    fs::rename(temp_, path_, ec);
    if (ec) throw InputError(path_.string() + ": cannot create: " + ec.message());
  }
  committed_ = true;
  fsync_path(parent, true);
}

// ---------------------------------------------------------------------------------------------
// MappedArray

MappedArray::MappedArray(const fs::path& file, const NpyHeader& header) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CorruptStoreError(file.string() + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
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

Store Store::open(const fs::path& path) {
  if (!fs::is_directory(path)) throw InputError(path.string() + ": no such store directory");
  Store s;
  s.path_ = path;
  const fs::path manifest_file = path / "manifest.json";
  std::ifstream in(manifest_file, std::ios::binary);
  if (!in) throw CorruptStoreError(manifest_file.string() + ": missing; not a Gale store or an incomplete one");
  std::stringstream text;
  text << in.rdbuf();
  s.manifest_ = manifest_from_json(text.str(), manifest_file.string());
  const Manifest& m = s.manifest_;

  // Every listed file: present, of the recorded size, with a header matching dtype and shape.
  auto open_array = [&](const std::string& rel) -> MappedArray {
    const fs::path file = path / rel;
    const FileEntry& e = m.files.at(rel);
    std::error_code ec;
    const uint64_t size = fs::file_size(file, ec);
    if (ec) throw CorruptStoreError(file.string() + ": missing (listed in the manifest)");
    if (size != e.size)
      throw CorruptStoreError(file.string() + ": expected " + std::to_string(e.size) + " bytes, found " +
                              std::to_string(size) + " (truncated or replaced)");
    NpyHeader h;
    try {
      h = read_npy_header(file.string());
    } catch (const InputError& err) {
      throw CorruptStoreError(err.what());
    }
    DType want;
    if (!parse_dtype(e.dtype, &want) || want != h.dtype || h.shape != e.shape)
      throw CorruptStoreError(file.string() + ": header says " + h.descr + " " + shape_text(h.shape) + ", manifest says " +
                              e.dtype + " " + shape_text(e.shape));
    if (h.data_offset + static_cast<uint64_t>(h.count()) * dtype_size(h.dtype) != size)
      throw CorruptStoreError(file.string() + ": data size disagrees with its header");
    return MappedArray(file, h);
  };
  auto require = [&](const std::string& rel) {
    if (!m.files.count(rel)) throw CorruptStoreError(manifest_file.string() + ": no entry for required file " + rel);
  };
  auto expect_shape = [&](const std::string& rel, std::vector<int64_t> shape) {
    if (m.files.at(rel).shape != shape)
      throw CorruptStoreError((path / rel).string() + ": expected shape " + shape_text(shape) + ", manifest says " +
                              shape_text(m.files.at(rel).shape));
  };
  const int64_t n = m.num_nodes, e = m.num_edges;
  require("graph/indptr.npy");
  require("graph/indices.npy");
  expect_shape("graph/indptr.npy", {n + 1});
  expect_shape("graph/indices.npy", {e});
  if (m.files.at("graph/indptr.npy").dtype != "i64")
    throw CorruptStoreError((path / "graph/indptr.npy").string() + ": expected dtype i64");
  const std::string idx_dtype = m.files.at("graph/indices.npy").dtype;
  if (idx_dtype != "i32" && idx_dtype != "i64")
    throw CorruptStoreError((path / "graph/indices.npy").string() + ": expected dtype i32 or i64");
  s.indices64_ = idx_dtype == "i64";
  for (const auto& [rel, entry] : m.files) {
    MappedArray a = open_array(rel);
    if (rel == "graph/indptr.npy") s.indptr_ = std::move(a);
    else if (rel == "graph/indices.npy") s.indices_ = std::move(a);
    else if (rel == "graph/weights.npy") { expect_shape(rel, {e}); s.weights_ = std::move(a); }
    else if (rel == "features.npy") { expect_shape(rel, {n, m.feature_dim}); s.features_ = std::move(a); }
    else if (rel == "labels.npy") { expect_shape(rel, {n}); s.labels_ = std::move(a); }
    else if (rel == "partition.npy") { expect_shape(rel, {n}); s.partition_ = std::move(a); }
    else if (rel == "relabel.npy") { expect_shape(rel, {n}); s.relabel_ = std::move(a); }
    else if (rel.rfind("splits/", 0) == 0) {
      if (entry.dtype != "i64" || entry.shape.size() != 1)
        throw CorruptStoreError((path / rel).string() + ": expected a 1-D i64 array of node ids");
      const std::string name = fs::path(rel).stem().string();
      s.splits_[name] = std::move(a);
    }
  }
  if (m.feature_dim > 0 && !m.files.count("features.npy"))
    throw CorruptStoreError(manifest_file.string() + ": feature_dim is set but features.npy is not listed");
  const int64_t* ip = s.indptr();
  if (ip[0] != 0 || ip[n] != e)
    throw CorruptStoreError((path / "graph/indptr.npy").string() + ": expected indptr[0] = 0 and indptr[N] = " +
                            std::to_string(e) + ", found " + std::to_string(ip[0]) + " and " + std::to_string(ip[n]));
  return s;
}

void Store::verify() const {
  std::vector<char> buf(8u << 20);
  for (const auto& [rel, e] : manifest_.files) {
    const fs::path file = path_ / rel;
    std::ifstream in(file, std::ios::binary);
    if (!in) throw CorruptStoreError(file.string() + ": missing (listed in the manifest)");
    XXH64_state_t* st = XXH64_createState();
    XXH64_reset(st, 0);
    uint64_t size = 0;
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      const auto got = static_cast<size_t>(in.gcount());
      if (got == 0) break;
      XXH64_update(st, buf.data(), got);
      size += got;
    }
    const std::string digest = hex64(XXH64_digest(st));
    XXH64_freeState(st);
    if (size != e.size)
      throw CorruptStoreError(file.string() + ": expected " + std::to_string(e.size) + " bytes, found " + std::to_string(size));
    if (digest != e.xxh64)
      throw CorruptStoreError(file.string() + ": xxHash64 mismatch (manifest " + e.xxh64 + ", file " + digest +
                              "): the store is corrupt");
  }
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

std::vector<int64_t> Store::split(const std::string& name) const {
  auto it = splits_.find(name);
  if (it == splits_.end()) return {};
  const int64_t* p = it->second.as<int64_t>();
  return std::vector<int64_t>(p, p + it->second.count());
}

std::string describe_store(const Store& store) {
  const Manifest& m = store.manifest();
  const int64_t n = m.num_nodes;
  std::ostringstream o;
  o << "store      " << store.path().string() << " (format version " << m.format_version << ")\n";
  o << "nodes      " << n << "\n";
  o << "edges      " << m.num_edges << (m.weighted ? " (weighted)" : "") << "\n";
  // Degree statistics: in-degree from indptr, out-degree by counting sources.
  auto stats = [&](std::vector<int64_t> deg, const char* name) {
    if (deg.empty()) return;
    int64_t empty = 0;
    for (int64_t d : deg) empty += d == 0;
    std::sort(deg.begin(), deg.end());
    const double mean = n > 0 ? static_cast<double>(m.num_edges) / static_cast<double>(n) : 0;
    const auto at = [&](double q) { return deg[std::min<size_t>(deg.size() - 1, static_cast<size_t>(q * deg.size()))]; };
    char line[256];
    std::snprintf(line, sizeof(line), "%-10s min %lld  mean %.2f  median %lld  p99 %lld  max %lld  (%lld nodes with none)\n",
                  name, static_cast<long long>(deg.front()), mean, static_cast<long long>(at(0.5)),
                  static_cast<long long>(at(0.99)), static_cast<long long>(deg.back()), static_cast<long long>(empty));
    o << line;
  };
  if (n > 0) {
    const int64_t* ip = store.indptr();
    std::vector<int64_t> in(static_cast<size_t>(n)), out(static_cast<size_t>(n), 0);
    for (int64_t v = 0; v < n; ++v) in[v] = ip[v + 1] - ip[v];
    if (m.files.at("graph/indices.npy").dtype == "i32") {
      const int32_t* idx = store.indices32();
      for (int64_t k = 0; k < m.num_edges; ++k) out[idx[k]]++;
      stats(std::move(out), "out-degree");
    }
    stats(std::move(in), "in-degree");
  }
  o << "indices    " << m.files.at("graph/indices.npy").dtype << "\n";
  if (m.feature_dim > 0) o << "features   " << m.feature_dim << " x " << m.feature_dtype << "\n";
  else o << "features   none\n";
  if (store.has_labels()) {
    int64_t labelled = 0;
    for (int64_t v = 0; v < n; ++v) labelled += store.labels()[v] >= 0;
    o << "labels     " << m.num_classes << " classes, " << labelled << " labelled nodes\n";
  } else {
    o << "labels     none\n";
  }
  if (m.splits.empty()) {
    o << "splits     none\n";
  } else {
    o << "splits    ";
    for (const auto& [name, size] : m.splits) o << " " << name << " " << size;
    o << "\n";
  }
  if (m.num_partitions > 0) o << "partitions " << m.num_partitions << "\n";
  if (m.relabelled) o << "relabelled yes (relabel.npy maps stored ids to original ids)\n";
  uint64_t total = 0;
  for (const auto& [rel, e] : m.files) total += e.size;
  o << "files      " << m.files.size() << ", " << total << " bytes\n";
  return o.str();
}

}  // namespace gale::storage

// storage/store.hpp — the on-disk store NAME.gale/ (format in docs/store-format.md).
//
//   manifest.json            format version, counts, dtypes, classes, splits, files (size, xxh64)
//   graph/indptr.npy         int64, N+1; rows are destinations
//   graph/indices.npy        int32 (N < 2^31) or int64; in-neighbours of each destination
//   graph/weights.npy        optional f32, one per edge
//   features.npy             N x D, f32 | f16 | bf16 (optional)
//   labels.npy               int32, N, -1 = unlabelled (optional)
//   splits/{train,valid,test}.npy   int64 node ids (optional)
//   partition.npy            optional int32 part per node
//   relabel.npy              optional int64 original id per stored id
//   pages/<file>             u32 XXH32 of each 4 KiB page of <file> (storage/page_sums.hpp)
//
// A store is written into a temporary directory beside its final path, fsynced, then renamed:
// a crash or a bad input never leaves a store that opens. Opening checks the version, every
// file's size and npy header against the manifest, and every value that indexes something (graph
// offsets and ids, labels, split ids, parts; one parallel pass); verify() also checks every xxHash64.
// A store with page sums also has every page of the files open() reads whole checked at open.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/dtype.hpp"
#include "kernels/views.hpp"
#include "storage/npy.hpp"
#include "storage/page_sums.hpp"

namespace gale::storage {

// The version this Gale writes, and the oldest it reads: 2 adds page sums (pages/, page_size) to 1,
// whose stores open as they are (gale info --add-page-sums makes them version 2).
constexpr int kStoreFormatVersion = 2;
constexpr int kOldestStoreFormatVersion = 1;

struct FileEntry {
  std::string dtype;          // manifest dtype name (f32, bf16, i64, ...)
  std::vector<int64_t> shape;
  uint64_t size = 0;          // bytes on disk, header included
  std::string xxh64;          // 16 lowercase hex digits
};

struct Manifest {
  int format_version = kOldestStoreFormatVersion;  // StoreWriter writes kStoreFormatVersion
  int64_t num_nodes = 0;
  int64_t num_edges = 0;
  bool weighted = false;
  int64_t feature_dim = 0;        // 0 when there are no features
  std::string feature_dtype;      // "" when there are no features
  int64_t num_classes = 0;        // 0 when there are no labels
  std::map<std::string, int64_t> splits;  // name -> size (train, valid, test)
  int64_t num_partitions = 0;     // 0 when partition.npy is absent
  std::string partition_method;   // "metis", "ldg" or "single"; written only with num_partitions > 0
  bool relabelled = false;        // relabel.npy present
  // With relabelled: the order preprocess wrote ("degree", "hot" or "partition"); written only
  // for relabelled stores, and "" in one written before the key.
  std::string relabel_order;
  std::map<std::string, FileEntry> files;  // relative path -> entry, page-sum sidecars included
  // kPageSumPage when every array file has its page sums (pages/<file>); 0 in a store written
  // before them. Written only when non-zero, so such a store keeps its bytes.
  uint64_t page_size = 0;
};

// The manifest dtype of a page-sum sidecar (stored with descr kPageSumsDescr).
constexpr const char* kPageSumsDtype = "u32";

// True for a page-sum sidecar's path ("pages/...").
bool is_page_sums_path(const std::string& rel);

// Serialises with nlohmann::json; keys sorted, no timestamps, so equal stores are equal bytes.
std::string manifest_to_json(const Manifest& m);
// Throws CorruptStoreError naming `source` (the manifest path) and the missing / bad key.
Manifest manifest_from_json(const std::string& text, const std::string& source);

// Writes a store into a temporary directory and renames it into place on commit().
// If destroyed without commit(), the temporary directory is removed.
class StoreWriter {
 public:
  // Throws InputError if `path` exists and !overwrite, or its parent is not a writable directory.
  StoreWriter(std::filesystem::path path, bool overwrite);
  ~StoreWriter();
  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  const std::filesystem::path& temp_dir() const { return temp_; }
  const std::filesystem::path& path() const { return path_; }

  // Streams an array into the temporary store (relative path such as "graph/indices.npy").
  // `manifest_dtype` may differ from the stored one only for bf16 (stored as u2).
  NpyWriter& begin_array(const std::string& rel_path, DType dtype, std::vector<int64_t> shape);
  // Finishes the array and records its size, hash, dtype and shape in the manifest, and the same
  // of its page sums (pages/<rel_path>, written as the array streamed).
  void end_array(const std::string& rel_path);
  // begin + one write + end.
  void write_array(const std::string& rel_path, DType dtype, std::vector<int64_t> shape,
                   const void* data);

  // Counts, dtypes, splits, ... filled in by the importer; `files` is filled by end_array.
  Manifest& manifest() { return manifest_; }

  // Writes manifest.json, fsyncs every file and directory, renames into place (replacing an old
  // store when overwrite was given, never leaving neither).
  void commit();

 private:
  std::filesystem::path path_;
  std::filesystem::path temp_;
  bool overwrite_;
  bool committed_ = false;
  Manifest manifest_;
  std::map<std::string, std::unique_ptr<NpyWriter>> open_;
  std::map<std::string, std::unique_ptr<NpyWriter>> open_sums_;  // each open array's sidecar, fed as it streams
  std::map<std::string, std::pair<DType, std::vector<int64_t>>> open_meta_;
};

// A read-only memory map of one array of an open store.
class MappedArray {
 public:
  MappedArray() = default;
  MappedArray(const std::filesystem::path& file, const NpyHeader& header);
  ~MappedArray();
  MappedArray(MappedArray&&) noexcept;
  MappedArray& operator=(MappedArray&&) noexcept;
  MappedArray(const MappedArray&) = delete;
  MappedArray& operator=(const MappedArray&) = delete;

  const void* data() const { return data_; }
  template <typename T> const T* as() const { return static_cast<const T*>(data_); }
  int64_t count() const { return count_; }
  bool empty() const { return data_ == nullptr; }
  // The whole file, header included (what page sums cover).
  const char* file_bytes() const { return static_cast<const char*>(map_); }
  size_t file_size() const { return map_size_; }

 private:
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const void* data_ = nullptr;
  int64_t count_ = 0;
};

// An open store. Arrays are memory-mapped; nothing is read until touched.
class Store {
 public:
  // Throws CorruptStoreError naming the file when the manifest is missing or malformed, the
  // version is not kStoreFormatVersion, a file is missing, its size or header disagree with the
  // manifest, arrays are inconsistent (indptr length, last indptr != indices count), or a value
  // that indexes something lies outside its range (check_values).
  // Throws InputError if `path` is not a directory.
  static Store open(const std::filesystem::path& path);

  // Reads every file and checks its xxHash64, and, when the store has page sums, every page of
  // every array file against its sum; throws CorruptStoreError naming the first bad file (a bad
  // hash before a bad page, so a damaged sidecar is named as such). Returns the pages checked.
  uint64_t verify() const;

  // Page sums (storage/page_sums.hpp): open() has checked every page of every file except
  // features.npy, which is read by rows and checked on demand.
  bool has_page_sums() const { return manifest_.page_size != 0; }
  // The page sums of file `rel` (page_count(size) entries); nullptr when the store has none.
  const uint32_t* page_sums(const std::string& rel) const;
  // Checks the pages of features.npy holding rows [begin_row, end_row), for callers that load
  // features whole into memory; read_features / read_feature_rows do not check (the hot path).
  // Throws CorruptStoreError naming the file, the byte offset and the page; a no-op without page sums.
  void check_feature_pages(int64_t begin_row, int64_t end_row) const;

  const std::filesystem::path& path() const { return path_; }
  const Manifest& manifest() const { return manifest_; }
  int64_t num_nodes() const { return manifest_.num_nodes; }
  int64_t num_edges() const { return manifest_.num_edges; }

  const int64_t* indptr() const { return indptr_.as<int64_t>(); }
  // int32 indices; throws InputError when the store uses int64 indices (N >= 2^31).
  const int32_t* indices32() const;
  const float* weights() const { return weights_.empty() ? nullptr : weights_.as<float>(); }
  // The whole graph as a destination-major CSR (rows = cols = N).
  kernels::CsrView csr() const;

  bool has_features() const { return manifest_.feature_dim > 0; }
  int64_t feature_dim() const { return manifest_.feature_dim; }
  DType feature_dtype() const;
  const void* features_raw() const { return features_.data(); }
  // Copies rows [begin, end) of the features into out (row-major f32), converting f16/bf16.
  void read_features(int64_t begin, int64_t end, float* out) const;
  // Copies the rows of nodes ids[0..n) into out (n x feature_dim, row-major f32), in parallel.
  void read_feature_rows(const int64_t* ids, int64_t n, float* out) const;

  bool has_labels() const { return !labels_.empty(); }
  const int32_t* labels() const { return labels_.as<int32_t>(); }
  int64_t num_classes() const { return manifest_.num_classes; }

  bool has_split(const std::string& name) const { return splits_.count(name) > 0; }
  // Node ids of split `name` (train, valid, test); empty when absent.
  std::vector<int64_t> split(const std::string& name) const;

  // partition.npy (gale preprocess --partitions P): the part in [0, num_partitions()) of each node.
  // open() checks its size, header and values; verify() checks its hash.
  bool has_partition() const { return manifest_.num_partitions > 0; }
  int num_partitions() const { return static_cast<int>(manifest_.num_partitions); }
  const std::string& partition_method() const { return manifest_.partition_method; }
  const int32_t* partition() const { return partition_.empty() ? nullptr : partition_.as<int32_t>(); }
  const int64_t* relabel() const { return relabel_.empty() ? nullptr : relabel_.as<int64_t>(); }

 private:
  // Maps every file the manifest lists (checked against it first) into its member.
  void map_files();
  // Throws CorruptStoreError naming the file unless indptr is non-decreasing, every index is a
  // node id, every label in [-1, num_classes), every split id a node, every part in range and
  // every original id (relabel.npy) in [0, N).
  void check_values() const;
  // Throws CorruptStoreError naming `rel` unless pages [first, last) of `file` match their sums.
  void check_pages(const std::string& rel, const MappedArray& file, uint64_t first, uint64_t last) const;

  std::filesystem::path path_;
  Manifest manifest_;
  MappedArray indptr_, indices_, weights_, features_, labels_, partition_, relabel_;
  bool indices64_ = false;
  std::map<std::string, MappedArray> splits_;
  std::map<std::string, MappedArray> page_sums_;  // file -> its sidecar, when the store has page sums
};

// `gale info --add-page-sums`: gives a store written before page sums its sidecars and the
// manifest key, reading each file once (its xxHash64 is checked on the way, so damage already
// there is refused, not summed). Sidecars are written first, then manifest.json is replaced
// atomically (manifest.json.tmp, fsync, rename): a crash leaves the old store or the new one.
// Returns the number of files given sums; 0 when the store already has them (nothing written).
size_t add_page_sums(const std::filesystem::path& path);

// The `count` hottest nodes for a feature cache, hottest first: the nodes flagged in `preferred`
// (one flag per node, e.g. a worker's own parts) ahead of the rest, then by `reads` when given
// (how often pre-sampled batches read each node: GNNLab's pre-sampling, one count per node), then
// by in-degree (how often a sampler reaches a node), ties by id, so a cache is a pure function of
// the graph and the counts. Sorts only as far as `count`.
std::vector<int64_t> hottest_nodes(const Store& store, int64_t count, const std::vector<uint8_t>* preferred = nullptr,
                                   const std::vector<uint32_t>* reads = nullptr);

// The f32 feature rows a cache of `bytes` holds once its slot table (4 bytes per node) is paid
// for: 0 when it is not, never more than every row.
int64_t cache_rows_within(const Store& store, uint64_t bytes);

// What `gale info` prints: counts, degree statistics (min / mean / median / max / p99, empty
// rows), dtypes, splits, classes, partitions (method, nodes per part, edge cut), files.
std::string describe_store(const Store& store);

}  // namespace gale::storage

// gale preprocess: every importer and generator feeds one EdgeSorter and one set of node arrays,
// and one writer turns them into a store, so the same graph always gives the same bytes.
#include "storage/preprocess.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>

#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "storage/edge_sorter.hpp"
#include "storage/generators.hpp"
#include "storage/partition.hpp"
#include "storage/store.hpp"
#include "storage/text_reader.hpp"

namespace gale::storage {

namespace fs = std::filesystem;

namespace {

// Temporary files are closed on every path, errors included.
struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

// A temporary file that could not be written, named with the reason (no room is the usual one;
// errno 0 when a short fwrite left none).
[[noreturn]] void throw_write_failed(const fs::path& path, int err) {
  throw ResourceError(path.string() + ": cannot write temporary file: " + (err != 0 ? std::strerror(err) : "short write"));
}

File open_temp(const fs::path& path, const char* mode) {
  File f(std::fopen(path.c_str(), mode));
  if (!f) throw ResourceError(path.string() + ": cannot open temporary file: " + std::strerror(errno));
  return f;
}

// Closes a file that was written, so a full disk is reported rather than a short store.
void close_written(File f, const fs::path& path) {
  if (std::fclose(f.release()) != 0) throw_write_failed(path, errno);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A user-supplied .npy array, memory-mapped, with its header.
struct UserArray {
  std::string path;
  NpyHeader header;
  MappedArray data;

  explicit UserArray(const std::string& p) : path(p), header(read_npy_header(p)) {
    std::error_code ec;
    const uint64_t size = fs::file_size(p, ec);
    const uint64_t need = header.data_offset + static_cast<uint64_t>(header.count()) * dtype_size(header.dtype);
    if (ec || size < need)
      throw InputError(p + ": truncated: header promises " + std::to_string(need) + " bytes, file has " + std::to_string(size));
    if (size > need)  // numpy.save writes none: a wrong shape in the header, or a file appended to
      throw InputError(p + ": expected " + std::to_string(need) + " bytes for its header's shape " +
                       shape_text(header.shape) + ", found " + std::to_string(size) + " (trailing data)");
    data = MappedArray(p, header);
  }
  bool is_int() const { return header.dtype == DType::kI32 || header.dtype == DType::kI64; }
  // Not a cast: a header padded to any length leaves the data at any byte address.
  int64_t int_at(int64_t i) const {
    const auto k = static_cast<size_t>(i);
    return header.dtype == DType::kI32 ? load_unaligned<int32_t>(data.data(), k) : load_unaligned<int64_t>(data.data(), k);
  }
};

// Everything but the topology, with where each piece came from (for messages).
struct NodeData {
  std::optional<int64_t> num_nodes;     // when the input states it
  std::string num_nodes_source;
  // Features: one of text rows, a .npy, or a generator.
  int64_t feature_dim = 0;
  int64_t feature_rows = 0;
  std::string feature_source;
  // Text features are parsed once into a raw f32 file (inside the store's temporary directory,
  // removed before commit) and mapped: OGB feature files outgrow memory long before the graph does.
  fs::path text_file;
  MappedArray text_features;
  std::unique_ptr<UserArray> npy_features;
  const GeneratorSpec* generator = nullptr;
  // Labels (-1 unlabelled).
  bool has_labels = false;
  std::string label_source;
  std::vector<int32_t> labels;
  // Splits by name, with their sources.
  std::map<std::string, std::vector<int64_t>> splits;
  std::map<std::string, std::string> split_sources;

  bool has_features() const { return feature_dim > 0; }
  void feature_row(int64_t v, float* row) const {
    if (generator) {
      generated_features(*generator, v, row);
    } else if (npy_features) {
      const size_t item = dtype_size(npy_features->header.dtype);
      convert_to_f32(npy_features->header.dtype,
                     static_cast<const char*>(npy_features->data.data()) + static_cast<size_t>(v * feature_dim) * item, row,
                     static_cast<size_t>(feature_dim));
    } else {
      std::memcpy(row, text_features.as<float>() + v * feature_dim, static_cast<size_t>(feature_dim) * sizeof(float));
    }
  }
};

// Reads a one-integer-per-line file (plain or gz): OGB's num-node-list, split files.
std::vector<int64_t> read_id_lines(const std::string& path) {
  std::vector<int64_t> ids;
  LineReader in(path);
  std::vector<std::string_view> fields;
  while (in.next_fields(&fields)) {
    int64_t v;
    if (fields.size() != 1 || !parse_int64(fields[0], &v))
      throw InputError(in.where() + "expected one integer node id, found " + std::to_string(fields.size()) +
                       " values starting '" + quote_token(fields[0]) + "'");
    if (v < 0) throw InputError(in.where() + "negative node id " + std::to_string(v));
    ids.push_back(v);
  }
  return ids;
}

// "file:line: " of the k-th id of an id file (text: its k-th non-blank line; .npy: its index),
// looked up again only when that id turns out to be bad.
std::string id_location(const std::string& path, size_t k) {
  if (ends_with(path, ".npy")) return path + ": index " + std::to_string(k) + ": ";
  LineReader in(path);
  std::vector<std::string_view> fields;
  for (size_t i = 0; in.next_fields(&fields); ++i)
    if (i == k) return in.where();
  return path + ": ";
}

std::vector<int64_t> read_ids(const std::string& path) {
  if (ends_with(path, ".npy")) {
    UserArray a(path);
    if (!a.is_int() || a.header.shape.size() != 1) throw InputError(path + ": expected a 1-D int32 or int64 array of node ids");
    std::vector<int64_t> ids(static_cast<size_t>(a.header.count()));
    for (int64_t i = 0; i < a.header.count(); ++i) {
      ids[i] = a.int_at(i);
      if (ids[i] < 0) throw InputError(path + ": negative node id " + std::to_string(ids[i]) + " at index " + std::to_string(i));
    }
    return ids;
  }
  return read_id_lines(path);
}

void read_text_features(const std::string& path, const fs::path& scratch, NodeData* nd) {
  LineReader in(path);
  std::vector<std::string_view> fields;
  nd->text_file = scratch / ".features.raw";
  File out = open_temp(nd->text_file, "wb");
  std::vector<float> buf;
  auto flush = [&] {
    if (std::fwrite(buf.data(), sizeof(float), buf.size(), out.get()) != buf.size())
      throw_write_failed(nd->text_file, errno);
    buf.clear();
  };
  while (in.next_fields(&fields)) {
    if (nd->feature_dim == 0) nd->feature_dim = static_cast<int64_t>(fields.size());
    if (static_cast<int64_t>(fields.size()) != nd->feature_dim)
      throw InputError(in.where() + "expected " + std::to_string(nd->feature_dim) + " values, found " +
                       std::to_string(fields.size()));
    for (auto f : fields) {
      double x;
      // Parsed as double, then rounded once to float: the same numbers in text and in an f32 .npy
      // give the same bytes.
      if (!parse_double(f, &x)) throw InputError(in.where() + "expected a number, found '" + quote_token(f) + "'");
      if (!std::isfinite(static_cast<float>(x)))
        throw InputError(in.where() + "expected a finite float32 feature, found '" + quote_token(f) + "'");
      buf.push_back(static_cast<float>(x));
    }
    ++nd->feature_rows;
    if (buf.size() >= (1u << 20)) flush();
  }
  flush();
  close_written(std::move(out), nd->text_file);
  if (nd->feature_rows == 0) throw InputError(path + ": no feature rows found");
  NpyHeader raw;
  raw.dtype = DType::kF32;
  raw.shape = {nd->feature_rows, nd->feature_dim};
  nd->text_features = MappedArray(nd->text_file, raw);
  nd->feature_source = path;
}

void read_text_labels(const std::string& path, NodeData* nd) {
  LineReader in(path);
  std::string_view line;
  std::vector<std::string_view> fields;
  while (in.next(&line)) {
    split_fields(line, &fields);
    if (fields.size() != 1) {
      if (fields.empty()) {  // an empty line in a label file is a missing label
        nd->labels.push_back(-1);
        continue;
      }
      throw InputError(in.where() + "expected one label per line, found " + std::to_string(fields.size()) + " values");
    }
    int64_t y;
    double d;
    if (parse_int64(fields[0], &y)) {
    } else if (fields[0] == "nan" || fields[0] == "NaN") {
      y = -1;
    } else if (parse_double(fields[0], &d) && d == std::floor(d) && d >= -1 && d <= INT32_MAX) {
      y = static_cast<int64_t>(d);  // in range before the cast: a cast of inf or 1e300 is undefined
    } else {
      throw InputError(in.where() + "expected an integer class label, found '" + quote_token(fields[0]) + "'");
    }
    if (y < -1 || y > INT32_MAX) throw InputError(in.where() + "label " + std::to_string(y) + " out of range");
    nd->labels.push_back(static_cast<int32_t>(y));
  }
  nd->has_labels = true;
  nd->label_source = path;
}

void read_npy_features(const std::string& path, NodeData* nd) {
  nd->npy_features = std::make_unique<UserArray>(path);
  const NpyHeader& h = nd->npy_features->header;
  if (h.shape.size() != 2 || !(h.dtype == DType::kF32 || h.dtype == DType::kF64 || h.dtype == DType::kF16))
    throw InputError(path + ": expected a 2-D float32, float64 or float16 array (nodes x features), found " + h.descr +
                     " of shape " + shape_text(h.shape));
  nd->feature_rows = h.shape[0];
  nd->feature_dim = h.shape[1];
  nd->feature_source = path;
  if (nd->feature_dim == 0) throw InputError(path + ": features have zero columns");
}

void read_npy_labels(const std::string& path, NodeData* nd) {
  UserArray a(path);
  if (!a.is_int() || a.header.shape.size() != 1) throw InputError(path + ": expected a 1-D int32 or int64 array of labels");
  nd->labels.resize(static_cast<size_t>(a.header.count()));
  for (int64_t i = 0; i < a.header.count(); ++i) {
    const int64_t y = a.int_at(i);
    if (y < -1 || y > INT32_MAX) throw InputError(path + ": label " + std::to_string(y) + " at index " + std::to_string(i) + " out of range");
    nd->labels[i] = static_cast<int32_t>(y);
  }
  nd->has_labels = true;
  nd->label_source = path;
}

// ----- topology readers: each streams (src, dst, weight) into `add` ---------------------------

// Readers validate each edge with `check` (an empty string when fine, else what is wrong), prefix
// the location on failure, and stream good edges into `add`.
struct EdgeSink {
  std::function<std::string(int64_t src, int64_t dst)> check;
  std::function<void(int64_t src, int64_t dst, float w)> add;
};
using AddEdge = EdgeSink;

// `columns` carries the first file's column count (0 before any edge) into the next file, so a
// weighted and an unweighted file cannot be mixed.
void read_edge_list(const std::string& path, int* columns_seen, const AddEdge& add) {
  LineReader in(path);
  std::string_view line;
  std::vector<std::string_view> fields;
  int& columns = *columns_seen;
  bool any = false;
  while (in.next(&line)) {
    size_t first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos) continue;
    if (line[first] == '#' || line[first] == '%') continue;
    split_fields(line, &fields);
    if (columns == 0) {
      if (fields.size() != 2 && fields.size() != 3)
        throw InputError(in.where() + "expected 'src dst' or 'src dst weight', found " + std::to_string(fields.size()) +
                         " columns");
      columns = static_cast<int>(fields.size());
    } else if (static_cast<int>(fields.size()) != columns) {
      throw InputError(in.where() + "expected " + std::to_string(columns) + " columns (" +
                       (columns == 3 ? "src dst weight" : "src dst") + ") as on the lines before, found " +
                       std::to_string(fields.size()));
    }
    any = true;
    int64_t s, d;
    if (!parse_int64(fields[0], &s) || !parse_int64(fields[1], &d)) {
      const std::string_view bad = parse_int64(fields[0], &s) ? fields[1] : fields[0];
      throw InputError(in.where() + "expected two integer node ids, found '" + quote_token(bad) + "'");
    }
    double w = 1.0;
    if (columns == 3 && !(parse_double(fields[2], &w) && std::isfinite(static_cast<float>(w))))
      throw InputError(in.where() + "expected a finite float32 weight, found '" + quote_token(fields[2]) + "'");
    const std::string bad = add.check(s, d);
    if (!bad.empty()) throw InputError(in.where() + bad);
    add.add(s, d, static_cast<float>(w));
  }
  if (!any) throw InputError(path + ": no edges found");
}

// Returns the number of entries (a symmetric file's mirrored entries not counted).
int64_t read_matrix_market(const std::string& path, bool* weighted, NodeData* nd, const AddEdge& add,
                           const std::function<void()>& n_known) {
  LineReader in(path);
  std::string_view line;
  if (!in.next(&line) || line.rfind("%%MatrixMarket", 0) != 0)
    throw InputError(path + ":1: expected a '%%MatrixMarket matrix coordinate ...' banner");
  std::string banner(line);
  for (auto& ch : banner) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (banner.find("coordinate") == std::string::npos)
    throw InputError(path + ":1: only 'coordinate' Matrix Market files hold graphs (found '" + quote_token(line) + "')");
  const bool pattern = banner.find("pattern") != std::string::npos;
  const bool skew = banner.find("skew-symmetric") != std::string::npos;
  const bool symmetric = banner.find("symmetric") != std::string::npos || banner.find("hermitian") != std::string::npos;
  if (banner.find("complex") != std::string::npos) throw InputError(path + ":1: complex matrices are not graphs Gale reads");
  *weighted = !pattern;
  std::vector<std::string_view> fields;
  int64_t rows = -1, cols = -1, nnz = -1, seen = 0;
  while (in.next(&line)) {
    if (line.empty() || line[0] == '%') continue;
    split_fields(line, &fields);
    if (fields.empty()) continue;
    if (rows < 0) {
      if (fields.size() != 3 || !parse_int64(fields[0], &rows) || !parse_int64(fields[1], &cols) ||
          !parse_int64(fields[2], &nnz) || rows < 0 || cols < 0 || nnz < 0)
        throw InputError(in.where() + "expected the size line 'rows cols entries'");
      // As for edge lists (below): a node count far above the entries is a wrong size line, and
      // would size the CSR's offsets by it.
      if (!nd->num_nodes && std::max(rows, cols) > (int64_t{1} << 26) && std::max(rows, cols) / 64 > nnz)
        throw InputError(in.where() + "the size line gives " + std::to_string(std::max(rows, cols)) + " nodes for " +
                         std::to_string(nnz) + " entries; expected a graph's size line (or give --num-nodes)");
      if (!nd->num_nodes) {
        nd->num_nodes = std::max(rows, cols);
        nd->num_nodes_source = path;
      }
      n_known();
      continue;
    }
    const size_t want = pattern ? 2 : 3;
    if (fields.size() != want)
      throw InputError(in.where() + "expected " + std::to_string(want) + " values per entry, found " + std::to_string(fields.size()));
    int64_t i, j;
    if (!parse_int64(fields[0], &i) || !parse_int64(fields[1], &j))
      throw InputError(in.where() + "expected two integer indices, found '" + quote_token(line) + "'");
    if (i < 1 || i > rows || j < 1 || j > cols)
      throw InputError(in.where() + "entry (" + std::to_string(i) + ", " + std::to_string(j) + ") outside the " +
                       std::to_string(rows) + " x " + std::to_string(cols) + " matrix (indices are 1-based)");
    double w = 1.0;
    if (!pattern && !(parse_double(fields[2], &w) && std::isfinite(static_cast<float>(w))))
      throw InputError(in.where() + "expected a finite float32 value, found '" + quote_token(fields[2]) + "'");
    // --num-nodes may be smaller than the matrix.
    const std::string bad = add.check(i - 1, j - 1);
    if (!bad.empty()) throw InputError(in.where() + bad);
    add.add(i - 1, j - 1, static_cast<float>(w));
    if (symmetric && i != j) add.add(j - 1, i - 1, static_cast<float>(skew ? -w : w));
    ++seen;
  }
  if (rows < 0) throw InputError(path + ": missing the size line");
  if (seen != nnz)
    throw InputError(path + ": the size line promises " + std::to_string(nnz) + " entries, found " + std::to_string(seen));
  return seen;
}

// `weights_path` (optional): one float per edge, in the edge array's order (PyG's edge_weight).
void read_npy_edges(const std::string& path, const std::string& weights_path, const AddEdge& add) {
  UserArray a(path);
  const auto& s = a.header.shape;
  if (!a.is_int() || s.size() != 2 || (s[0] != 2 && s[1] != 2))
    throw InputError(path + ": expected an int32 or int64 edge array of shape (E, 2) or (2, E)");
  // PyG's edge_index (2, E) first: a 2 x 2 array is two edges, sources in row 0 as PyG has them.
  const bool rows_are_edges = s[0] != 2;  // (E, 2)
  const int64_t e = rows_are_edges ? s[0] : s[1];
  if (e == 0) throw InputError(path + ": no edges found");
  std::unique_ptr<UserArray> w;
  if (!weights_path.empty()) {
    w = std::make_unique<UserArray>(weights_path);
    const NpyHeader& h = w->header;
    if (h.shape.size() != 1 || !(h.dtype == DType::kF32 || h.dtype == DType::kF64 || h.dtype == DType::kF16))
      throw InputError(weights_path + ": expected a 1-D float32, float64 or float16 array of edge weights, found " +
                       h.descr + " of shape " + shape_text(h.shape));
    if (h.shape[0] != e)
      throw InputError(weights_path + ": " + std::to_string(h.shape[0]) + " weights for the " + std::to_string(e) +
                       " edges of " + path);
  }
  const size_t item = w ? dtype_size(w->header.dtype) : 0;
  for (int64_t k = 0; k < e; ++k) {
    const int64_t src = rows_are_edges ? a.int_at(2 * k) : a.int_at(k);
    const int64_t dst = rows_are_edges ? a.int_at(2 * k + 1) : a.int_at(e + k);
    const std::string bad = add.check(src, dst);
    if (!bad.empty()) throw InputError(path + ": edge " + std::to_string(k) + ": " + bad);
    float weight = 1.0f;
    if (w) {
      convert_to_f32(w->header.dtype, static_cast<const char*>(w->data.data()) + static_cast<size_t>(k) * item, &weight, 1);
      if (!std::isfinite(weight))
        throw InputError(weights_path + ": weight " + std::to_string(k) + " is not a finite number");
    }
    add.add(src, dst, weight);
  }
}

// ----- writing ---------------------------------------------------------------------------------

// The final CSR, held as counts plus a raw stream of sources on disk until its size is known.
struct CsrSpill {
  std::vector<int64_t> indptr;
  fs::path indices_file, weights_file;
  int64_t nnz = 0;
};

// Drains the sorter into a CSR over n nodes: per-row counts in memory, sources (and weights)
// in raw temporary files.
CsrSpill drain(EdgeSorter* sorter, int64_t n, bool dedup, bool drop_self, bool weighted, const fs::path& dir) {
  CsrSpill c;
  c.indptr.assign(static_cast<size_t>(n + 1), 0);
  c.indices_file = dir / ".indices.raw";
  c.weights_file = dir / ".weights.raw";
  File fi = open_temp(c.indices_file, "wb");
  File fw = weighted ? open_temp(c.weights_file, "wb") : nullptr;
  std::vector<int64_t> ib;
  std::vector<float> wb;
  auto flush = [&] {
    if (std::fwrite(ib.data(), sizeof(int64_t), ib.size(), fi.get()) != ib.size())
      throw_write_failed(c.indices_file, errno);
    if (fw && std::fwrite(wb.data(), sizeof(float), wb.size(), fw.get()) != wb.size())
      throw_write_failed(c.weights_file, errno);
    ib.clear();
    wb.clear();
  };
  sorter->finish(dedup, drop_self, [&](const Edge& e) {
    c.indptr[e.dst + 1]++;
    ib.push_back(e.src);
    if (fw) wb.push_back(e.weight);
    if (ib.size() >= (1u << 20)) flush();
    ++c.nnz;
  });
  flush();
  close_written(std::move(fi), c.indices_file);
  if (fw) close_written(std::move(fw), c.weights_file);
  for (int64_t v = 0; v < n; ++v) c.indptr[v + 1] += c.indptr[v];
  return c;
}

// Streams a raw file of `count` values of `from` into an array of `to` (narrowing int64 ids to
// int32 when the graph allows).
// Calls fn(values, n) over the `count` int64 values of a temporary file, a million at a time.
template <typename Fn>
void for_raw_chunks(const fs::path& raw, int64_t count, Fn fn) {
  File f = open_temp(raw, "rb");
  std::vector<int64_t> buf(1 << 20);
  int64_t left = count;
  while (left > 0) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(buf.size())));
    if (std::fread(buf.data(), sizeof(int64_t), want, f.get()) != want)
      throw ResourceError(raw.string() + ": short read of temporary file");
    fn(buf.data(), want);
    left -= static_cast<int64_t>(want);
  }
}

void copy_raw(const fs::path& raw, int64_t count, bool narrow_to_i32, NpyWriter* out) {
  std::vector<int32_t> narrow;
  for_raw_chunks(raw, count, [&](const int64_t* values, size_t n) {
    if (narrow_to_i32) {
      narrow.resize(n);
      for (size_t i = 0; i < n; ++i) narrow[i] = static_cast<int32_t>(values[i]);
      out->write(narrow.data(), n * sizeof(int32_t));
    } else {
      out->write(values, n * sizeof(int64_t));
    }
  });
}

void copy_raw_floats(const fs::path& raw, int64_t count, NpyWriter* out) {
  File f = open_temp(raw, "rb");
  std::vector<float> buf(1 << 20);
  int64_t left = count;
  while (left > 0) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(buf.size())));
    if (std::fread(buf.data(), sizeof(float), want, f.get()) != want)
      throw ResourceError(raw.string() + ": short read of temporary file");
    out->write(buf.data(), want * sizeof(float));
    left -= static_cast<int64_t>(want);
  }
}

InputFormat detect(const PreprocessOptions& o) {
  if (o.format != InputFormat::kAuto) return o.format;
  if (o.inputs.empty()) return InputFormat::kNpy;
  const std::string& in = o.inputs[0];
  if (fs::is_directory(in)) {
    if (fs::exists(fs::path(in) / "raw" / "edge.csv.gz") || fs::exists(fs::path(in) / "raw" / "edge.csv"))
      return InputFormat::kOgb;
    throw InputError(in + ": a directory, but not an OGB node-property folder (no raw/edge.csv.gz)");
  }
  if (ends_with(in, ".mtx") || ends_with(in, ".mtx.gz")) return InputFormat::kMatrixMarket;
  if (ends_with(in, ".npy")) return InputFormat::kNpy;
  // By content too: an edge list skips '%' lines as comments, so a Matrix Market file of another
  // name would otherwise be read as edges, its size line among them.
  const std::string head = first_bytes(in, 14);
  if (head == "%%MatrixMarket") return InputFormat::kMatrixMarket;
  if (head.compare(0, 6, "\x93NUMPY") == 0) return InputFormat::kNpy;
  return InputFormat::kEdgeList;
}

const char* format_name(InputFormat f) {
  switch (f) {
    case InputFormat::kEdgeList: return "edge list";
    case InputFormat::kOgb: return "OGB folder";
    case InputFormat::kMatrixMarket: return "Matrix Market";
    case InputFormat::kNpy: return "NumPy";
    default: return "auto";
  }
}

std::string ogb_file(const fs::path& dir, const std::string& rel) {
  const fs::path gz = dir / (rel + ".gz");
  if (fs::exists(gz)) return gz.string();
  if (fs::exists(dir / rel)) return (dir / rel).string();
  return "";
}

// Partitioning takes int32 node ids.
void require_int32_nodes(int64_t n) {
  if (n >= (int64_t{1} << 31))
    throw InputError("--partitions: the graph has " + std::to_string(n) +
                     " nodes; partitioning takes graphs below 2^31 nodes (int32 indices)");
}

// ----- the stages of preprocess() -------------------------------------------------------------

// What the options say to read: a generator, or files of one format.
struct Source {
  bool generating = false;
  GeneratorSpec gen;                          // when generating
  InputFormat format = InputFormat::kAuto;   // kAuto when generating
  fs::path ogb_dir;                           // an OGB folder's root
};

// Checks the options against each other and against the inputs' existence, before anything is
// read or written.
Source check_options(const PreprocessOptions& o) {
  Source in;
  in.generating = !o.generate.empty();
  if (in.generating) {
    in.gen = parse_generator(o.generate);
    if (!in.gen.seed_given) in.gen.seed = o.seed;
    if (!o.inputs.empty() || !o.edges_npy.empty())
      throw InputError("--generate: takes no INPUT files or --edges");
  }
  if (!in.generating && o.inputs.empty() && o.edges_npy.empty())
    throw InputError("preprocess: expected INPUT files, --edges FILE.npy or --generate");
  if (!o.inputs.empty() && !o.edges_npy.empty())
    throw InputError("--edges: the INPUT files already give the edges; pass one or the other");
  for (const auto& file : o.inputs) {
    if (!fs::exists(file)) throw InputError(file + ": no such file or directory");
  }
  in.format = in.generating ? InputFormat::kAuto : detect(o);
  const InputFormat format = in.format;
  if (!in.generating && format != InputFormat::kNpy && o.inputs.empty())
    throw InputError(std::string("preprocess: the ") + format_name(format) + " format reads INPUT files, not --edges");
  if (!o.weights_npy.empty() && (in.generating || format != InputFormat::kNpy))
    throw InputError("--weights: weighs NumPy edges (--edges FILE.npy); " +
                     std::string(in.generating ? "--generate takes weights=uniform"
                                               : "an edge list's third column or a Matrix Market file's values give weights"));
  if (o.num_nodes && *o.num_nodes < 1) throw InputError("--num-nodes: expected a positive count");
  if (format == InputFormat::kOgb && ogb_file(o.inputs[0], "raw/edge.csv").empty())
    throw InputError(o.inputs[0] + ": not an OGB node-property folder (no raw/edge.csv.gz)");
  if ((format == InputFormat::kOgb || format == InputFormat::kMatrixMarket) && o.inputs.size() > 1)
    throw InputError(o.inputs[1] + ": expected one INPUT for this format (" + format_name(format) + ")");
  if (!(o.train_fraction > 0) || !(o.valid_fraction >= 0) || !(o.train_fraction + o.valid_fraction <= 1))  // NaN fails
    throw InputError("--split-fractions: expected TRAIN,VALID fractions summing to at most 1");
  if (o.partitions < 0)
    throw InputError("--partitions: expected a positive part count, found " + std::to_string(o.partitions));
  if (o.relabel == Relabel::kPartition && o.partitions == 0)
    throw InputError("--relabel partition: needs --partitions P (the parts whose nodes become consecutive ids)");
  if (!o.temp_dir.empty() && !fs::is_directory(o.temp_dir))
    throw InputError(std::string("--temp-dir: expected an existing directory for the sorted runs, found ") +
                     (fs::exists(o.temp_dir) ? "a file at " : "no directory at ") + o.temp_dir);
  if (format == InputFormat::kOgb) in.ogb_dir = o.inputs[0];
  return in;
}

// An OGB folder's split: split/<name>/{train,valid,test}.csv.gz, by --split or the only one.
void read_ogb_split(const PreprocessOptions& o, const fs::path& ogb_dir, NodeData* nd) {
  const fs::path split_root = ogb_dir / "split";
  if (!fs::is_directory(split_root)) {
    if (!o.split_name.empty()) throw InputError("--split " + o.split_name + ": " + ogb_dir.string() + " has no split/ folder");
    return;
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(split_root))
    if (e.is_directory()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::string name = o.split_name;
  if (name.empty()) {
    if (names.size() > 1) {
      std::string all;
      for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
      throw InputError(split_root.string() + ": several splits (" + all + "); pick one with --split NAME");
    }
    if (!names.empty()) name = names[0];
  } else if (std::find(names.begin(), names.end(), name) == names.end()) {
    throw InputError("--split " + name + ": no folder " + (split_root / name).string());
  }
  if (name.empty()) return;
  for (const char* part : {"train", "valid", "test"}) {
    const std::string f = ogb_file(split_root / name, std::string(part) + ".csv");
    if (f.empty()) throw InputError((split_root / name).string() + ": missing " + part + ".csv.gz");
    nd->splits[part] = read_id_lines(f);
    nd->split_sources[part] = f;
  }
}

// An OGB folder's node count, features, labels and split (the NumPy flags take precedence).
void read_ogb_node_data(const PreprocessOptions& o, const fs::path& ogb_dir, const fs::path& scratch, NodeData* nd) {
  const std::string count_file = ogb_file(ogb_dir, "raw/num-node-list.csv");
  if (!count_file.empty() && !nd->num_nodes) {
    const auto counts = read_id_lines(count_file);
    if (counts.size() != 1) throw InputError(count_file + ": expected one node count (one graph)");
    nd->num_nodes = counts[0];
    nd->num_nodes_source = count_file;
  }
  const std::string feat = ogb_file(ogb_dir, "raw/node-feat.csv");
  if (!feat.empty() && o.features_npy.empty()) read_text_features(feat, scratch, nd);
  const std::string lab = ogb_file(ogb_dir, "raw/node-label.csv");
  if (!lab.empty() && o.labels_npy.empty()) read_text_labels(lab, nd);
  read_ogb_split(o, ogb_dir, nd);
}

// Stage 1: the node data, and the node count when the input states it (a generator's spec, --num-nodes, an
// OGB count file, else the features' or labels' rows). `in` outlives `nd` (a generator's features
// are drawn from its spec as they are written).
void read_node_data(const PreprocessOptions& o, const Source& in, const fs::path& scratch, NodeData* nd) {
  if (o.num_nodes) {
    nd->num_nodes = *o.num_nodes;
    nd->num_nodes_source = "--num-nodes";
  }
  if (in.generating) {
    const GeneratorSpec& gen = in.gen;
    nd->num_nodes = generator_nodes(gen);
    nd->num_nodes_source = "--generate";
    if (gen.feature_dim > 0) {
      nd->feature_dim = gen.feature_dim;
      nd->feature_rows = *nd->num_nodes;
      nd->generator = &gen;
      nd->feature_source = "--generate";
    }
    if (gen.classes > 0) {
      nd->has_labels = true;
      nd->label_source = "--generate";
      nd->labels.resize(static_cast<size_t>(*nd->num_nodes));
      for (int64_t v = 0; v < *nd->num_nodes; ++v) nd->labels[v] = generated_label(gen, v);
    }
  } else if (in.format == InputFormat::kOgb) {
    read_ogb_node_data(o, in.ogb_dir, scratch, nd);
  } else if (!o.split_name.empty()) {
    throw InputError("--split: only OGB folders have named splits");
  }
  if (!o.features_npy.empty()) read_npy_features(o.features_npy, nd);
  if (!o.labels_npy.empty()) read_npy_labels(o.labels_npy, nd);
  const std::pair<const char*, const std::string*> id_files[] = {
      {"train", &o.train_ids}, {"valid", &o.valid_ids}, {"test", &o.test_ids}};
  for (const auto& [name, file] : id_files) {
    if (file->empty()) continue;
    nd->splits[name] = read_ids(*file);
    nd->split_sources[name] = *file;
  }
  if (!nd->num_nodes && nd->has_features()) {
    nd->num_nodes = nd->feature_rows;
    nd->num_nodes_source = nd->feature_source;
  }
  if (!nd->num_nodes && nd->has_labels) {
    nd->num_nodes = static_cast<int64_t>(nd->labels.size());
    nd->num_nodes_source = nd->label_source;
  }
}

// What the edge readers saw.
struct EdgesRead {
  bool weighted = false;
  int64_t max_id = -1;
  int64_t count = 0;  // as the input states them: before reverses, de-duplication, self loops
};

// An OGB folder's edge count, shipped beside its edges: a download cut at a line boundary reads
// as a smaller graph, so the `read` edges are checked against it.
void check_ogb_edge_count(const fs::path& ogb_dir, int64_t read) {
  const std::string count_file = ogb_file(ogb_dir, "raw/num-edge-list.csv");
  if (count_file.empty()) return;
  const auto counts = read_id_lines(count_file);
  if (counts.size() != 1) throw InputError(count_file + ": expected one edge count (one graph)");
  if (counts[0] != read)
    throw InputError(ogb_file(ogb_dir, "raw/edge.csv") + ": expected " + std::to_string(counts[0]) + " edges as " +
                     count_file + " says, found " + std::to_string(read));
}

// Stage 2: the edges into the sorter, each checked against the node count as it streams in (a
// Matrix Market file states the count in its size line, which then takes over).
EdgesRead read_edges(const PreprocessOptions& o, const Source& in, NodeData* nd, EdgeSorter* sorter) {
  EdgesRead read;
  int64_t limit = nd->num_nodes ? *nd->num_nodes : INT64_MAX;
  std::string limit_source = nd->num_nodes_source;
  AddEdge add;
  add.check = [&](int64_t s, int64_t d) -> std::string {
    if (s < 0 || d < 0) return "negative node id " + std::to_string(std::min(s, d));
    if (s >= limit || d >= limit)
      return limit_source.empty()
                 ? "node id " + std::to_string(std::max(s, d)) + " too large: node ids must be 0..N-1"
                 : "node id " + std::to_string(std::max(s, d)) + " out of range: " + limit_source + " gives " +
                       std::to_string(limit) + " nodes";
    return std::string();
  };
  add.add = [&](int64_t s, int64_t d, float w) {
    read.max_id = std::max(read.max_id, std::max(s, d));
    ++read.count;
    sorter->add(s, d, w);
    if (o.undirected && s != d) sorter->add(d, s, w);
  };
  if (in.generating) {
    const GeneratorSpec& gen = in.gen;
    read.weighted = gen.weights;
    generate_edges(gen, [&](int64_t s, int64_t d) {
      ++read.count;
      const float w = gen.weights ? generated_weight(gen, s, d) : 1.0f;
      sorter->add(s, d, w);
      if (s != d) sorter->add(d, s, w);  // generated graphs are undirected
    });
    read.max_id = *nd->num_nodes - 1;
  } else if (in.format == InputFormat::kOgb) {
    int columns = 2;  // OGB edge files are "src,dst"
    read_edge_list(ogb_file(in.ogb_dir, "raw/edge.csv"), &columns, add);
    check_ogb_edge_count(in.ogb_dir, read.count);
  } else if (in.format == InputFormat::kMatrixMarket) {
    read.count = read_matrix_market(o.inputs[0], &read.weighted, nd, add, [&] {
      limit = *nd->num_nodes;
      limit_source = nd->num_nodes_source;
    });
  } else if (in.format == InputFormat::kNpy) {
    const std::string file = !o.edges_npy.empty() ? o.edges_npy : o.inputs.at(0);
    read_npy_edges(file, o.weights_npy, add);
    read.weighted = !o.weights_npy.empty();
  } else {
    int columns = 0;
    for (const auto& file : o.inputs) read_edge_list(file, &columns, add);
    read.weighted = columns == 3;
  }
  return read;
}

// The node count: the one the input states, else the largest edge id + 1.
int64_t node_count(const NodeData& nd, const EdgesRead& read) {
  const int64_t n = nd.num_nodes ? *nd.num_nodes : read.max_id + 1;
  if (n <= 0) throw InputError("preprocess: the graph has no nodes");
  // Ids are positions 0..N-1. Sparse ids (hashes, timestamps) would make a CSR mostly of empty
  // rows, or an allocation that cannot succeed; the user should renumber or state N.
  if (!nd.num_nodes && n > (int64_t{1} << 26) && n / 64 > read.count)
    throw InputError("preprocess: largest node id " + std::to_string(read.max_id) + " is far above the " +
                     std::to_string(read.count) + " edges read: node ids must be 0..N-1 (renumber them, or give --num-nodes)");
  return n;
}

// Stage 3: the node arrays agree with the node count, and the splits are in range and disjoint (a
// node trained on and evaluated on would inflate every figure).
void check_node_arrays(NodeData* nd, int64_t n) {
  const std::string count_source = nd->num_nodes_source.empty() ? "largest edge id + 1" : nd->num_nodes_source;
  if (nd->has_features() && nd->feature_rows != n)
    throw InputError(nd->feature_source + ": " + std::to_string(nd->feature_rows) + " feature rows for " + std::to_string(n) +
                     " nodes (" + count_source + ")");
  if (nd->has_labels && static_cast<int64_t>(nd->labels.size()) != n)
    throw InputError(nd->label_source + ": " + std::to_string(nd->labels.size()) + " labels for " + std::to_string(n) +
                     " nodes (" + count_source + ")");
  std::vector<const std::string*> split_of(nd->splits.size() > 1 ? static_cast<size_t>(n) : 0, nullptr);
  for (const auto& [name, ids] : nd->splits) {
    for (size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] >= n)
        throw InputError(id_location(nd->split_sources[name], k) + "node id " + std::to_string(ids[k]) +
                         " out of range for " + std::to_string(n) + " nodes");
      if (split_of.empty()) continue;
      const std::string*& owner = split_of[static_cast<size_t>(ids[k])];
      if (owner != nullptr && *owner != name)
        throw InputError(id_location(nd->split_sources[name], k) + "node id " + std::to_string(ids[k]) + " is in split '" +
                         name + "' and in split '" + *owner + "' (" + nd->split_sources[*owner] +
                         "); expected disjoint splits");
      owner = &name;
    }
  }
}

// A random split of the labelled nodes when the input has none, drawn over input ids before any
// relabelling, so every order gets the same one and --relabel hot can use it.
void draw_random_split(const PreprocessOptions& o, int64_t n, NodeData* nd) {
  if (!nd->has_labels || !nd->splits.empty()) return;
  std::vector<int64_t> labelled;
  for (int64_t v = 0; v < n; ++v)
    if (nd->labels[v] >= 0) labelled.push_back(v);
  kernels::CounterRng rng(kernels::derive_key(o.seed, 0x5b11));
  for (int64_t i = static_cast<int64_t>(labelled.size()) - 1; i > 0; --i)
    std::swap(labelled[i], labelled[rng.below(static_cast<uint64_t>(i + 1))]);
  const auto total = static_cast<double>(labelled.size());
  const auto n_train = static_cast<size_t>(std::llround(total * o.train_fraction));
  const auto n_valid = std::min(labelled.size() - n_train, static_cast<size_t>(std::llround(total * o.valid_fraction)));
  nd->splits["train"].assign(labelled.begin(), labelled.begin() + n_train);
  nd->splits["valid"].assign(labelled.begin() + n_train, labelled.begin() + n_train + n_valid);
  nd->splits["test"].assign(labelled.begin() + n_train + n_valid, labelled.end());
}

// The graph in stored order.
struct StoredGraph {
  CsrSpill csr;
  std::vector<int64_t> original;  // stored id -> input id; empty without a relabelling
  std::vector<int32_t> part;      // each stored node's part, with --relabel partition

  int64_t input_id(int64_t stored) const { return original.empty() ? stored : original[stored]; }
};

// Where the CSR's sorts run: the edges they may hold in memory, the folder of their sorted runs,
// and the store's temporary folder for the drained CSR's raw files.
struct SortPlace {
  uint64_t mem_budget;
  fs::path runs;
  fs::path scratch;
};

// Numbers the nodes in the order `less` sorts the input ids (ties in input order) and builds the
// graph again under the new ids, every edge re-sorted.
template <typename Less>
void renumber(StoredGraph* g, int64_t n, bool weighted, const SortPlace& place, Less less, PreprocessReport* report) {
  CsrSpill& csr = g->csr;
  std::vector<int64_t>& original = g->original;
  original.resize(static_cast<size_t>(n));
  std::iota(original.begin(), original.end(), 0);
  std::stable_sort(original.begin(), original.end(), less);
  std::vector<int64_t> stored(static_cast<size_t>(n));
  for (int64_t s = 0; s < n; ++s) stored[original[s]] = s;
  EdgeSorter again(place.mem_budget, place.runs);
  File fi = open_temp(csr.indices_file, "rb");
  File fw = weighted ? open_temp(csr.weights_file, "rb") : nullptr;
  for (int64_t d = 0; d < n; ++d) {
    for (int64_t k = csr.indptr[d]; k < csr.indptr[d + 1]; ++k) {
      int64_t s;
      float w = 1.0f;
      if (std::fread(&s, sizeof(s), 1, fi.get()) != 1 || (fw && std::fread(&w, sizeof(w), 1, fw.get()) != 1))
        throw ResourceError(csr.indices_file.string() + ": short read of temporary edge files");
      again.add(stored[s], stored[d], w);
    }
  }
  fi.reset();
  fw.reset();
  csr = drain(&again, n, false, false, weighted, place.scratch);
  report->sorted_runs = std::max(report->sorted_runs, again.runs());
}

// Stage 4: the CSR, and with --relabel degree / hot / partition a second pass in the new order.
StoredGraph build_graph(const PreprocessOptions& o, const NodeData& nd, EdgeSorter* sorter, int64_t n, bool weighted,
                        const SortPlace& place, PreprocessReport* report) {
  StoredGraph g;
  g.csr = drain(sorter, n, o.dedup, o.self_loops == SelfLoops::kRemove, weighted, place.scratch);
  report->sorted_runs = sorter->runs();
  const std::vector<int64_t>& indptr = g.csr.indptr;  // the input order's, read while renumbering
  auto in_degree = [&indptr](int64_t v) { return indptr[v + 1] - indptr[v]; };
  if (o.relabel == Relabel::kDegree) {
    renumber(&g, n, weighted, place, [&](int64_t a, int64_t b) { return in_degree(a) > in_degree(b); }, report);
  } else if (o.relabel == Relabel::kHot) {
    // Every epoch reads each training node's row (it is a seed) and the high-degree rows (sampled
    // as neighbours); validation rows at each evaluation. So: training nodes, then validation
    // nodes, then the rest, each group by decreasing in-degree.
    std::vector<uint8_t> group(static_cast<size_t>(n), 2);
    if (auto it = nd.splits.find("valid"); it != nd.splits.end())
      for (int64_t v : it->second) group[static_cast<size_t>(v)] = 1;
    if (auto it = nd.splits.find("train"); it != nd.splits.end())
      for (int64_t v : it->second) group[static_cast<size_t>(v)] = 0;
    renumber(&g, n, weighted, place, [&](int64_t a, int64_t b) {
      if (group[a] != group[b]) return group[a] < group[b];
      return in_degree(a) > in_degree(b);
    }, report);
  } else if (o.relabel == Relabel::kPartition) {
    // Partition the graph as read (its indices from the temporary file, as int32), then number the
    // nodes part by part; the cut does not depend on the numbering.
    require_int32_nodes(n);
    std::vector<int32_t> indices(static_cast<size_t>(g.csr.nnz));
    size_t next = 0;
    for_raw_chunks(g.csr.indices_file, g.csr.nnz, [&](const int64_t* values, size_t m) {
      for (size_t i = 0; i < m; ++i) indices[next++] = static_cast<int32_t>(values[i]);
    });
    const kernels::CsrView graph{n, n, g.csr.indptr.data(), indices.data(), nullptr};
    const std::vector<int32_t> input_part = partition_graph(graph, o.partitions, o.mem_budget, o.seed, &report->partition_method);
    report->partition_cut = edge_cut(graph, input_part.data());
    indices = {};
    renumber(&g, n, weighted, place, [&](int64_t a, int64_t b) { return input_part[a] < input_part[b]; }, report);
    g.part.resize(static_cast<size_t>(n));
    for (int64_t s = 0; s < n; ++s) g.part[static_cast<size_t>(s)] = input_part[static_cast<size_t>(g.original[s])];
  }
  return g;
}

// The graph's arrays (the raw temporary files become graph/indices.npy and graph/weights.npy,
// int32 ids when the node count allows) and its counts in the manifest.
void write_topology(StoreWriter& writer, const CsrSpill& csr, int64_t n, bool weighted) {
  const bool narrow = n < (int64_t{1} << 31);
  writer.write_array("graph/indptr.npy", DType::kI64, {n + 1}, csr.indptr.data());
  NpyWriter& w = writer.begin_array("graph/indices.npy", narrow ? DType::kI32 : DType::kI64, {csr.nnz});
  copy_raw(csr.indices_file, csr.nnz, narrow, &w);
  writer.end_array("graph/indices.npy");
  fs::remove(csr.indices_file);
  if (weighted) {
    NpyWriter& ww = writer.begin_array("graph/weights.npy", DType::kF32, {csr.nnz});
    copy_raw_floats(csr.weights_file, csr.nnz, &ww);
    writer.end_array("graph/weights.npy");
    fs::remove(csr.weights_file);
  }
  Manifest& m = writer.manifest();
  m.num_nodes = n;
  m.num_edges = csr.nnz;
  m.weighted = weighted;
}

// partition.npy over stored ids: the relabelling's parts, else a partition of the indices just
// written (mapped, not copied).
void write_partition(const PreprocessOptions& o, StoreWriter& writer, StoredGraph* g, int64_t n, PreprocessReport* report) {
  if (g->part.empty()) {
    require_int32_nodes(n);
    const fs::path indices_file = writer.temp_dir() / "graph/indices.npy";
    const MappedArray indices(indices_file, read_npy_header(indices_file.string()));
    const kernels::CsrView graph{n, n, g->csr.indptr.data(), indices.as<int32_t>(), nullptr};
    g->part = partition_graph(graph, o.partitions, o.mem_budget, o.seed, &report->partition_method);
    report->partition_cut = edge_cut(graph, g->part.data());
  }
  writer.write_array("partition.npy", DType::kI32, {n}, g->part.data());
  Manifest& m = writer.manifest();
  m.num_partitions = o.partitions;
  m.partition_method = report->partition_method;
}

// Stage 5: features.npy, row by row in stored order, in parallel chunks written sequentially; every
// value finite and within the stored dtype's range.
void write_features(const PreprocessOptions& o, const NodeData& nd, const StoredGraph& g, int64_t n, StoreWriter& writer) {
  const int64_t d = nd.feature_dim;
  NpyWriter& w = writer.begin_array("features.npy", o.feature_dtype, {n, d});
  const int64_t chunk = std::max<int64_t>(1, (int64_t{8} << 20) / (d * 4));
  std::vector<float> rows;
  std::vector<char> out;
  const size_t item = dtype_size(o.feature_dtype);
  // The largest value the stored dtype holds (f16: 65504); beyond it a value would become inf.
  const float largest = o.feature_dtype == DType::kF16 ? 65504.0f : std::numeric_limits<float>::max();
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t end = std::min(n, begin + chunk);
    rows.resize(static_cast<size_t>((end - begin) * d));
    out.resize(rows.size() * item);
    std::atomic<int64_t> bad_row{n};  // the first input row with a value that is not finite there
    tbb::parallel_for(tbb::blocked_range<int64_t>(begin, end, 256), [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t s = r.begin(); s < r.end(); ++s) {
        const int64_t v = g.input_id(s);
        float* row = rows.data() + (s - begin) * d;
        nd.feature_row(v, row);
        for (int64_t k = 0; k < d; ++k) {
          if (std::fabs(row[k]) <= largest) continue;  // false for NaN too
          for (int64_t seen = bad_row.load(); v < seen && !bad_row.compare_exchange_weak(seen, v);) {
          }
          break;
        }
        if (o.normalize_features_row) {
          // As PyG's examples: x / x.sum(1).clamp(min=1), summed in double in column order.
          double sum = 0;
          for (int64_t k = 0; k < d; ++k) sum += row[k];
          const float denom = static_cast<float>(std::max(sum, 1.0));
          for (int64_t k = 0; k < d; ++k) row[k] /= denom;
        }
        convert_from_f32(o.feature_dtype, row, out.data() + (s - begin) * d * item, static_cast<size_t>(d));
      }
    });
    if (bad_row.load() < n) {
      std::vector<float> row(static_cast<size_t>(d));
      nd.feature_row(bad_row.load(), row.data());
      int64_t k = 0;
      while (k + 1 < d && std::fabs(row[k]) <= largest) ++k;
      throw InputError(nd.feature_source + ": expected finite features" +
                       (o.feature_dtype == DType::kF16 ? " within float16's range (--feature-dtype)" : "") + ", found " +
                       std::to_string(row[k]) + " at node " + std::to_string(bad_row.load()) + ", column " +
                       std::to_string(k));
    }
    w.write(out.data(), out.size());
  }
  writer.end_array("features.npy");
  if (!nd.text_file.empty()) fs::remove(nd.text_file);  // the mapping stays valid until unmapped
  Manifest& m = writer.manifest();
  m.feature_dim = d;
  m.feature_dtype = dtype_name(o.feature_dtype);
}

// labels.npy in stored order; class ids 0 .. C-1.
void write_labels(const NodeData& nd, const StoredGraph& g, int64_t n, StoreWriter& writer) {
  std::vector<int32_t> labels(static_cast<size_t>(n));
  int32_t max_label = -1;
  for (int64_t s = 0; s < n; ++s) {
    labels[s] = nd.labels[g.input_id(s)];
    max_label = std::max(max_label, labels[s]);
  }
  if (max_label < 0) throw InputError(nd.label_source + ": no node is labelled (every label is -1)");
  // One far beyond the node count is a wrong column or a sentinel, and would size the model's last
  // layer by it.
  if (max_label >= std::max<int64_t>(n, 1 << 16))
    throw InputError(nd.label_source + ": expected class ids 0 .. C-1 with C at most " +
                     std::to_string(std::max<int64_t>(n, 1 << 16)) + ", found " + std::to_string(max_label));
  writer.write_array("labels.npy", DType::kI32, {n}, labels.data());
  writer.manifest().num_classes = max_label + 1;
}

// splits/<name>.npy in stored ids (sorted, each id once), and relabel.npy (stored id -> input id)
// when the nodes were numbered anew.
void write_splits_and_relabelling(const PreprocessOptions& o, const NodeData& nd, const StoredGraph& g, int64_t n,
                                  StoreWriter& writer) {
  Manifest& m = writer.manifest();
  std::vector<int64_t> stored_of;
  if (!g.original.empty()) {
    stored_of.resize(static_cast<size_t>(n));
    for (int64_t s = 0; s < n; ++s) stored_of[g.original[s]] = s;
  }
  for (const auto& [name, ids] : nd.splits) {
    std::vector<int64_t> out(ids);
    if (!stored_of.empty())
      for (auto& v : out) v = stored_of[v];
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    writer.write_array("splits/" + name + ".npy", DType::kI64, {static_cast<int64_t>(out.size())}, out.data());
    m.splits[name] = static_cast<int64_t>(out.size());
  }
  if (g.original.empty()) return;
  writer.write_array("relabel.npy", DType::kI64, {n}, g.original.data());
  m.relabelled = true;
  m.relabel_order = o.relabel == Relabel::kDegree ? "degree" : o.relabel == Relabel::kHot ? "hot" : "partition";
}

}  // namespace

PreprocessReport preprocess(const PreprocessOptions& o) {
  const Source in = check_options(o);
  PreprocessReport report;
  report.format = in.generating ? "generated " + in.gen.kind : format_name(in.format);
  // Fails early (before any parsing) when the store exists without --force.
  StoreWriter writer(o.output, o.overwrite);
  const SortPlace place{o.mem_budget, o.temp_dir.empty() ? writer.temp_dir().parent_path() : fs::path(o.temp_dir),
                        writer.temp_dir()};

  NodeData nd;
  read_node_data(o, in, writer.temp_dir(), &nd);
  EdgeSorter sorter(o.mem_budget, place.runs);
  const EdgesRead read = read_edges(o, in, &nd, &sorter);
  report.input_edges = read.count;
  const int64_t n = node_count(nd, read);
  check_node_arrays(&nd, n);
  draw_random_split(o, n, &nd);

  StoredGraph g = build_graph(o, nd, &sorter, n, read.weighted, place, &report);
  write_topology(writer, g.csr, n, read.weighted);
  report.num_nodes = n;
  report.num_edges = g.csr.nnz;
  if (o.partitions > 0) write_partition(o, writer, &g, n, &report);
  if (nd.has_features()) write_features(o, nd, g, n, writer);
  if (nd.has_labels) write_labels(nd, g, n, writer);
  write_splits_and_relabelling(o, nd, g, n, writer);
  writer.commit();
  return report;
}

}  // namespace gale::storage

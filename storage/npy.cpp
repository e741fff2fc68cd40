#include "storage/npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "kernels/error.hpp"
#include "storage/page_sums.hpp"
#include "storage/text_reader.hpp"

namespace gale::storage {

int64_t NpyHeader::count() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// A failed system call on `path`: a full disk or quota is a resource the user can free
// (ResourceError), anything else is reported against the file (InputError).
[[noreturn]] void throw_io(const std::string& path, const char* what, int err) {
  const std::string msg = path + ": " + what + ": " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) throw ResourceError(msg);  // out of room: exit 4
  throw InputError(msg);
}

// NumPy descr for each stored dtype; bf16 has none and travels as '<u2'.
std::string descr_of(DType t) {
  switch (t) {
    case DType::kF32: return "<f4";
    case DType::kF16: return "<f2";
    case DType::kBF16: return "<u2";
    case DType::kF64: return "<f8";
    case DType::kI32: return "<i4";
    case DType::kI64: return "<i8";
    case DType::kU8: return "|u1";
  }
  return "";
}

bool dtype_of(const std::string& descr, DType* out) {
  static const std::pair<const char*, DType> kDescr[] = {
      {"<f4", DType::kF32}, {"<f2", DType::kF16}, {"<u2", DType::kBF16}, {"<f8", DType::kF64},
      {"<i4", DType::kI32}, {"<i8", DType::kI64}, {"|u1", DType::kU8},  {"<u1", DType::kU8}};
  for (const auto& [d, t] : kDescr) {
    if (descr == d) {
      *out = t;
      return true;
    }
  }
  return false;
}

// NumPy writes headers of a few hundred bytes; far beyond that is damage, not an array.
constexpr size_t kMaxNpyHeaderBytes = size_t{1} << 20;

// Value text of `key` in a NumPy header dict ("{'descr': '<f4', 'fortran_order': False, ...}").
std::string dict_value(const std::string& dict, const std::string& key, const std::string& path) {
  const std::string quoted = "'" + key + "'";
  size_t p = dict.find(quoted);
  if (p == std::string::npos) throw InputError(path + ": npy header has no '" + key + "' entry");
  p = dict.find(':', p + quoted.size());
  if (p == std::string::npos) throw InputError(path + ": malformed npy header near '" + key + "'");
  ++p;
  while (p < dict.size() && dict[p] == ' ') ++p;
  size_t end;
  if (dict[p] == '\'') {
    end = dict.find('\'', p + 1);
    if (end == std::string::npos) throw InputError(path + ": malformed npy header near '" + key + "'");
    return dict.substr(p + 1, end - p - 1);
  }
  if (dict[p] == '(') {
    end = dict.find(')', p);
    if (end == std::string::npos) throw InputError(path + ": malformed npy shape");
    return dict.substr(p, end - p + 1);
  }
  end = dict.find_first_of(",}", p);
  return dict.substr(p, end - p);
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

namespace {

// The fixed bytes before a header's dict: where the dict starts and how long it is.
struct NpyPrefix {
  size_t bytes = 0;       // magic, version and the length field: 10 (v1) or 12 (v2, v3)
  size_t header_len = 0;  // the dict's length, padding included, as the file states it
};

// Reads the magic, the version and the dict's length (u16 in v1, u32 in v2 and v3).
NpyPrefix read_npy_prefix(std::istream& in, const std::string& path) {
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw InputError(path + ": not a NumPy .npy file (bad magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  NpyPrefix p;
  if (major == 1) {
    unsigned char len[2];
    if (!in.read(reinterpret_cast<char*>(len), 2)) throw InputError(path + ": truncated npy header");
    p.header_len = len[0] | (static_cast<size_t>(len[1]) << 8);
    p.bytes = 10;
  } else if (major == 2 || major == 3) {
    unsigned char len[4];
    if (!in.read(reinterpret_cast<char*>(len), 4)) throw InputError(path + ": truncated npy header");
    p.header_len = len[0] | (static_cast<size_t>(len[1]) << 8) | (static_cast<size_t>(len[2]) << 16) |
                   (static_cast<size_t>(len[3]) << 24);
    p.bytes = 12;
  } else {
    throw InputError(path + ": unsupported npy format version " + std::to_string(major));
  }
  return p;
}

// Reads the header's dict text after `prefix`, checking its stated length first, and that it is a
// dict literal.
std::string read_npy_dict(std::istream& in, const std::string& path, const NpyPrefix& prefix) {
  const size_t header_len = prefix.header_len;
  // The length comes from the file: check it against the file's size (and NumPy's own headers, a
  // few hundred bytes) before allocating it, so a damaged length is an error, not gigabytes.
  std::error_code size_error;
  const uint64_t file_size = std::filesystem::file_size(path, size_error);
  if (size_error || prefix.bytes + header_len > file_size)
    throw InputError(path + ": truncated npy header (it says " + std::to_string(header_len) + " bytes, the file has " +
                     std::to_string(size_error ? 0 : file_size) + ")");
  if (header_len > kMaxNpyHeaderBytes)
    throw InputError(path + ": npy header of " + std::to_string(header_len) + " bytes; expected at most " +
                     std::to_string(kMaxNpyHeaderBytes));
  std::string dict(header_len, '\0');
  if (!in.read(dict.data(), static_cast<std::streamsize>(header_len))) throw InputError(path + ": truncated npy header");

  // NumPy's own reader takes a Python dict literal and nothing else: "{...}" then padding.
  const size_t open_brace = dict.find_first_not_of(' ');
  const size_t close_brace = dict.find_last_not_of(" \n");
  if (open_brace == std::string::npos || dict[open_brace] != '{' || dict[close_brace] != '}')
    throw InputError(path + ": expected the npy header to be a dict literal {...}, found '" + quote_token(dict) + "'");
  return dict;
}

// The element type a header's descr names ('<u4' only for page sums, read back as kI32).
DType npy_dtype(const std::string& descr, bool page_sums, const std::string& path) {
  DType t = DType::kF32;
  if (page_sums && descr == kPageSumsDescr) {
    t = DType::kI32;
  } else if (!dtype_of(descr, &t)) {
    const std::string hint = !descr.empty() && descr[0] == '>' ? "; convert with arr.astype(arr.dtype.newbyteorder('<'))" : "";
    throw InputError(path + ": expected a little-endian <f4, <f2, <f8, <i4, <i8, |u1 or <u2 (bf16) array, found dtype '" +
                     descr + "'" + hint);
  }
  return t;
}

// The fortran_order entry's value text, as a flag.
bool npy_fortran_order(const std::string& fortran, const std::string& path) {
  if (fortran.find("True") != std::string::npos) return true;
  if (fortran.find("False") == std::string::npos)
    throw InputError(path + ": expected fortran_order True or False in the npy header, found '" + fortran + "'");
  return false;
}

// The shape entry's tuple text ("(2, 3)", "(5,)", "()") as its dimensions.
std::vector<int64_t> npy_shape(const std::string& shape, const std::string& path) {
  std::vector<int64_t> dims;
  for (size_t p = 1; p < shape.size();) {
    while (p < shape.size() && (shape[p] == ' ' || shape[p] == ',')) ++p;
    if (p >= shape.size() || shape[p] == ')') break;
    size_t end = p;
    while (end < shape.size() && std::isdigit(static_cast<unsigned char>(shape[end]))) ++end;
    // 18 digits fit an int64 with room to spare; longer is never a real array.
    if (end == p || end - p > 18) throw InputError(path + ": expected a shape of non-negative integers, found " + shape);
    dims.push_back(std::stoll(shape.substr(p, end - p)));
    p = end;
  }
  return dims;
}

// The element count and byte size must fit in 63 bits, or later size arithmetic wraps.
// `shape_entry`: the shape's text in the header, for the message.
void check_addressable(const NpyHeader& h, const std::string& shape_entry, const std::string& path) {
  int64_t bytes = static_cast<int64_t>(dtype_size(h.dtype));
  for (int64_t d : h.shape) {
    if (d != 0 && bytes > std::numeric_limits<int64_t>::max() / d)
      throw InputError(path + ": npy shape " + shape_entry + " is too large to address");
    bytes *= d;
  }
}

}  // namespace

NpyHeader read_npy_header(const std::string& path, bool page_sums) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open: " + std::strerror(errno));
  const NpyPrefix prefix = read_npy_prefix(in, path);
  const std::string dict = read_npy_dict(in, path, prefix);
  NpyHeader h;
  h.data_offset = prefix.bytes + prefix.header_len;
  h.descr = dict_value(dict, "descr", path);
  h.dtype = npy_dtype(h.descr, page_sums, path);
  h.fortran_order = npy_fortran_order(dict_value(dict, "fortran_order", path), path);
  const std::string shape = dict_value(dict, "shape", path);
  h.shape = npy_shape(shape, path);
  check_addressable(h, shape, path);
  if (h.fortran_order && h.shape.size() > 1)
    throw InputError(path + ": Fortran-ordered arrays are not supported (save with numpy.ascontiguousarray)");
  return h;
}

struct NpyWriter::Impl {
  std::string path;
  int fd = -1;
  XXH64_state_t* hash = nullptr;
  XXH32_state_t* page_hash = nullptr;  // the page being filled, when it is not yet whole
  size_t page_fill = 0;                // bytes of the current page hashed so far
  std::vector<uint32_t> page_sums;     // not yet sent to sums_sink (all of them without one)
  NpyWriter* sums_sink = nullptr;
  uint64_t expected = 0;   // data bytes
  uint64_t written = 0;
  uint64_t size = 0;
  uint64_t digest = 0;
  std::string buffer;
  bool finished = false;

  // 8 MiB: large enough that write() costs nothing per call, small enough to never matter.
  static constexpr size_t kBufferBytes = size_t{8} << 20;

  void write_all(const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw_io(path, "write failed", errno);
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  void flush() {
    write_all(buffer.data(), buffer.size());
    buffer.clear();
  }
  // Sums are sent once 1024 of them (4 MiB of file) are waiting: the sink's buffer makes the
  // 4 KiB writes free, and memory stays flat however large the array (a single write() of many
  // pages adds at most its own size / 1024).
  static constexpr size_t kSumsBatch = 1024;
  void send_sums() {
    if (sums_sink == nullptr || page_sums.empty()) return;
    sums_sink->write(page_sums.data(), page_sums.size() * sizeof(uint32_t));
    page_sums.clear();
  }
  // Feeds the page sums: whole pages in one XXH32 call each, a partial page through the state.
  void sum_pages(const char* p, size_t n) {
    if (sums_sink != nullptr && page_sums.size() >= kSumsBatch) send_sums();
    if (page_fill > 0) {
      const size_t take = std::min(n, kPageSumPage - page_fill);
      XXH32_update(page_hash, p, take);
      page_fill += take;
      p += take;
      n -= take;
      if (page_fill < kPageSumPage) return;
      page_sums.push_back(XXH32_digest(page_hash));
      page_fill = 0;
    }
    for (; n >= kPageSumPage; p += kPageSumPage, n -= kPageSumPage) page_sums.push_back(page_sum(p, kPageSumPage));
    if (n > 0) {
      XXH32_reset(page_hash, 0);
      XXH32_update(page_hash, p, n);
      page_fill = n;
    }
  }
  void put(const void* data, size_t bytes) {
    XXH64_update(hash, data, bytes);
    sum_pages(static_cast<const char*>(data), bytes);
    size += bytes;
    if (buffer.size() + bytes < kBufferBytes) {
      buffer.append(static_cast<const char*>(data), bytes);
      return;
    }
    // A large write goes straight from the caller's memory: copying a whole feature matrix
    // into the buffer would double its footprint.
    flush();
    if (bytes >= kBufferBytes) write_all(static_cast<const char*>(data), bytes);
    else buffer.append(static_cast<const char*>(data), bytes);
  }
};

NpyWriter::NpyWriter(const std::string& path, DType stored, std::vector<int64_t> shape)
    : NpyWriter(path, descr_of(stored), dtype_size(stored), std::move(shape)) {}

NpyWriter::NpyWriter(const std::string& path, const std::string& descr, size_t item_size, std::vector<int64_t> shape)
    : impl_(new Impl) {
  impl_->path = path;
  impl_->fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (impl_->fd < 0) {
    const int err = errno;
    delete impl_;
    throw_io(path, "cannot create", err);
  }
  impl_->hash = XXH64_createState();
  impl_->page_hash = XXH32_createState();
  if (impl_->hash == nullptr || impl_->page_hash == nullptr) {
    ::close(impl_->fd);
    if (impl_->hash) XXH64_freeState(impl_->hash);
    if (impl_->page_hash) XXH32_freeState(impl_->page_hash);
    delete impl_;
    throw ResourceError(path + ": out of memory for the xxHash states");
  }
  XXH64_reset(impl_->hash, 0);
  uint64_t count = 1;
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    count *= static_cast<uint64_t>(shape[i]);
    dims += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dims += ",";
    if (i + 1 < shape.size()) dims += " ";
  }
  impl_->expected = count * item_size;
  // v1.0 header: magic, version, little-endian u16 length, dict padded with spaces and '\n' so the
  // data begins exactly at kNpyDataAlignment.
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t header_len = kNpyDataAlignment - 10;
  GALE_ASSERT(dict.size() < header_len);
  dict.resize(header_len - 1, ' ');
  dict += '\n';
  std::string head = "\x93NUMPY";
  head += '\x01';
  head += '\x00';
  head += static_cast<char>(header_len & 0xff);
  head += static_cast<char>((header_len >> 8) & 0xff);
  head += dict;
  impl_->put(head.data(), head.size());
}

NpyWriter::~NpyWriter() {
  if (impl_->fd >= 0) ::close(impl_->fd);
  if (impl_->hash) XXH64_freeState(impl_->hash);
  if (impl_->page_hash) XXH32_freeState(impl_->page_hash);
  delete impl_;
}

void NpyWriter::write(const void* data, size_t bytes) {
  impl_->written += bytes;
  if (impl_->written > impl_->expected)
    throw InternalError(impl_->path + ": more data written than the header's shape holds");
  impl_->put(data, bytes);
}

void NpyWriter::finish() {
  if (impl_->finished) return;
  if (impl_->written != impl_->expected)
    throw InternalError(impl_->path + ": wrote " + std::to_string(impl_->written) + " data bytes, header says " +
                        std::to_string(impl_->expected));
  impl_->flush();
  // fsync before the store's rename: the rename must never become durable before the data.
  if (::fsync(impl_->fd) != 0) throw_io(impl_->path, "fsync failed", errno);
  const int fd = impl_->fd;
  impl_->fd = -1;   // closed even when close() reports an error; never retried
  if (::close(fd) != 0) throw_io(impl_->path, "close failed", errno);
  impl_->digest = XXH64_digest(impl_->hash);
  if (impl_->page_fill > 0) impl_->page_sums.push_back(XXH32_digest(impl_->page_hash));  // the short last page
  impl_->page_fill = 0;
  impl_->send_sums();
  impl_->finished = true;
}

uint64_t NpyWriter::file_size() const { return impl_->size; }
uint64_t NpyWriter::xxh64() const { return impl_->digest; }
const std::vector<uint32_t>& NpyWriter::page_sums() const { return impl_->page_sums; }

void NpyWriter::send_page_sums_to(NpyWriter* sums) {
  GALE_ASSERT(!impl_->finished && impl_->sums_sink == nullptr);
  impl_->sums_sink = sums;
}

}  // namespace gale::storage

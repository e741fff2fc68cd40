#include "storage/text_reader.hpp"

#include <zlib.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/error.hpp"

namespace gale::storage {

namespace {
constexpr size_t kChunk = 1 << 20;
}

LineReader::LineReader(const std::string& path) : path_(path), buf_(kChunk) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw InputError(path + ": cannot open: " + std::strerror(errno ? errno : ENOENT));
  gzbuffer(f, 1 << 18);
  gz_ = f;
}

std::string quote_token(std::string_view token) {
  constexpr size_t kMost = 40;
  std::string out;
  for (size_t i = 0; i < token.size() && i < kMost; ++i) {
    const auto c = static_cast<unsigned char>(token[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  if (token.size() > kMost) out += "...";
  return out;
}

std::string first_bytes(const std::string& path, size_t n) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return "";
  std::string out(n, '\0');
  const int got = gzread(f, out.data(), static_cast<unsigned>(n));
  gzclose(f);
  out.resize(got > 0 ? static_cast<size_t>(got) : 0);
  return out;
}

LineReader::~LineReader() {
  if (gz_) gzclose(static_cast<gzFile>(gz_));
}

bool LineReader::fill() {
  if (eof_) return false;
  const int n = gzread(static_cast<gzFile>(gz_), buf_.data(), static_cast<unsigned>(buf_.size()));
  int err = Z_OK;
  const char* msg = gzerror(static_cast<gzFile>(gz_), &err);
  if (n < 0 || (err != Z_OK && err != Z_STREAM_END)) {
    // zlib reports a stream cut short as Z_BUF_ERROR ("unexpected end of file").
    if (err == Z_BUF_ERROR) throw InputError(path_ + ": truncated or corrupt gzip stream (unexpected end of file)");
    throw InputError(path_ + ": truncated or corrupt gzip stream (" + std::string(msg ? msg : "read error") + ")");
  }
  begin_ = 0;
  end_ = static_cast<size_t>(n);
  if (n == 0) eof_ = true;
  return n > 0;
}

bool LineReader::next(std::string_view* line) {
  carry_.clear();
  for (;;) {
    if (begin_ == end_ && !fill()) {
      if (carry_.empty()) return false;
      break;  // last line without a newline
    }
    const char* start = buf_.data() + begin_;
    const void* nl = std::memchr(start, '\n', end_ - begin_);
    if (nl != nullptr) {
      const size_t len = static_cast<const char*>(nl) - start;
      if (carry_.empty()) {
        *line = std::string_view(start, len);
      } else {
        carry_.append(start, len);
        *line = carry_;
      }
      begin_ += len + 1;
      ++line_;
      if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
      return true;
    }
    carry_.append(start, end_ - begin_);
    begin_ = end_;
  }
  ++line_;
  *line = carry_;
  if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
  return true;
}

bool LineReader::next_fields(std::vector<std::string_view>* fields) {
  std::string_view line;
  while (next(&line)) {
    split_fields(line, fields);
    if (!fields->empty()) return true;
  }
  return false;
}

void split_fields(std::string_view line, std::vector<std::string_view>* fields) {
  fields->clear();
  size_t i = 0;
  const size_t n = line.size();
  while (i < n) {
    while (i < n && (line[i] == ',' || line[i] == '\t' || line[i] == ' ')) ++i;
    if (i >= n) break;
    size_t j = i;
    while (j < n && line[j] != ',' && line[j] != '\t' && line[j] != ' ') ++j;
    fields->push_back(line.substr(i, j - i));
    i = j;
  }
}

bool parse_int64(std::string_view t, int64_t* out) {
  if (!t.empty() && t[0] == '+') t.remove_prefix(1);
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), *out);
  return ec == std::errc() && p == t.data() + t.size() && !t.empty();
}

bool parse_double(std::string_view t, double* out) {
  if (!t.empty() && t[0] == '+') t.remove_prefix(1);
  if (t.empty()) return false;
  // from_chars is locale-independent and correctly rounded, so "0.1" in a text file and 0.1 in
  // an .npy become the same float.
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), *out);
  if (ec == std::errc::result_out_of_range && p == t.data() + t.size()) {
    // Overflow and underflow: strtod gives the IEEE answer (+-inf, a subnormal or 0).
    const std::string s(t);
    *out = std::strtod(s.c_str(), nullptr);
    return true;
  }
  return ec == std::errc() && p == t.data() + t.size();
}

}  // namespace gale::storage

// storage/text_reader.hpp — line-by-line reading of plain or gzip-compressed text with line
// numbers, so every parse error can name "file:line".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gale::storage {

class LineReader {
 public:
  // Opens `path` (gzip detected from its magic bytes; plain files pass through). Throws
  // InputError naming the file when it cannot be opened.
  explicit LineReader(const std::string& path);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // Next line without its '\n' or "\r\n"; false at the end. Throws InputError naming the file
  // when a gzip stream is truncated or corrupt.
  bool next(std::string_view* line);
  // Next non-blank line split by split_fields; false at the end. The views live until the next call.
  bool next_fields(std::vector<std::string_view>* fields);
  int64_t line_number() const { return line_; }
  const std::string& path() const { return path_; }
  // "path:line: " for messages.
  std::string where() const { return path_ + ":" + std::to_string(line_) + ": "; }

 private:
  bool fill();

  std::string path_;
  void* gz_ = nullptr;  // gzFile
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
  bool eof_ = false;
  int64_t line_ = 0;
  std::string carry_;
};

// Splits a data line on commas, tabs and spaces (runs of separators count once).
void split_fields(std::string_view line, std::vector<std::string_view>* fields);
// The first `n` bytes of a file, gunzipped when it is gzip (fewer when the file is shorter; "" when
// it cannot be read: the reader proper reports that).
std::string first_bytes(const std::string& path, size_t n);

// A token as an error message quotes it: at most 40 bytes (then "..."), bytes outside printable
// ASCII as \xNN, so a binary file or a runaway token still gives one short line.
std::string quote_token(std::string_view token);

// Whole-token parses; false when the token is not entirely a number of that kind.
bool parse_int64(std::string_view token, int64_t* out);
bool parse_double(std::string_view token, double* out);

}  // namespace gale::storage

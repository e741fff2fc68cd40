// tests/storage/test_files.hpp — temporary directories and input files for storage tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "storage/npy.hpp"

namespace gale::storage::testing {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("gale-" + std::string(info->test_suite_name()) + "-" + info->name() + "-" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

inline void write_gz(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
}

template <typename T>
void write_npy(const std::string& path, DType dtype, std::vector<int64_t> shape, const std::vector<T>& data) {
  NpyWriter w(path, dtype, std::move(shape));
  w.write(data.data(), data.size() * sizeof(T));
  w.finish();
}

// What `fn` throws (its message), or "(no error)".
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Every file of two stores, byte for byte.
inline void expect_identical_stores(const std::string& a, const std::string& b) {
  std::vector<std::string> files_a, files_b;
  for (const auto& e : fs::recursive_directory_iterator(a))
    if (e.is_regular_file()) files_a.push_back(fs::relative(e.path(), a).string());
  for (const auto& e : fs::recursive_directory_iterator(b))
    if (e.is_regular_file()) files_b.push_back(fs::relative(e.path(), b).string());
  std::sort(files_a.begin(), files_a.end());
  std::sort(files_b.begin(), files_b.end());
  ASSERT_EQ(files_a, files_b);
  for (const auto& f : files_a) EXPECT_TRUE(read_bytes(a + "/" + f) == read_bytes(b + "/" + f)) << f << " differs";
}

// No store and no temporary directory left beside `store`.
inline void expect_nothing_left(const std::string& store) {
  EXPECT_FALSE(fs::exists(store)) << store;
  for (const auto& e : fs::directory_iterator(fs::path(store).parent_path())) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name.find(".tmp") == std::string::npos && name.find(".gale-sort") == std::string::npos) << name;
  }
}

}  // namespace gale::storage::testing

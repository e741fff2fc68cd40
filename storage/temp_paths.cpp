#include "storage/temp_paths.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <system_error>

namespace gale::storage {

namespace fs = std::filesystem;

namespace {

std::recursive_mutex& temps_mutex() {
  static std::recursive_mutex m;
  return m;
}
std::set<fs::path>& temps() {
  static std::set<fs::path> s;
  return s;
}

// The host name with anything but [A-Za-z0-9.] replaced, so it never brings a '-' or a '/'.
std::string host_tag() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "host";
  std::string h(buf);
  for (char& c : h)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.')) c = '_';
  return h;
}

}  // namespace

void register_temp(const fs::path& path) {
  std::lock_guard<std::recursive_mutex> lock(temps_mutex());
  temps().insert(path);
}

void unregister_temp(const fs::path& path) {
  std::lock_guard<std::recursive_mutex> lock(temps_mutex());
  temps().erase(path);
}

std::unique_lock<std::recursive_mutex> lock_temps() { return std::unique_lock<std::recursive_mutex>(temps_mutex()); }

int remove_registered_temps(std::unique_lock<std::recursive_mutex>& held) {
  if (!held.owns_lock()) held = lock_temps();
  int n = 0;
  for (const fs::path& p : temps()) {
    // Another thread may still be writing a file into it: retry a few times on ENOTEMPTY.
    for (int attempt = 0; attempt < 20; ++attempt) {
      std::error_code ec;
      fs::remove_all(p, ec);
      if (!ec && !fs::exists(p, ec)) break;
    }
    ++n;
  }
  temps().clear();
  return n;
}

std::string temp_name(const std::string& prefix) {
  std::random_device rd;
  char rnd[17];
  std::snprintf(rnd, sizeof(rnd), "%08x%08x", rd(), rd());
  return prefix + host_tag() + "-" + std::to_string(::getpid()) + "-" + rnd;
}

void remove_stale_temps(const fs::path& dir, const std::string& prefix, const fs::path& store) {
  const std::string mine = prefix + host_tag() + "-";
  std::error_code ec;
  const bool store_in_place = !store.empty() && fs::exists(store / "manifest.json", ec);
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, mine.size(), mine) != 0) continue;
    const size_t dash = name.find('-', mine.size());
    if (dash == std::string::npos || dash == mine.size()) continue;
    int64_t pid = 0;
    bool digits = true;
    for (size_t i = mine.size(); i < dash; ++i) {
      if (name[i] < '0' || name[i] > '9' || pid > (int64_t{1} << 40)) { digits = false; break; }
      pid = pid * 10 + (name[i] - '0');
    }
    if (!digits || pid <= 0 || pid == ::getpid()) continue;
    if (!store_in_place) {
      if (name.size() >= 4 && name.compare(name.size() - 4, 4, ".old") == 0) continue;
      if (fs::exists(it->path() / "manifest.json", ec)) continue;
    }
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    std::error_code ignore;
    fs::remove_all(it->path(), ignore);
  }
}

}  // namespace gale::storage

#include "storage/host_memory.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <system_error>
#include <vector>

#include "kernels/cuda/budget.hpp"

namespace gale::storage {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> read_text(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

// The whole of `text` as a decimal number, or nothing (empty, signs, trailing junk, overflow).
std::optional<uint64_t> parse_u64(const std::string& text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

std::optional<uint64_t> read_u64(const fs::path& path) {
  const auto text = read_text(path);
  if (!text) return std::nullopt;
  return parse_u64(trim(*text));
}

// A memory limit file: nothing when missing or malformed, 0 for "no limit" (v2 "max", v1's huge
// page-rounded 2^63), else the limit in bytes.
std::optional<uint64_t> read_limit(const fs::path& path) {
  const auto text = read_text(path);
  if (!text) return std::nullopt;
  const std::string value = trim(*text);
  if (value == "max") return uint64_t{0};
  const auto bytes = parse_u64(value);
  if (!bytes) return std::nullopt;
  return *bytes >= kCgroupV1Unlimited ? 0 : *bytes;
}

std::vector<std::string> split(const std::string& s, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, separator)) parts.push_back(part);
  return parts;
}

bool has_token(const std::string& list, const std::string& token, char separator) {
  for (const auto& t : split(trim(list), separator))
    if (t == token) return true;
  return false;
}

uint64_t read_mem_available(const fs::path& root) {
  const auto text = read_text(root / "proc/meminfo");
  if (!text) return 0;
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    std::string number, unit;
    fields >> number >> unit;
    const auto value = parse_u64(number);
    if (!value) return 0;
    if (unit.empty() || unit == "B") return *value;
    if (unit == "kB" && *value <= UINT64_MAX / 1024) return *value * 1024;
    return 0;
  }
  return 0;
}

// One hierarchy: where it is mounted (under root) and which cgroup directory it mounts there.
struct Mount {
  fs::path point;          // root / the mount point
  std::string root = "/";  // the cgroup path the mount shows at `point` (mountinfo field 4)
};

struct Mounts {
  std::optional<Mount> v2;
  std::optional<Mount> v1_memory;
};

// mountinfo: "ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS".
Mounts find_mounts(const fs::path& root) {
  Mounts found;
  if (const auto text = read_text(root / "proc/self/mountinfo")) {
    std::istringstream in(*text);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::vector<std::string> f;
      for (std::string w; fields >> w;) f.push_back(w);
      const auto dash = std::find(f.begin(), f.end(), "-");
      if (f.size() < 5 || dash == f.end() || dash + 1 == f.end()) continue;
      const std::string& type = *(dash + 1);
      const std::string super = dash + 3 < f.end() ? *(dash + 3) : std::string();
      Mount m{root / fs::path(f[4]).relative_path(), f[3]};
      if (type == "cgroup2" && !found.v2) found.v2 = m;
      if (type == "cgroup" && has_token(super, "memory", ',') && !found.v1_memory) found.v1_memory = m;
    }
    return found;
  }
  // No mountinfo: the usual places (unified, or hybrid with v2 under unified/).
  const fs::path base = root / "sys/fs/cgroup";
  std::error_code ec;
  if (fs::exists(base / "cgroup.controllers", ec)) found.v2 = Mount{base};
  else if (fs::exists(base / "unified/cgroup.controllers", ec)) found.v2 = Mount{base / "unified"};
  if (fs::is_directory(base / "memory", ec)) found.v1_memory = Mount{base / "memory"};
  return found;
}

// The directory of cgroup `path` under mount `m`; the mount point itself when the path is outside
// what the mount shows or not visible (a container without a cgroup namespace).
fs::path cgroup_dir(const Mount& m, const std::string& path) {
  std::string relative = path;
  if (m.root != "/") {
    if (path == m.root) relative = "/";
    else if (path.rfind(m.root + "/", 0) == 0) relative = path.substr(m.root.size());
    else return m.point;
  }
  fs::path dir = m.point;
  for (const auto& part : split(relative, '/'))
    if (!part.empty() && part != "." && part != "..") dir /= part;
  std::error_code ec;
  return fs::is_directory(dir, ec) ? dir : m.point;
}

// Walks from `dir` up to the mount point: the tightest limit of the cgroup and its ancestors,
// with the usage of the cgroup that sets it (or of `dir` when none does).
// The page cache of a cgroup: memory.stat's active_file + inactive_file (v1: the total_ ones,
// which count the cgroup's descendants as usage_in_bytes does), never more than `usage`.
uint64_t read_page_cache(const fs::path& dir, bool v1, uint64_t usage) {
  const auto text = read_text(dir / "memory.stat");
  if (!text) return 0;
  const std::string active = v1 ? "total_active_file" : "active_file";
  const std::string inactive = v1 ? "total_inactive_file" : "inactive_file";
  uint64_t bytes = 0;
  std::istringstream in(*text);
  std::string key, value;
  while (in >> key >> value) {
    if (key != active && key != inactive) continue;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
    if (end != nullptr && *end == '\0') bytes += v;
  }
  return std::min(bytes, usage);
}

void read_limits(const Mount& m, const fs::path& dir, bool v1, HostMemory* out) {
  const char* limit_file = v1 ? "memory.limit_in_bytes" : "memory.max";
  const char* usage_file = v1 ? "memory.usage_in_bytes" : "memory.current";
  out->cgroup_usage = read_u64(dir / usage_file).value_or(0);
  out->cgroup_page_cache = read_page_cache(dir, v1, out->cgroup_usage);
  fs::path d = dir;
  const size_t top = m.point.native().size();
  for (int depth = 0; depth < 64; ++depth) {
    const uint64_t limit = read_limit(d / limit_file).value_or(0);
    if (limit > 0 && (out->cgroup_limit == 0 || limit < out->cgroup_limit)) {
      out->cgroup_limit = limit;
      out->cgroup_usage = read_u64(d / usage_file).value_or(0);
      out->cgroup_page_cache = read_page_cache(d, v1, out->cgroup_usage);
    }
    if (d.native().size() <= top || !d.has_parent_path()) break;
    d = d.parent_path();
  }
}

}  // namespace

HostMemory detect_host_memory(const fs::path& root) {
  HostMemory m;
  m.mem_available = read_mem_available(root);

  std::string v2_path, v1_path;
  bool have_v2 = false, have_v1 = false;
  if (const auto text = read_text(root / "proc/self/cgroup")) {
    std::istringstream in(*text);
    std::string line;
    while (std::getline(in, line)) {
      const auto a = line.find(':');
      const auto b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) continue;
      const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
      const std::string path = trim(line.substr(b + 1));
      if (id == "0" && controllers.empty()) {
        v2_path = path;
        have_v2 = true;
      } else if (has_token(controllers, "memory", ',')) {
        v1_path = path;
        have_v1 = true;
      }
    }
  }
  const Mounts mounts = find_mounts(root);
  std::error_code ec;
  if (have_v2 && mounts.v2) {
    const fs::path dir = cgroup_dir(*mounts.v2, v2_path);
    // A hybrid machine mounts v2 without the memory controller, which stays with v1.
    const auto controllers = read_text(mounts.v2->point / "cgroup.controllers");
    if (fs::exists(dir / "memory.max", ec) || (controllers && has_token(*controllers, "memory", ' '))) {
      m.cgroup_version = 2;
      m.cgroup_path = v2_path;
      read_limits(*mounts.v2, dir, /*v1=*/false, &m);
      return m;
    }
  }
  if (have_v1 && mounts.v1_memory) {
    const fs::path dir = cgroup_dir(*mounts.v1_memory, v1_path);
    if (fs::exists(dir / "memory.limit_in_bytes", ec)) {
      m.cgroup_version = 1;
      m.cgroup_path = v1_path;
      read_limits(*mounts.v1_memory, dir, /*v1=*/true, &m);
    }
  }
  return m;
}

uint64_t default_host_budget(const HostMemory& m) {
  uint64_t figure = m.mem_available;
  if (m.cgroup_limit > 0) {
    const uint64_t used = m.cgroup_usage - std::min(m.cgroup_page_cache, m.cgroup_usage);
    const uint64_t headroom = m.cgroup_limit > used ? m.cgroup_limit - used : 0;
    figure = figure == 0 ? headroom : std::min(figure, headroom);
  }
  const uint64_t reserve = std::max(kHostReserveMin, figure / kHostReserveDivisor);
  return figure > reserve ? figure - reserve : 0;
}

std::string describe(const HostMemory& m) {
  using kernels::cuda::format_bytes;
  std::string s = m.mem_available > 0 ? "MemAvailable " + format_bytes(m.mem_available) : "MemAvailable unknown";
  if (m.cgroup_version == 0) return s + ", no cgroup memory controller found";
  s += ", cgroup v" + std::to_string(m.cgroup_version);
  if (m.cgroup_limit == 0) return s + " no limit";
  return s + " limit " + format_bytes(m.cgroup_limit) + " (" + format_bytes(m.cgroup_usage) + " used" +
         (m.cgroup_page_cache > 0 ? ", " + format_bytes(m.cgroup_page_cache) + " of it page cache)" : ")");
}

std::unique_ptr<kernels::cuda::MemoryBudget> make_host_budget(uint64_t bytes, const std::string& text, int sharing) {
  if (bytes > 0) return std::make_unique<kernels::cuda::MemoryBudget>(bytes, "--host-mem-budget", text);
  const HostMemory memory = detect_host_memory();
  const uint64_t share = static_cast<uint64_t>(std::max(1, sharing));
  const uint64_t limit = default_host_budget(memory) / share;
  if (limit == 0 && memory.mem_available == 0 && memory.cgroup_limit == 0)
    return std::make_unique<kernels::cuda::MemoryBudget>(kernels::cuda::MemoryBudget::kUnlimited, "--host-mem-budget",
                                                         "unlimited (neither MemAvailable nor a cgroup limit could be read)");
  return std::make_unique<kernels::cuda::MemoryBudget>(
      limit, "--host-mem-budget",
      kernels::cuda::format_bytes(limit) + " (the default: " + describe(memory) + ", less a reserve" +
          (share > 1 ? ", shared by the run's " + std::to_string(share) + " processes on this host" : std::string()) + ")");
}

}  // namespace gale::storage

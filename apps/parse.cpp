#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <iostream>

#include "apps/commands.hpp"
#include "engine/devices.hpp"
#include "engine/local_processes.hpp"
#include "engine/processes.hpp"
#include "kernels/error.hpp"
#include "sampler/neighbor_sampler.hpp"
#include "storage/text_reader.hpp"

namespace gale::apps {

namespace po = boost::program_options;

bool parse_command_line(const std::vector<std::string>& args, const po::options_description& desc,
                        const po::positional_options_description& pos, po::variables_map* vm, bool notify) {
  po::store(po::command_line_parser(args).options(desc).positional(pos).run(), *vm);
  if (vm->count("help")) {
    std::cout << desc << '\n';
    return false;
  }
  if (notify) po::notify(*vm);
  return true;
}

bool parse_store_command_line(const std::vector<std::string>& args, const po::options_description& desc,
                              po::variables_map* vm) {
  po::positional_options_description pos;
  pos.add("store", 1);
  return parse_command_line(args, desc, pos, vm);
}

uint64_t parse_size(const std::string& text, const std::string& flag) {
  uint64_t value = 0;
  const char* begin = text.data();
  const char* end = begin + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr == begin)
    throw InputError(flag + ": expected a size such as 512M or 16G, found '" + text + "'");
  uint64_t scale = 1;
  std::string suffix(ptr, end);
  for (auto& ch : suffix) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (suffix == "" || suffix == "B") scale = 1;
  else if (suffix == "K" || suffix == "KB" || suffix == "KIB") scale = 1ULL << 10;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB") scale = 1ULL << 20;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB") scale = 1ULL << 30;
  else if (suffix == "T" || suffix == "TB" || suffix == "TIB") scale = 1ULL << 40;
  else throw InputError(flag + ": unknown size suffix '" + suffix + "' in '" + text + "' (expected K, M, G or T)");
  return value * scale;
}

std::string option_error_text(const boost::program_options::error& e, const std::vector<std::string>& texts) {
  const auto* named = dynamic_cast<const boost::program_options::error_with_option_name*>(&e);
  const bool risky =
      named != nullptr && std::any_of(texts.begin(), texts.end(), [](const std::string& t) { return t.find('%') != std::string::npos; });
  if (!risky) return e.what();
  std::string name = named->get_option_name();
  std::replace(name.begin(), name.end(), '%', '?');
  return "option '" + storage::quote_token(name) + "' or its value is invalid (a '%' in the text keeps the details out)";
}

storage::IoEngine parse_io_engine(const std::string& text) {
  if (text == "auto") return storage::IoEngine::kAuto;
  if (text == "io_uring") return storage::IoEngine::kUring;
  if (text == "pread") return storage::IoEngine::kPread;
  throw InputError("--io-engine: expected auto, io_uring or pread, found '" + text + "'");
}

uint64_t parse_host_budget(const std::string& text) {
  const uint64_t bytes = parse_size(text, "--host-mem-budget");
  if (bytes == 0) throw InputError("--host-mem-budget: expected a positive size such as 8G");
  return bytes;
}

double parse_duration(const std::string& text, const std::string& flag) {
  const auto bad = [&] {
    return InputError(flag + ": expected seconds or a duration such as 90, 30s, 10m or 2h, found '" + text + "'");
  };
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw bad();
  }
  const std::string suffix = text.substr(used);
  double scale = 0;
  if (suffix.empty() || suffix == "s") scale = 1;
  else if (suffix == "m") scale = 60;
  else if (suffix == "h") scale = 3600;
  if (scale == 0 || !(value >= 0) || !std::isfinite(value) || std::isspace(static_cast<unsigned char>(text[0]))) throw bad();
  return value * scale;
}

std::vector<int> parse_int_list(const std::string& text, const std::string& flag) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int value = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (ec != std::errc() || ptr != item.data() + item.size() || item.empty())
      throw InputError(flag + ": expected comma-separated integers such as 15,10,5, found '" + text + "'");
    out.push_back(value);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::vector<int> parse_fanouts(const std::string& text) {
  std::vector<int> fanouts = parse_int_list(text, "--fanouts");
  sampler::validate_fanouts(fanouts);
  return fanouts;
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "auto") return engine::default_device();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    int ordinal = -1;
    const char* begin = text.data() + 5;
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(begin, end, ordinal);
    if (ec == std::errc() && ptr == end && begin != end && ordinal >= 0) return Device::cuda(ordinal);
  }
  throw InputError("--device: expected cpu, cuda, cuda:N or auto, found '" + text + "'");
}

std::vector<std::string> split_list(const std::string& text, char separator) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= text.size();) {
    const size_t end = std::min(text.find(separator, at), text.size());
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

int parse_processes(const std::string& text, const std::vector<Device>& devices, bool full_graph) {
  if (engine::Processes::launched() && !engine::local::started_by_launcher())
    throw InputError("--processes: this run was started by mpirun, which starts the processes itself; use one of them");
  const bool gpus = !devices.empty() && devices.front().is_cuda();
  int count = 0;
  if (text == "per-gpu") {
    if (!gpus) throw InputError("--processes per-gpu: one process per GPU needs --gpus (this run trains on the CPU)");
    count = static_cast<int>(devices.size());
  } else {
    const char* end = text.data() + text.size();
    const auto [at, ec] = std::from_chars(text.data(), end, count);
    if (ec != std::errc() || at != end || count < 1 || count > 1024)
      throw InputError("--processes: expected a number of processes (1 to 1024) or per-gpu, found '" + text + "'");
  }
  if (count > 1 && full_graph)
    throw InputError("--processes " + text + ": several processes train mini-batches (give --fanouts); a full-graph "
                     "run trains in one");
  if (gpus && devices.size() % static_cast<size_t>(count) != 0)
    throw InputError("--processes " + text + ": the " + std::to_string(devices.size()) + " GPUs of --gpus do not "
                     "divide among " + std::to_string(count) + " processes");
  return count;
}

bool asks_for_several_gpus(const std::string& gpus, const std::string& processes) {
  if (engine::Processes::launched()) return true;  // one process of a run of several (mpirun's, gale's)
  if (gpus.empty()) return false;
  if (!processes.empty() && processes != "1") return true;  // it starts processes, which inherit the choice
  if (gpus != "all") return split_list(gpus, ',').size() > 1;
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) return split_list(visible, ',').size() > 1;
  std::error_code ec;  // the driver's list of the machine's GPUs
  const std::filesystem::directory_iterator listed("/proc/driver/nvidia/gpus", ec);
  return !ec && std::distance(listed, std::filesystem::directory_iterator()) > 1;
}

std::vector<Device> parse_workers(const std::string& gpus, int cpu_workers, bool workers_given, bool device_given,
                                  Device* device) {
  std::vector<Device> devices;
  if (!gpus.empty()) {
    if (workers_given) throw InputError("--gpus and --workers: choose one (--workers is for the CPU)");
    if (device_given && !device->is_cuda()) throw InputError("--gpus: needs GPUs, but --device is " + device->name());
    if (gpus == "all") {
      const int count = engine::gpu_count();
      if (count == 0) throw DeviceError("--gpus all: no CUDA device on this machine");
      for (int g = 0; g < count; ++g) devices.push_back(Device::cuda(g));
    } else {
      for (int g : parse_int_list(gpus, "--gpus")) {
        if (g < 0) throw InputError("--gpus: expected all or GPU numbers such as 0,1, found '" + gpus + "'");
        if (std::find(devices.begin(), devices.end(), Device::cuda(g)) != devices.end())
          throw InputError("--gpus " + gpus + ": GPU " + std::to_string(g) + " is listed twice");
        devices.push_back(Device::cuda(g));
      }
      const int count = engine::gpu_count();
      for (const Device& d : devices) {
        if (d.ordinal >= count) {
          throw DeviceError("--gpus " + gpus + ": no CUDA device " + std::to_string(d.ordinal) + " (found " +
                            std::to_string(count) + ")");
        }
      }
    }
    *device = devices.front();
  }
  if (workers_given) {
    if (cpu_workers < 1) throw InputError("--workers: expected at least 1, found " + std::to_string(cpu_workers));
    if (!device->is_cpu()) throw InputError("--workers: CPU workers need --device cpu (use --gpus on GPUs)");
    devices.assign(static_cast<size_t>(cpu_workers), Device::cpu());
  }
  return devices;
}

kernels::SpmmKind parse_spmm_kind(const std::string& text) {
  if (text == "auto") return kernels::SpmmKind::kAuto;
  if (text == "fused-gar" || text == "gar") return kernels::SpmmKind::kGar;
  if (text == "fused-gas" || text == "gas") return kernels::SpmmKind::kGas;
  if (text == "memory-aware") return kernels::SpmmKind::kMemoryAware;
  if (text == "tc") return kernels::SpmmKind::kTensorCore;
  if (text.rfind("sampled", 0) == 0)
    throw InputError("--spmm " + text + ": edge sampling estimates the aggregation; it is for gale predict, not training");
  throw InputError("--spmm: expected auto, fused-gar, fused-gas, memory-aware or tc, found '" + text + "'");
}

kernels::SpmmKind parse_inference_spmm(const std::string& text, int64_t* sample_width, kernels::SpmmSampling* sampling) {
  if (text.rfind("sampled", 0) != 0) return parse_spmm_kind(text);
  const std::vector<std::string> parts = split_list(text, ':');
  const std::string expected = "--spmm: expected sampled:S or sampled:S:fastrand|bucket with S from 1 to " +
                               std::to_string(kernels::kSpmmMaxSample) + ", found '" + text + "'";
  if (parts.size() < 2 || parts.size() > 3 || parts[0] != "sampled") throw InputError(expected);
  int64_t s = 0;
  const char* end = parts[1].data() + parts[1].size();
  const auto [ptr, ec] = std::from_chars(parts[1].data(), end, s);
  if (ec != std::errc() || ptr != end || parts[1].empty() || s < 1 || s > kernels::kSpmmMaxSample)
    throw InputError(expected);
  *sample_width = s;
  *sampling = kernels::SpmmSampling::kFastRand;
  if (parts.size() == 3) {
    if (parts[2] == "bucket") {
      *sampling = kernels::SpmmSampling::kBucket;
    } else if (parts[2] != "fastrand") {
      throw InputError(expected);
    }
  }
  return kernels::SpmmKind::kSampled;
}

}  // namespace gale::apps

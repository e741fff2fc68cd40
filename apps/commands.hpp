// apps/commands.hpp — one function per `gale` subcommand; each returns the exit code and throws
// gale::Error (or a Boost.Program_options error) for main() to report.
#pragma once

#include "storage/disk_reader.hpp"

#include <boost/program_options.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/device.hpp"
#include "kernels/spmm.hpp"

namespace gale::apps {

int run_preprocess(const std::vector<std::string>& args);
int run_info(const std::vector<std::string>& args);
int run_train(const std::vector<std::string>& args);

// What a Boost.Program_options error says. Its what() fills %placeholders% into a template until
// none is left, and never ends when the user's own text (an option's name or value, from the
// command line or a --config file) holds one (found by fuzzing the --config reader): `texts` are
// those words; when one holds a '%', the message is Gale's own, with the option's name quoted.
std::string option_error_text(const boost::program_options::error& e, const std::vector<std::string>& texts);
int run_predict(const std::vector<std::string>& args);
int run_bench(const std::vector<std::string>& args);
int run_bench_train(const std::vector<std::string>& args);  // `gale bench train`
int run_bench_io(const std::vector<std::string>& args);     // `gale bench io`
// `gale bench sample|gather|pipeline` (apps/cmd_bench_minibatch.cpp): `name` is the benchmark.
int run_bench_minibatch(const std::string& name, const std::vector<std::string>& args);

// Parses `args` into `vm` (positional names from `pos`); prints `desc` and returns false for
// --help. With `notify`, runs the options' notifiers (pass false to merge a config file first).
bool parse_command_line(const std::vector<std::string>& args, const boost::program_options::options_description& desc,
                        const boost::program_options::positional_options_description& pos,
                        boost::program_options::variables_map* vm, bool notify = true);

// The same for a command whose one positional argument is its STORE (the option "store").
bool parse_store_command_line(const std::vector<std::string>& args,
                              const boost::program_options::options_description& desc,
                              boost::program_options::variables_map* vm);

// "16G", "512M", "1024" -> bytes; throws InputError naming `flag`.
uint64_t parse_size(const std::string& text, const std::string& flag);
// --io-engine: auto | io_uring | pread (InputError naming the flag otherwise).
storage::IoEngine parse_io_engine(const std::string& text);
// --host-mem-budget SIZE: a positive size (InputError naming the flag otherwise).
uint64_t parse_host_budget(const std::string& text);
// Seconds from "90", "90s", "10m" or "2h" (a fraction allowed, >= 0); InputError naming `flag` else.
double parse_duration(const std::string& text, const std::string& flag);
// "a,b,,c" -> {"a", "b", "", "c"} (empty items kept, for the caller to reject by name).
std::vector<std::string> split_list(const std::string& text, char separator = ',');
// "15,10,5" -> {15, 10, 5}; throws InputError naming `flag`.
std::vector<int> parse_int_list(const std::string& text, const std::string& flag);
// --fanouts 15,10,5: one per hop, each positive or -1 (every neighbour); InputError naming the flag.
std::vector<int> parse_fanouts(const std::string& text);
// --device: "cpu", "cuda" (GPU 0), "cuda:N", or "auto" (the first GPU when present, else the CPU).
Device parse_device(const std::string& text);
// --gpus all|0,1,... and --workers N (CPU): the data-parallel workers' devices, or {} for one worker.
// `device` is --device as parsed; with --gpus it becomes the first GPU. device_given: --device was
// on the command line. Throws InputError naming the flag (DeviceError for --gpus all without GPUs).
std::vector<Device> parse_workers(const std::string& gpus, int cpu_workers, bool workers_given, bool device_given,
                                  Device* device);
// Whether a run's --gpus and --processes (as written) and its environment make it train on several
// GPUs: two or more listed, `all` on a machine with several (counted without starting CUDA: from
// CUDA_VISIBLE_DEVICES, else the driver's /proc list), processes to start, or this process started
// by mpirun or by gale's launcher (engine::Processes::launched). Decided before CUDA starts, for
// engine::load_kernels_eagerly.
bool asks_for_several_gpus(const std::string& gpus, const std::string& processes);
// --processes N|per-gpu: how many processes the run starts on this host (per-gpu: one per device of
// --gpus); N must divide --gpus' devices. full_graph: the run trains on the whole graph, which takes
// one process. Throws InputError naming the flag, also under mpirun (which starts the processes).
int parse_processes(const std::string& text, const std::vector<Device>& devices, bool full_graph);
// --spmm: "auto", "fused-gar", "fused-gas" (the training kernels; "cusparse" is a benchmark baseline only).
kernels::SpmmKind parse_spmm_kind(const std::string& text);
// `gale predict`'s --spmm: parse_spmm_kind's kinds, or `sampled:S[:fastrand|:bucket]` (ES-SpMM's
// edge-sampled estimate, S from 1 to kernels::kSpmmMaxSample) into *sample_width and *sampling.
kernels::SpmmKind parse_inference_spmm(const std::string& text, int64_t* sample_width, kernels::SpmmSampling* sampling);

}  // namespace gale::apps

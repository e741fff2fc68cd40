// `gale preprocess`: options -> storage::PreprocessOptions -> storage::preprocess.
#include <boost/program_options.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "apps/commands.hpp"
#include "apps/stop_cleanup.hpp"
#include "kernels/error.hpp"
#include "storage/host_features.hpp"
#include "storage/host_memory.hpp"
#include "storage/preprocess.hpp"
#include "storage/store.hpp"

namespace gale::apps {

namespace po = boost::program_options;

namespace {

// The flags as given, before they become storage::PreprocessOptions (the ones that map straight
// onto a field are bound to `o` itself).
struct PreprocessFlags {
  storage::PreprocessOptions o;
  std::string format = "auto", feature_dtype = "f32", relabel = "none", self_loops = "remove";
  std::string normalize, mem_budget = "8G", split_fractions = "0.1,0.1", partitions;
  int64_t num_nodes = -1;
  bool keep_duplicates = false;
};

po::options_description describe_preprocess_flags(PreprocessFlags* f) {
  po::options_description desc(
      "usage: gale preprocess INPUT... -o STORE [options]\n"
      "       gale preprocess --generate rmat:scale=S,edge-factor=E | sbm:nodes=N,classes=C,... -o STORE\n\n"
      "options");
  desc.add_options()
      ("help,h", "show this help")
      ("output,o", po::value(&f->o.output), "store directory to create (NAME.gale)")
      ("force", po::bool_switch(&f->o.overwrite), "replace an existing store")
      ("format", po::value(&f->format), "auto | edgelist | ogb | mtx | npy")
      ("edges", po::value(&f->o.edges_npy), "edges as .npy, shape (2,E) as PyG's edge_index or (E,2); 2 x 2 reads as (2,E)")
      ("weights", po::value(&f->o.weights_npy), "edge weights as .npy (E floats in --edges' order, as PyG's edge_weight)")
      ("features", po::value(&f->o.features_npy), "node features as .npy (N x D)")
      ("labels", po::value(&f->o.labels_npy), "node labels as .npy (N), -1 = unlabelled")
      ("train-ids", po::value(&f->o.train_ids), "training node ids (.npy or one id per line)")
      ("valid-ids", po::value(&f->o.valid_ids), "validation node ids")
      ("test-ids", po::value(&f->o.test_ids), "test node ids")
      ("num-nodes", po::value(&f->num_nodes), "node count (default: largest id + 1)")
      ("undirected", po::bool_switch(&f->o.undirected), "add the reverse of every edge")
      ("keep-duplicates", po::bool_switch(&f->keep_duplicates), "keep repeated edges")
      ("self-loops", po::value(&f->self_loops), "remove | keep (layers add their own self terms)")
      ("normalize-features", po::value(&f->normalize), "row: divide each feature row by its sum")
      ("feature-dtype", po::value(&f->feature_dtype), "f32 | f16 | bf16")
      ("relabel", po::value(&f->relabel), "none | degree (order nodes by in-degree) | hot (training nodes, then "
                                       "validation nodes, then the rest, each by in-degree: for features on disk) | "
                                       "partition (number the nodes part by part, with --partitions P)")
      ("split", po::value(&f->o.split_name), "OGB split folder name (default: the only one)")
      ("split-fractions", po::value(&f->split_fractions), "random split when the input has none: TRAIN,VALID")
      ("seed", po::value(&f->o.seed), "seed for random splits and generators")
      ("partitions", po::value(&f->partitions), "split the nodes into P parts (partition.npy): METIS, or the "
                                             "LDG streaming partitioner when METIS's input exceeds --mem-budget")
      ("mem-budget", po::value(&f->mem_budget), "memory for sorting edges and partitioning; larger inputs sort on "
                                             "disk and partition by streaming")
      ("temp-dir", po::value(&f->o.temp_dir), "where sorted runs go (default: beside the store)")
      ("generate", po::value(&f->o.generate), "rmat:scale=S,edge-factor=E[,a=,b=,c=,seed=,classes=C,feature-dim=D,weights=none|uniform] | "
                                           "sbm:nodes=N,classes=C,avg-degree=D,feature-dim=F[,homophily=,order=random|class,seed=,"
                                           "weights=none|uniform]")
      ("input", po::value(&f->o.inputs), "input files or folder");
  return desc;
}

// --partitions P: a positive int32 count.
int parse_partitions(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long p = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || p < 1 || p > INT32_MAX)
    throw InputError("--partitions: expected a positive part count, found '" + text + "'");
  return static_cast<int>(p);
}

// --split-fractions TRAIN,VALID: fractions of the labelled nodes, summing to at most 1.
void parse_split_fractions(const std::string& text, storage::PreprocessOptions* o) {
  const size_t comma = text.find(',');
  char* end = nullptr;
  const std::string a = text.substr(0, comma);
  o->train_fraction = std::strtod(a.c_str(), &end);
  const bool ok_a = !a.empty() && *end == '\0';
  const std::string b = comma == std::string::npos ? "" : text.substr(comma + 1);
  o->valid_fraction = std::strtod(b.c_str(), &end);
  const bool ok_b = !b.empty() && *end == '\0';
  // Written so that NaN fails every comparison into an error.
  if (!ok_a || !ok_b || !(o->train_fraction > 0) || !(o->valid_fraction >= 0) || !(o->train_fraction + o->valid_fraction <= 1))
    throw InputError("--split-fractions: expected TRAIN,VALID fractions summing to at most 1, found '" + text + "'");
}

// The named choices and sizes, each refused by name when it is not one of them.
void apply_flags(const PreprocessFlags& f, const po::variables_map& vm, storage::PreprocessOptions* o) {
  if (o->output.empty()) throw InputError("-o/--output: expected the store path to create");
  if (f.format == "auto") o->format = storage::InputFormat::kAuto;
  else if (f.format == "edgelist") o->format = storage::InputFormat::kEdgeList;
  else if (f.format == "ogb") o->format = storage::InputFormat::kOgb;
  else if (f.format == "mtx") o->format = storage::InputFormat::kMatrixMarket;
  else if (f.format == "npy") o->format = storage::InputFormat::kNpy;
  else throw InputError("--format: expected auto, edgelist, ogb, mtx or npy, found '" + f.format + "'");
  if (!parse_dtype(f.feature_dtype, &o->feature_dtype) ||
      !(o->feature_dtype == DType::kF32 || o->feature_dtype == DType::kF16 || o->feature_dtype == DType::kBF16))
    throw InputError("--feature-dtype: expected f32, f16 or bf16, found '" + f.feature_dtype + "'");
  if (f.relabel == "none") o->relabel = storage::Relabel::kNone;
  else if (f.relabel == "degree") o->relabel = storage::Relabel::kDegree;
  else if (f.relabel == "hot") o->relabel = storage::Relabel::kHot;
  else if (f.relabel == "partition") o->relabel = storage::Relabel::kPartition;
  else throw InputError("--relabel: expected none, degree, hot or partition, found '" + f.relabel + "'");
  if (f.self_loops == "remove") o->self_loops = storage::SelfLoops::kRemove;
  else if (f.self_loops == "keep") o->self_loops = storage::SelfLoops::kKeep;
  else throw InputError("--self-loops: expected remove or keep, found '" + f.self_loops + "'");
  if (!f.normalize.empty() && f.normalize != "row")
    throw InputError("--normalize-features: expected row, found '" + f.normalize + "'");
  o->normalize_features_row = f.normalize == "row";
  o->dedup = !f.keep_duplicates;
  if (f.num_nodes >= 0) o->num_nodes = f.num_nodes;
  else if (vm.count("num-nodes")) throw InputError("--num-nodes: expected a non-negative count");
  o->mem_budget = parse_size(f.mem_budget, "--mem-budget");
  if (vm.count("partitions")) o->partitions = parse_partitions(f.partitions);
  parse_split_fractions(f.split_fractions, o);
  if (o->inputs.empty() && o->generate.empty() && o->edges_npy.empty())
    throw InputError("preprocess: expected INPUT files, --edges e.npy or --generate SPEC");
}

// The summary lines, and a note when the features will not fit this machine's default host budget
// (the store then trains from disk, where hottest-first rows read fewer pages; gale info says it
// for any budget).
void report(const storage::PreprocessOptions& o, const storage::PreprocessReport& r) {
  std::printf("wrote %s: %lld nodes, %lld edges (%s, %lld input edges%s)\n", o.output.c_str(),
              static_cast<long long>(r.num_nodes), static_cast<long long>(r.num_edges), r.format.c_str(),
              static_cast<long long>(r.input_edges),
              r.sorted_runs > 1 ? (", sorted on disk in " + std::to_string(r.sorted_runs) + " runs").c_str() : "");
  if (o.partitions > 0)
    std::printf("partitioned into %d parts (%s), edge cut %lld of %lld edges\n", o.partitions,
                r.partition_method.c_str(), static_cast<long long>(r.partition_cut), static_cast<long long>(r.num_edges));
  const storage::Store written = storage::Store::open(o.output);
  const std::string advice = storage::row_order_advice(written);
  if (written.has_features() && !advice.empty() &&
      storage::in_memory_feature_need(written) > storage::default_host_budget(storage::detect_host_memory()))
    std::printf("note: the features exceed this machine's default --host-mem-budget; %s\n", advice.c_str());
}

}  // namespace

int run_preprocess(const std::vector<std::string>& args) {
  const StopCleanup stop_cleanup;  // a stop signal removes the temporary store and sorted runs
  PreprocessFlags f;
  const po::options_description desc = describe_preprocess_flags(&f);
  po::positional_options_description pos;
  pos.add("input", -1);
  po::variables_map vm;
  if (!parse_command_line(args, desc, pos, &vm)) return 0;
  apply_flags(f, vm, &f.o);
  report(f.o, storage::preprocess(f.o));
  return 0;
}

}  // namespace gale::apps

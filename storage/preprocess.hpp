// storage/preprocess.hpp — turns user graphs into a store: importers, generators, options.
//
// Inputs: edge lists (CSV / TSV / whitespace, '#' and '%' comments, optional weight column,
// plain or .gz), the OGB node-property raw folder, Matrix Market coordinate files, NumPy arrays.
// Generators: R-MAT (Graph500 parameters) and a planted-partition graph with class-correlated
// features. Optionally partitions the nodes (METIS or LDG, storage/partition.hpp). Every path funnels edges through one EdgeSorter (in memory within the budget, else
// sorted runs on disk and a k-way merge) into a StoreWriter, so every importer gives the same
// bytes for the same graph.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/dtype.hpp"

namespace gale::storage {

enum class InputFormat { kAuto, kEdgeList, kOgb, kMatrixMarket, kNpy };
enum class SelfLoops { kRemove, kKeep };  // layers add their own self terms (GCN, GAT, GIN, SAGE)
// kDegree: nodes by decreasing in-degree. kHot: the training split's nodes first, then the
// validation split's, then the rest, each by decreasing in-degree: the rows an epoch reads for
// certain (its seeds) and most likely (hubs) lie together at the front of features.npy, for the
// disk tier. kPartition: part by part (needs partitions > 0), each
// part's nodes consecutive ids in their input order, the community order that makes a window of
// consecutive rows share its neighbours (the tensor-core SpMM's tiles, GAR's caches).
enum class Relabel { kNone, kDegree, kHot, kPartition };

struct PreprocessOptions {
  std::vector<std::string> inputs;     // positional INPUT... (edge list files, an OGB folder, .mtx)
  std::string output;                  // STORE path
  bool overwrite = false;              // --force: replace an existing store
  InputFormat format = InputFormat::kAuto;

  // NumPy inputs (--edges e.npy --features f.npy --labels l.npy), usable beside any topology
  // format for features / labels. edges: (2, E) as PyG's edge_index, or (E, 2) (a 2 x 2 array reads as (2, E)), int32 / int64.
  std::string edges_npy, features_npy, labels_npy;
  // --weights: the edges' weights (E floats, in the edge array's order, as PyG's edge_weight);
  // only with NumPy edges.
  std::string weights_npy;
  // Optional split files (one id per line or .npy of ids) overriding / supplying the split.
  std::string train_ids, valid_ids, test_ids;

  std::optional<int64_t> num_nodes;    // --num-nodes, else max id + 1 (or the format's count)
  bool undirected = false;             // add the reverse of every edge
  bool dedup = true;                   // --keep-duplicates turns it off
  SelfLoops self_loops = SelfLoops::kRemove;
  bool normalize_features_row = false; // --normalize-features row (rows sum to 1, as PyG's)
  DType feature_dtype = DType::kF32;   // f32 | f16 | bf16
  Relabel relabel = Relabel::kNone;
  std::string split_name;              // OGB: split/<name>/, default the only one
  // Random split when the input has none: fractions of labelled nodes for train and valid,
  // the rest test (--split-fractions 0.1,0.1).
  double train_fraction = 0.1, valid_fraction = 0.1;
  uint64_t seed = 0;                   // random split and generators
  uint64_t mem_budget = 8ULL << 30;    // --mem-budget: bytes of edges held in memory when sorting,
                                       // and METIS's input when partitioning (beyond it: LDG streaming)
  int partitions = 0;                  // --partitions P: write partition.npy (0 = none); see partition.hpp
  std::string temp_dir;                // where sorted runs go; default beside the output

  std::string generate;                // --generate rmat:... | sbm:...
};

// What was done, for the CLI's summary line.
struct PreprocessReport {
  int64_t num_nodes = 0;
  int64_t num_edges = 0;
  int64_t input_edges = 0;          // before de-duplication / self-loop removal / symmetrising
  int64_t sorted_runs = 0;          // > 1 when the external sort spilled to disk
  std::string format;               // the detected input format
  std::string partition_method;     // "metis", "ldg" or "single" with --partitions, else ""
  int64_t partition_cut = 0;        // edges (CSR entries, self loops excluded) between parts
};

// Builds the store. Throws InputError naming the file and line (or flag) on bad input; on any
// error, no store appears at options.output and temporary files are removed.
PreprocessReport preprocess(const PreprocessOptions& options);

}  // namespace gale::storage

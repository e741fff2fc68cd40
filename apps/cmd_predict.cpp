// `gale predict STORE --checkpoint D [--out predictions.npy] [--embeddings logits.npy]`.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>

#include "apps/commands.hpp"
#include "engine/predict.hpp"
#include "kernels/error.hpp"

namespace gale::apps {

namespace po = boost::program_options;

int run_predict(const std::vector<std::string>& args) {
  engine::PredictOptions o;
  o.out = "predictions.npy";
  po::options_description desc("usage: gale predict STORE --checkpoint DIR|FILE [options]\n\noptions");
  desc.add_options()
      ("help,h", "show this help")
      ("store", po::value(&o.store), "store directory")
      ("checkpoint", po::value(&o.checkpoint), "checkpoint file, or a directory holding best.ckpt")
      ("out", po::value(&o.out), "class per node as int32 .npy (default predictions.npy)")
      ("embeddings", po::value(&o.embeddings), "also write the logits (N x classes f32 .npy)")
      ("threads", po::value(&o.threads), "CPU threads (0: all cores)");
  po::positional_options_description pos;
  pos.add("store", 1);
  po::variables_map vm;
  if (!parse_command_line(args, desc, pos, &vm)) return 0;
  if (o.store.empty()) throw InputError("predict: expected a STORE path");
  if (o.checkpoint.empty()) throw InputError("--checkpoint: expected a checkpoint file or directory");
  const engine::PredictReport r = engine::predict(o);
  std::printf("predicted %lld nodes -> %s", static_cast<long long>(r.num_nodes), o.out.c_str());
  if (!o.embeddings.empty()) std::printf(", logits -> %s", o.embeddings.c_str());
  if (r.test_acc >= 0) std::printf(" (test_acc %.4f)", r.test_acc);
  std::printf("\n");
  return 0;
}

}  // namespace gale::apps

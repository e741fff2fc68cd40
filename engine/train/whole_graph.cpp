#include "engine/train/whole_graph.hpp"

#include "engine/layerwise.hpp"

namespace gale::engine::train_parts {

Tensor ids_tensor(const std::vector<int64_t>& ids, const Device& device) {
  return Tensor::from_host(ids.data(), static_cast<int64_t>(ids.size()), 1, DType::kI64, device);
}

WholeGraph::WholeGraph(const TrainRun& run, const Device& device)
    : run_(run),
      device_(device),
      train_rows_(ids_tensor(run.train_ids(), device)),
      valid_rows_(ids_tensor(run.valid_ids(), device)),
      test_rows_(ids_tensor(run.test_ids(), device)) {}

std::vector<SpmmAutoChoice> WholeGraph::spmm_choices() const {
  return graph_ ? spmm_auto_choices(graph_->id()) : std::vector<SpmmAutoChoice>();
}

std::vector<const GraphOperand*> WholeGraph::graphs() {
  if (!graph_)
    graph_.emplace(GraphOperand(aggregation_csr(run_.store(), run_.opt().model)).to(device_, run_.attention()));
  return std::vector<const GraphOperand*>(static_cast<size_t>(run_.opt().model.layers), &*graph_);
}

const Tensor& WholeGraph::features() {
  if (!features_.defined()) {
    // Every row in host memory (on a GPU only until copied there): charged to the host budget
    // while it lives, and checked page by page as it loads.
    const storage::Store& store = run_.store();
    const uint64_t bytes = static_cast<uint64_t>(store.num_nodes()) * static_cast<uint64_t>(store.feature_dim()) * sizeof(float);
    run_.host_budget().charge(bytes);
    try {
      store.check_feature_pages(0, store.num_nodes());
      Tensor host = Tensor::empty(store.num_nodes(), store.feature_dim());
      store.read_features(0, store.num_nodes(), host.f32());
      features_ = host.to(device_);
    } catch (...) {
      run_.host_budget().release(bytes);
      throw;
    }
    if (device_.is_cpu()) host_charge_ = bytes;  // held as long as the run
    else run_.host_budget().release(bytes);
  }
  return features_;
}

WholeGraph::~WholeGraph() { run_.host_budget().release(host_charge_); }

}  // namespace gale::engine::train_parts

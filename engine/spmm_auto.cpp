#include "engine/spmm_auto.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "kernels/error.hpp"
#if GALE_WITH_CUDA
#include "engine/device_context.hpp"
#include "engine/devices.hpp"
#include "kernels/cuda/runtime.hpp"
#endif

namespace gale::engine {

using kernels::SpmmKind;

std::vector<SpmmCandidate> spmm_auto_candidates(const SpmmAutoRules& rules) {
  std::vector<SpmmCandidate> c(3);
  c[0].kind = SpmmKind::kGar;
  c[1].kind = SpmmKind::kGas;
  c[2].kind = SpmmKind::kTensorCore;
  if (rules.deterministic) {
    c[1].excluded = "--deterministic (its atomic additions land in a varying order)";
    c[2].excluded = "--deterministic (a long window's items meet by atomics)";
  } else if (!rules.tf32) {
    c[2].excluded = "computes in TF32: competes with --tf32";
  } else if (!rules.tc_cannot.empty()) {
    c[2].excluded = rules.tc_cannot;
  }
  return c;
}

double spmm_median_ms(std::vector<float> ms) {
  if (ms.empty()) return 0;
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  return n % 2 == 1 ? ms[n / 2] : (static_cast<double>(ms[n / 2 - 1]) + ms[n / 2]) / 2;
}

SpmmKind spmm_auto_pick(const std::vector<SpmmCandidate>& candidates) {
  const SpmmCandidate* best = nullptr;
  double best_ms = 0;
  for (const SpmmCandidate& c : candidates) {
    if (!c.excluded.empty()) continue;
    if (c.ms.empty()) throw InternalError(std::string("spmm auto: ") + kernels::spmm_kind_name(c.kind) + " competes untimed");
    const double ms = spmm_median_ms(c.ms);
    if (best == nullptr || ms < best_ms) {
      best = &c;
      best_ms = ms;
    }
  }
  if (best == nullptr) throw InternalError("spmm auto: no kernel competes");
  return best->kind;
}

SpmmKind spmm_auto_measure(std::vector<SpmmCandidate>* candidates, const std::function<void(SpmmKind)>& run,
                           const std::function<float(SpmmKind)>& time) {
  SpmmKind last = SpmmKind::kAuto;
  for (SpmmCandidate& c : *candidates) {
    if (!c.excluded.empty()) continue;
    // The first call pays for what a kernel does once (its code's load, the pool's first blocks).
    run(c.kind);
    c.ms.clear();
    for (int i = 0; i < kSpmmAutoRuns; ++i) c.ms.push_back(time(c.kind));
    last = c.kind;
  }
  const SpmmKind winner = spmm_auto_pick(*candidates);
  if (winner != last) run(winner);
  return winner;
}

std::string SpmmAutoChoice::key() const { return std::string(transpose ? "csc:" : "csr:") + std::to_string(width); }

std::string SpmmAutoChoice::text() const {
  std::string timed, left_out;
  for (const SpmmCandidate& c : candidates) {
    const std::string name = kernels::spmm_kind_name(c.kind);
    if (!c.excluded.empty()) {
      left_out += (left_out.empty() ? "" : "; ") + name + ": " + c.excluded;
      continue;
    }
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.3f", spmm_median_ms(c.ms));
    timed += (timed.empty() ? "" : ", ") + name + " " + ms + " ms";
  }
  std::string s = "spmm auto: " + key() + ": " + timed + " -> " + kernels::spmm_kind_name(kind);
  if (!left_out.empty()) s += " (not timed: " + left_out + ")";
  return s;
}

bool spmm_auto_measures(const GraphOperand& g) { return g.whole_graph() && g.device().is_cuda(); }

namespace {

// Every choice made in the process, and where to find one by operand, direction and width.
class ChoiceRegistry {
 public:
  using Key = std::tuple<uint64_t, bool, int64_t>;

  bool find(const Key& key, SpmmKind* kind) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = index_.find(key);
    if (it == index_.end()) return false;
    *kind = choices_[it->second].kind;
    return true;
  }
  void add(SpmmAutoChoice choice) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const Key key{choice.operand, choice.transpose, choice.width};
    if (index_.count(key) > 0) return;  // another thread measured it first: keep that one
    index_[key] = choices_.size();
    choices_.push_back(std::move(choice));
  }
  std::vector<SpmmAutoChoice> of(uint64_t operand) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::vector<SpmmAutoChoice> out;
    for (const SpmmAutoChoice& c : choices_)
      if (c.operand == operand) out.push_back(c);
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<SpmmAutoChoice> choices_;
  std::map<Key, size_t> index_;
};

ChoiceRegistry& registry() {
  static ChoiceRegistry r;
  return r;
}

#if GALE_WITH_CUDA
// Whether any choice over g's CSR or CSC that shares the plan of direction `csc` went to tc.
bool tc_chosen(const GraphOperand& g, bool csc) {
  for (const SpmmAutoChoice& c : registry().of(g.id()))
    if (c.kind == SpmmKind::kTensorCore && (g.symmetric() || c.transpose == csc)) return true;
  return false;
}

// What the GPU budget (or, without one, 90% of the card) leaves on g's device now.
uint64_t room_left(const Device& device) {
  const kernels::cuda::MemoryBudget& budget = DeviceContext::get(device.ordinal).pool().budget();
  return gpu_room_left(device, budget.unlimited() ? 0 : budget.limit());
}

// Runs `a` with the kernel chosen before for g's operand, direction and width; false when none was.
bool run_chosen(const GraphOperand& g, bool csc, kernels::SpmmArgs a) {
  const ChoiceRegistry::Key key{g.id(), csc, a.out.cols};
  SpmmKind kind = SpmmKind::kAuto;
  if (!registry().find(key, &kind)) return false;
  if (kind == SpmmKind::kTensorCore) a.tc = g.tc_plan(csc);
  ops::spmm(a, g.device(), kind);
  return true;
}

// Points a->tc at g's plan when it fits the budget; else why tc cannot compete ("" : it can).
std::string take_tc_plan(const GraphOperand& g, bool csc, kernels::SpmmArgs* a) {
  // Half of what is left: the plan stays for the run, and the step's later tensors need room too.
  const uint64_t room = room_left(g.device());
  uint64_t bytes = 0;
  try {
    a->tc = g.tc_plan_within(csc, room / 2, &bytes);
    if (a->tc.item_window == nullptr)
      return "its plan (" + kernels::cuda::format_bytes(bytes) + ") is over half of the " +
             kernels::cuda::format_bytes(room) + " the GPU budget leaves";
  } catch (const InputError& e) {  // a graph the plan's 32-bit ids cannot hold: the others still compete
    return e.what();
  }
  return "";
}

// GAR, GAS and tc with why each does not compete for `a` under exec's rules ("" : it does); takes
// tc's plan (a->tc) where tc may compete.
std::vector<SpmmCandidate> eligible_candidates(const GraphOperand& g, bool csc, const ops::ExecOptions& exec,
                                               kernels::SpmmArgs* a) {
  SpmmAutoRules rules;
  rules.deterministic = exec.deterministic;
  rules.tf32 = exec.tf32;
  if (!rules.deterministic && rules.tf32) rules.tc_cannot = take_tc_plan(g, csc, a);
  std::vector<SpmmCandidate> candidates = spmm_auto_candidates(rules);
  // An output mask (ReLU's backward, folded in) does not decide who competes: GAR applies it, the
  // others pay a pass of their own for it (ops::spmm), and the timings include that pass.
  kernels::SpmmArgs unmasked = *a;
  unmasked.out_mask = nullptr;
  unmasked.out_mask_words = 0;
  for (SpmmCandidate& c : candidates)
    if (c.excluded.empty()) c.excluded = kernels::spmm_cannot(c.kind, unmasked);
  return candidates;
}

// A copy of a's output on `device` when a accumulates into it (an undefined tensor otherwise).
Tensor copy_of_output(const kernels::SpmmArgs& a, const Device& device, cudaStream_t stream, size_t row_bytes,
                      size_t out_pitch) {
  Tensor before;
  if (a.accumulate) {
    before = Tensor::empty(a.out.rows, a.out.cols, DType::kF32, device);
    kernels::cuda::copy_rows_on_device(before.f32(), row_bytes, a.out.data, out_pitch, row_bytes,
                                       static_cast<size_t>(a.out.rows), stream);
  }
  return before;
}

// The aggregation `a` run, or run and timed by CUDA events, on the device's compute stream. Every
// call must see the output as the caller left it: with accumulate, a copy puts it back before each
// call (outside the timed span).
class TimedSpmm {
 public:
  TimedSpmm(const kernels::SpmmArgs& a, const Device& device)
      : a_(a),
        device_(device),
        stream_(DeviceContext::get(device.ordinal).stream()),
        row_bytes_(static_cast<size_t>(a.out.cols) * sizeof(float)),
        out_pitch_(static_cast<size_t>(a.out.ld) * sizeof(float)),
        before_(copy_of_output(a, device, stream_, row_bytes_, out_pitch_)),
        start_(device.ordinal, kernels::cuda::Event::Timing::kEnabled),
        end_(device.ordinal, kernels::cuda::Event::Timing::kEnabled) {}

  void run(SpmmKind k) {
    restore();
    ops::spmm(a_, device_, k);
  }
  float time(SpmmKind k) {
    restore();
    start_.record(stream_);
    ops::spmm(a_, device_, k);
    end_.record(stream_);
    return kernels::cuda::elapsed_ms(start_, end_);
  }

 private:
  void restore() {
    if (before_.defined())
      kernels::cuda::copy_rows_on_device(a_.out.data, out_pitch_, before_.f32(), row_bytes_, row_bytes_,
                                         static_cast<size_t>(a_.out.rows), stream_);
  }

  const kernels::SpmmArgs& a_;
  const Device& device_;
  const cudaStream_t stream_;
  const size_t row_bytes_;
  const size_t out_pitch_;
  Tensor before_;
  kernels::cuda::Event start_;
  kernels::cuda::Event end_;
};

// Records `kind` as the choice for g's operand, direction (csc) and a's width, and frees tc's plan
// when it lost and no other choice over that plan went to tc.
void remember(const GraphOperand& g, bool csc, const kernels::SpmmArgs& a, SpmmKind kind,
              std::vector<SpmmCandidate> candidates) {
  SpmmAutoChoice choice;
  choice.operand = g.id();
  choice.transpose = csc;
  choice.width = a.out.cols;
  choice.kind = kind;
  choice.candidates = std::move(candidates);
  const bool tc_lost = a.tc.item_window != nullptr && choice.kind != SpmmKind::kTensorCore;
  registry().add(std::move(choice));
  if (tc_lost && !tc_chosen(g, csc)) g.release_tc_plan(csc);  // its device arrays are of no more use
}
#endif

}  // namespace

std::vector<SpmmAutoChoice> spmm_auto_choices(uint64_t operand) { return registry().of(operand); }

void spmm_auto(const GraphOperand& g, bool csc, kernels::SpmmArgs a, const ops::ExecOptions& exec) {
  if (!spmm_auto_measures(g)) return ops::spmm(a, g.device(), SpmmKind::kAuto);
#if GALE_WITH_CUDA
  if (run_chosen(g, csc, a)) return;
  std::vector<SpmmCandidate> candidates = eligible_candidates(g, csc, exec, &a);
  TimedSpmm calls(a, g.device());
  const SpmmKind kind = spmm_auto_measure(
      &candidates, [&](SpmmKind k) { calls.run(k); }, [&](SpmmKind k) { return calls.time(k); });
  remember(g, csc, a, kind, std::move(candidates));
#else
  (void)csc;
  (void)exec;
  ops::spmm(a, g.device(), SpmmKind::kAuto);
#endif
}

}  // namespace gale::engine

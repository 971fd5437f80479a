#include "trainer/checkpoint/optimizer_codecs.h"

#include <torch/torch.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

using Fields = OptimizerCodec::Fields;
using FieldMap = std::map<std::string, torch::Tensor>;
using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamGroup;
using torch::optim::OptimizerParamState;

torch::Tensor Int(int64_t v) { return torch::tensor(v, torch::kInt64); }
torch::Tensor Real(double v) { return torch::tensor(v, torch::kFloat64); }
torch::Tensor Zeros(const torch::Tensor& p) {
  return torch::zeros_like(p, at::MemoryFormat::Preserve);
}

// A field Load needs: INVALID_ARGUMENT naming it when it is missing.
absl::Status Need(const FieldMap& f, std::initializer_list<const char*> names,
                  const std::string& optimizer) {
  for (const char* n : names) {
    if (f.count(n) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(optimizer, " state: field '", n, "' is missing"));
    }
  }
  return absl::OkStatus();
}

// Sets `set(tensor)` when the field is there (an optional buffer).
template <typename Set>
void Maybe(const FieldMap& f, const char* name, Set set) {
  if (auto it = f.find(name); it != f.end()) set(it->second);
}

class SgdCodec : public OptimizerCodec {
 public:
  std::string name() const override { return "SGD"; }
  // LibTorch starts the momentum buffer at the first gradient; zero gives
  // the same first step unless dampening is set (docs/library.md).
  std::unique_ptr<OptimizerParamState> Initial(const torch::Tensor& p,
                                               const OptimizerParamGroup& group,
                                               const torch::optim::Optimizer&) const override {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    if (o.momentum() == 0) return nullptr;
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(Zeros(p));
    return s;
  }
  Fields Save(const OptimizerParamState& state, const OptimizerOptions&) const override {
    const auto& s = static_cast<const torch::optim::SGDParamState&>(state);
    if (!s.momentum_buffer().defined()) return {};
    return {{"momentum_buffer", s.momentum_buffer()}};
  }
  absl::Status Load(const FieldMap& f, const OptimizerOptions&,
                    OptimizerParamState* state) const override {
    auto* s = static_cast<torch::optim::SGDParamState*>(state);
    Maybe(f, "momentum_buffer", [s](const torch::Tensor& t) { s->momentum_buffer(t); });
    return absl::OkStatus();
  }
};

// Adam and AdamW keep the same fields in distinct types.
template <typename State, typename Options>
class AdamCodec : public OptimizerCodec {
 public:
  explicit AdamCodec(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::unique_ptr<OptimizerParamState> Initial(const torch::Tensor& p,
                                               const OptimizerParamGroup& group,
                                               const torch::optim::Optimizer&) const override {
    auto s = std::make_unique<State>();
    s->step(0);
    s->exp_avg(Zeros(p));
    s->exp_avg_sq(Zeros(p));
    if (static_cast<const Options&>(group.options()).amsgrad()) s->max_exp_avg_sq(Zeros(p));
    return s;
  }
  Fields Save(const OptimizerParamState& state, const OptimizerOptions&) const override {
    const auto& s = static_cast<const State&>(state);
    Fields out = {{"step", Int(s.step())}, {"exp_avg", s.exp_avg()}, {"exp_avg_sq", s.exp_avg_sq()}};
    if (s.max_exp_avg_sq().defined()) out.emplace_back("max_exp_avg_sq", s.max_exp_avg_sq());
    return out;
  }
  absl::Status Load(const FieldMap& f, const OptimizerOptions&,
                    OptimizerParamState* state) const override {
    if (absl::Status s = Need(f, {"step", "exp_avg", "exp_avg_sq"}, name_); !s.ok()) return s;
    auto* s = static_cast<State*>(state);
    s->step(f.at("step").template item<int64_t>());
    s->exp_avg(f.at("exp_avg"));
    s->exp_avg_sq(f.at("exp_avg_sq"));
    Maybe(f, "max_exp_avg_sq", [s](const torch::Tensor& t) { s->max_exp_avg_sq(t); });
    return absl::OkStatus();
  }

 private:
  const std::string name_;
};

// RMSprop creates its state at a parameter's first step: step 0, zero
// averages, and the momentum buffer and gradient average when asked for.
class RmspropCodec : public OptimizerCodec {
 public:
  std::string name() const override { return "RMSprop"; }
  std::unique_ptr<OptimizerParamState> Initial(const torch::Tensor& p,
                                               const OptimizerParamGroup& group,
                                               const torch::optim::Optimizer&) const override {
    const auto& o = static_cast<const torch::optim::RMSpropOptions&>(group.options());
    auto s = std::make_unique<torch::optim::RMSpropParamState>();
    s->step(0);
    s->square_avg(Zeros(p));
    if (o.momentum() > 0) s->momentum_buffer(Zeros(p));
    if (o.centered()) s->grad_avg(Zeros(p));
    return s;
  }
  Fields Save(const OptimizerParamState& state, const OptimizerOptions&) const override {
    const auto& s = static_cast<const torch::optim::RMSpropParamState&>(state);
    Fields out = {{"step", Int(s.step())}, {"square_avg", s.square_avg()}};
    if (s.momentum_buffer().defined()) out.emplace_back("momentum_buffer", s.momentum_buffer());
    if (s.grad_avg().defined()) out.emplace_back("grad_avg", s.grad_avg());
    return out;
  }
  absl::Status Load(const FieldMap& f, const OptimizerOptions&,
                    OptimizerParamState* state) const override {
    if (absl::Status s = Need(f, {"step", "square_avg"}, name()); !s.ok()) return s;
    auto* s = static_cast<torch::optim::RMSpropParamState*>(state);
    s->step(f.at("step").item<int64_t>());
    s->square_avg(f.at("square_avg"));
    Maybe(f, "momentum_buffer", [s](const torch::Tensor& t) { s->momentum_buffer(t); });
    Maybe(f, "grad_avg", [s](const torch::Tensor& t) { s->grad_avg(t); });
    return absl::OkStatus();
  }
};

// Adagrad creates its state in its constructor; Initial covers parameters
// added after it.
class AdagradCodec : public OptimizerCodec {
 public:
  std::string name() const override { return "Adagrad"; }
  std::unique_ptr<OptimizerParamState> Initial(const torch::Tensor& p,
                                               const OptimizerParamGroup& group,
                                               const torch::optim::Optimizer&) const override {
    const auto& o = static_cast<const torch::optim::AdagradOptions&>(group.options());
    auto s = std::make_unique<torch::optim::AdagradParamState>();
    s->step(0);
    s->sum(torch::full_like(p, o.initial_accumulator_value(), at::MemoryFormat::Preserve));
    return s;
  }
  Fields Save(const OptimizerParamState& state, const OptimizerOptions&) const override {
    const auto& s = static_cast<const torch::optim::AdagradParamState&>(state);
    return {{"step", Int(s.step())}, {"sum", s.sum()}};
  }
  absl::Status Load(const FieldMap& f, const OptimizerOptions&,
                    OptimizerParamState* state) const override {
    if (absl::Status s = Need(f, {"step", "sum"}, name()); !s.ok()) return s;
    auto* s = static_cast<torch::optim::AdagradParamState*>(state);
    s->step(f.at("step").item<int64_t>());
    s->sum(f.at("sum"));
    return absl::OkStatus();
  }
};

// LBFGS keeps one state for all its parameters (under the first), over the
// flattened parameters (n values): a search direction, the last gradient,
// and up to history_size (h) pairs of directions and steps. The history is
// saved padded to h rows with its length, so that every rank holds the same
// shapes; the scratch list `al` is rebuilt by every step and not saved.
class LbfgsCodec : public OptimizerCodec {
 public:
  std::string name() const override { return "LBFGS"; }
  std::unique_ptr<OptimizerParamState> Initial(const torch::Tensor& p,
                                               const OptimizerParamGroup& group,
                                               const torch::optim::Optimizer&) const override {
    if (!p.is_same(group.params().at(0))) return nullptr;
    int64_t n = 0;
    for (const torch::Tensor& q : group.params()) n += q.numel();
    auto s = std::make_unique<torch::optim::LBFGSParamState>();
    s->d(torch::zeros({n}, p.options()));
    s->prev_flat_grad(torch::zeros({n}, p.options()));
    s->H_diag(torch::ones({}, p.options()));
    return s;
  }
  Fields Save(const OptimizerParamState& state, const OptimizerOptions& options) const override {
    const auto& s = static_cast<const torch::optim::LBFGSParamState&>(state);
    const int64_t h = static_cast<const torch::optim::LBFGSOptions&>(options).history_size();
    const torch::Tensor& d = s.d();
    const int64_t n = d.numel();
    torch::Tensor dirs = torch::zeros({h, n}, d.options());
    torch::Tensor stps = torch::zeros({h, n}, d.options());
    torch::Tensor ro = torch::zeros({h}, d.options());
    const int64_t k = std::min<int64_t>(h, static_cast<int64_t>(s.old_dirs().size()));
    for (int64_t i = 0; i < k; ++i) {
      dirs[i].copy_(s.old_dirs()[i]);
      stps[i].copy_(s.old_stps()[i]);
      ro[i].copy_(s.ro()[i]);
    }
    const torch::Tensor prev = s.prev_flat_grad().defined() ? s.prev_flat_grad() : torch::zeros_like(d);
    const torch::Tensor h_diag =
        s.H_diag().defined() ? s.H_diag().to(d.scalar_type()) : torch::ones({}, d.options());
    return {{"func_evals", Int(s.func_evals())}, {"n_iter", Int(s.n_iter())},
            {"t", Real(s.t())}, {"prev_loss", Real(s.prev_loss())},
            {"d", d}, {"prev_flat_grad", prev},
            {"H_diag", h_diag}, {"history", Int(k)},
            {"old_dirs", dirs}, {"old_stps", stps}, {"ro", ro}};
  }
  absl::Status Load(const FieldMap& f, const OptimizerOptions&,
                    OptimizerParamState* state) const override {
    if (absl::Status s = Need(f, {"func_evals", "n_iter", "t", "prev_loss", "d", "prev_flat_grad",
                                  "H_diag", "history", "old_dirs", "old_stps", "ro"},
                              name());
        !s.ok()) {
      return s;
    }
    auto* s = static_cast<torch::optim::LBFGSParamState*>(state);
    s->func_evals(f.at("func_evals").item<int64_t>());
    s->n_iter(f.at("n_iter").item<int64_t>());
    s->t(f.at("t").item<double>());
    s->prev_loss(f.at("prev_loss").item<double>());
    s->d(f.at("d"));
    s->prev_flat_grad(f.at("prev_flat_grad"));
    s->H_diag(f.at("H_diag"));
    const int64_t k = f.at("history").item<int64_t>();
    if (k < 0 || k > f.at("old_dirs").size(0)) {
      return absl::InvalidArgumentError(absl::StrCat("LBFGS state: history ", k, " out of range"));
    }
    std::deque<torch::Tensor> dirs, stps, ro;
    for (int64_t i = 0; i < k; ++i) {
      dirs.push_back(f.at("old_dirs")[i].clone());
      stps.push_back(f.at("old_stps")[i].clone());
      ro.push_back(f.at("ro")[i].clone());
    }
    s->old_dirs(dirs);
    s->old_stps(stps);
    s->ro(ro);
    return absl::OkStatus();
  }
};

template <typename Options>
bool Is(const OptimizerOptions& o) {
  return dynamic_cast<const Options*>(&o) != nullptr;
}

}  // namespace

const OptimizerCodec* BuiltinOptimizerCodec(const torch::optim::Optimizer& optimizer) {
  static const SgdCodec sgd;
  static const AdamCodec<torch::optim::AdamParamState, torch::optim::AdamOptions> adam("Adam");
  static const AdamCodec<torch::optim::AdamWParamState, torch::optim::AdamWOptions> adamw("AdamW");
  static const RmspropCodec rmsprop;
  static const AdagradCodec adagrad;
  static const LbfgsCodec lbfgs;
  if (optimizer.param_groups().empty()) return nullptr;
  const OptimizerOptions& o = optimizer.param_groups().front().options();
  if (Is<torch::optim::SGDOptions>(o)) return &sgd;
  if (Is<torch::optim::AdamOptions>(o)) return &adam;
  if (Is<torch::optim::AdamWOptions>(o)) return &adamw;
  if (Is<torch::optim::RMSpropOptions>(o)) return &rmsprop;
  if (Is<torch::optim::AdagradOptions>(o)) return &adagrad;
  if (Is<torch::optim::LBFGSOptions>(o)) return &lbfgs;
  return nullptr;
}

}  // namespace muster

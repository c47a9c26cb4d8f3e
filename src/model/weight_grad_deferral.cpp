// See weight_grad_deferral.h. The products are those autograd computes for at::linear (which folds
// x to [rows, in] and runs mm: dX = dY·W, dW = dYᵀ·X) and for fp32_products.cpp's 16-bit path, so a
// deferred backward gives the same bits as a whole one.
#include "model/weight_grad_deferral.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <cstdint>
#include <unordered_map>
#include <unordered_set>

#include "util/error.h"

namespace shardlm::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

thread_local WeightGradQueue* t_recording = nullptr;
std::atomic<int> g_input_backwards{0};  // backward_inputs running (nested under recomputation)

at::Tensor f32(const at::Tensor& t) { return t.to(at::kFloat); }

// dW = dYᵀ·X over all leading dimensions, as autograd's mm backward computes it for at::linear
// (dY.t().mm(X)), or in fp32 rounded once.
at::Tensor weight_product(const at::Tensor& x, const at::Tensor& dy, const at::Tensor& w, bool fp32_products) {
  const int64_t out = dy.size(-1), in = x.size(-1);
  if (fp32_products) return at::mm(f32(dy).reshape({-1, out}).t(), f32(x).reshape({-1, in})).to(w.scalar_type());
  return dy.reshape({-1, out}).t().mm(x.reshape({-1, in}));
}

// The parameter, passed to DeferredLinear as a non-tensor argument so that it gets no graph edge.
struct ParameterRef {
  at::Tensor param;
};

// y = x @ wᵀ; backward: dX only, the weight's product queued. `w` arrives detached (the weight is
// not in the graph, so autograd neither computes nor accumulates its gradient); the parameter itself
// travels in saved_data for the queue.
struct DeferredLinear : torch::autograd::Function<DeferredLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const ParameterRef& ref,
                            int64_t queue, bool fp32_products) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["param"] = ref.param;
    ctx->saved_data["queue"] = queue;
    ctx->saved_data["fp32"] = fp32_products;
    if (fp32_products) return at::linear(f32(x), f32(w)).to(x.scalar_type());
    // As at::matmul computes at::linear when the weight requires grad: x folded to [rows, in] (a
    // copy where x is not contiguous), one mm. (Here w is detached, and at::linear would take
    // the batched product on a non-contiguous x, rounding differently.)
    auto sizes = x.sizes().vec();
    sizes.back() = w.size(0);
    return at::mm(x.reshape({-1, x.size(-1)}), w.t()).view(sizes);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1];
    const bool fp32 = ctx->saved_data["fp32"].toBool();
    const auto& dy = grads[0];
    auto* queue = reinterpret_cast<WeightGradQueue*>(ctx->saved_data["queue"].toInt());
    queue->push_product(ctx->saved_data["param"].toTensor(), x, dy, fp32);
    at::Tensor dx;
    if (fp32) dx = at::matmul(f32(dy), f32(w)).to(x.scalar_type());
    else dx = dy.reshape({-1, dy.size(-1)}).mm(w).reshape(x.sizes());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Stands in for a parameter's gradient accumulator during B: queues the gradient (the sum of all of
// this backward's contributions, as the accumulator would receive it) instead of accumulating it.
// Runs as soon as it is ready, as AccumulateGrad does (highest sequence number).
struct QueueGradient : torch::autograd::Node {
  QueueGradient(at::Tensor param, WeightGradQueue* queue)
      : Node(/*sequence_nr=*/UINT64_MAX), param_(std::move(param)), queue_(queue) {
    add_input_metadata(param_);
  }
  variable_list apply(variable_list&& grads) override {
    if (!grads.empty() && grads[0].defined()) queue_->push_gradient(param_, grads[0]);
    return {};
  }
  std::string name() const override { return "shardlm::QueueGradient"; }

 private:
  at::Tensor param_;
  WeightGradQueue* queue_;
};

}  // namespace

WeightGradQueue::Recording::Recording(WeightGradQueue& queue) : previous_(t_recording) { t_recording = &queue; }
WeightGradQueue::Recording::~Recording() { t_recording = previous_; }
WeightGradQueue* WeightGradQueue::recording() { return t_recording; }

void WeightGradQueue::push_product(const at::Tensor& weight, const at::Tensor& x, const at::Tensor& dy,
                                   bool fp32_products) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back({weight, at::Tensor(), x, dy, fp32_products});
}

void WeightGradQueue::push_gradient(const at::Tensor& param, const at::Tensor& grad) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back({param, grad, at::Tensor(), at::Tensor(), false});
}

size_t WeightGradQueue::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

size_t WeightGradQueue::products() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const auto& e : entries_) n += e.x.defined() ? 1 : 0;
  return n;
}

at::Tensor WeightGradQueue::backward_input(const at::Tensor& out, const at::Tensor& grad, const at::Tensor& in) {
  backward_inputs(out, grad, in.defined() ? std::vector<at::Tensor>{in} : std::vector<at::Tensor>{});
  return in.defined() ? in.grad() : at::Tensor();
}

void WeightGradQueue::backward_inputs(const at::Tensor& out, const at::Tensor& grad,
                                      const std::vector<at::Tensor>& inputs) {
  const auto root = out.grad_fn();
  if (!root) fail("weight-gradient deferral: the output to back-propagate has no autograd graph");
  // Every edge into a leaf's accumulator (but the inputs') now leads to one QueueGradient per
  // leaf, so contributions from several uses are summed by the engine exactly as for the accumulator.
  std::unordered_map<torch::autograd::Node*, std::shared_ptr<QueueGradient>> capture;
  std::unordered_set<torch::autograd::Node*> seen{root.get()};
  std::vector<torch::autograd::Node*> stack{root.get()};
  std::unordered_set<const c10::TensorImpl*> kept;
  for (const auto& t : inputs) kept.insert(t.unsafeGetTensorImpl());
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    for (size_t i = 0; i < node->num_outputs(); ++i) {
      const auto& edge = node->next_edge(i);
      if (!edge.is_valid()) continue;
      auto* next = edge.function.get();
      if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(next)) {
        if (kept.count(acc->variable.unsafeGetTensorImpl())) continue;
        auto& q = capture[next];
        if (!q) q = std::make_shared<QueueGradient>(acc->variable, this);
        // Not set_next_edge, which refuses nodes with parents: both ends are leaves of the graph
        // (topological number 0), so the numbers stay valid.
        node->next_edges()[i] = torch::autograd::Edge(q, 0);
      } else if (seen.insert(next).second) {
        stack.push_back(next);
      }
    }
  }
  const std::vector<at::Tensor> grads = grad.defined() ? std::vector<at::Tensor>{grad} : std::vector<at::Tensor>{};
  struct Running {
    Running() { ++g_input_backwards; }
    ~Running() { --g_input_backwards; }
  } running;
  torch::autograd::backward({out}, grads, /*retain_graph=*/false);
}

bool WeightGradQueue::input_backward_running() { return g_input_backwards.load() > 0; }

void WeightGradQueue::backward_weight() {
  std::vector<Entry> entries;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    entries.swap(entries_);
  }
  // A parameter queued more than once (used by several products) is accumulated once, the sum of its
  // contributions in arrival order, where its last one arrived.
  std::unordered_map<const c10::TensorImpl*, size_t> last;
  for (size_t i = 0; i < entries.size(); ++i) last[entries[i].param.unsafeGetTensorImpl()] = i;
  std::unordered_map<const c10::TensorImpl*, at::Tensor> partial;
  computed_ = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    auto& e = entries[i];
    at::Tensor g = e.grad;
    if (!g.defined()) {
      g = weight_product(e.x, e.dy, e.param, e.fp32_products);
      ++computed_;
    }
    e.grad = at::Tensor();
    e.x = e.dy = at::Tensor();
    const auto* key = e.param.unsafeGetTensorImpl();
    if (auto it = partial.find(key); it != partial.end()) {
      g = it->second + g;
      partial.erase(it);
    }
    if (last[key] != i) {
      partial[key] = std::move(g);
      continue;
    }
    // Through the parameter's accumulator, so that its hooks fire as in a whole backward.
    torch::autograd::backward({e.param}, {std::move(g)});
  }
}

at::Tensor linear_deferring_weight_grad(const at::Tensor& x, const at::Tensor& w, WeightGradQueue& queue,
                                        bool fp32_products) {
  return DeferredLinear::apply(x, w.detach(), ParameterRef{w}, reinterpret_cast<int64_t>(&queue), fp32_products);
}

}  // namespace shardlm::model

// Weight-gradient deferral: the split of each linear layer's backward into its input-gradient and
// weight-gradient products that zero-bubble pipeline schedules need (ZB-H1's B and W, Qi et al.
// 2023). The model stays ignorant of schedules: whoever runs a forward opens a Recording on a
// WeightGradQueue (one per micro-batch), and every model::linear in that forward whose weight is a
// trainable leaf builds a node whose backward computes only dX = dY·W and queues the weight's
// product dW = dYᵀ·X (keeping X and dY, not the graph). backward_input (B) then runs the backward
// with every parameter's gradient queued instead of accumulated: the linear weights' products, and
// the finished gradients of the other parameters (norms, embeddings, biases), in the order the
// backward produces them. backward_weight (W) computes the queued products and accumulates each
// parameter's gradient into .grad through the parameter's own gradient accumulator, in that order,
// so the hooks on it (DDP buckets, ZeRO reduce-scatters: parallel/grad_ready_hook.h) fire once per
// parameter per micro-batch, when its last contribution lands, as they would in one whole backward.
// A checkpointed region (model/recompute.h) recorded under a queue recomputes in B under the same
// queue and runs its nested backward through backward_inputs: W needs only the kept X and dY.
#pragma once
#include <ATen/core/Tensor.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace shardlm::model {

class WeightGradQueue {
 public:
  WeightGradQueue() = default;
  WeightGradQueue(const WeightGradQueue&) = delete;
  WeightGradQueue& operator=(const WeightGradQueue&) = delete;

  // While one exists on this thread (and grad mode is on), model::linear defers into `queue` the
  // weight product of every linear whose weight is a leaf that requires grad and whose input requires
  // grad (other linears keep autograd's product; backward_input queues their weight's gradient whole).
  class Recording {
   public:
    explicit Recording(WeightGradQueue& queue);
    ~Recording();
    Recording(const Recording&) = delete;
    Recording& operator=(const Recording&) = delete;

   private:
    WeightGradQueue* previous_;
  };
  // The queue being recorded into on this thread, or null.
  static WeightGradQueue* recording();

  // B: back-propagates `grad` (undefined: a scalar `out`, implicitly 1) from `out` through the graph
  // its Recording built, freeing the graph. No parameter's .grad changes and no gradient hook fires:
  // every leaf's gradient but `in`'s is queued. Returns `in`'s gradient (undefined `in`: none).
  at::Tensor backward_input(const at::Tensor& out, const at::Tensor& grad, const at::Tensor& in);
  // The same for several inputs (leaves), whose gradients accumulate into their .grad: the nested
  // backward of a recomputed region (model/recompute.h) run under B.
  void backward_inputs(const at::Tensor& out, const at::Tensor& grad, const std::vector<at::Tensor>& inputs);
  // Whether a backward_input (B) is running in this process (read by hooks that autograd runs, on
  // whichever thread: ZeRO-3 releases a unit's gathered parameters after its B, as no gradient hook
  // fires there).
  static bool input_backward_running();
  // W: the queued products, each parameter's gradient accumulated into its .grad through its
  // gradient accumulator (its hooks fire) once, in the order B produced them. Empties the queue.
  void backward_weight();
  // Entries queued: one per deferred linear product and per other parameter's gradient; products():
  // those of the first kind.
  size_t size() const;
  size_t products() const;
  // Products the running (or last) backward_weight has computed so far: read from a gradient hook,
  // it shows the accumulation (and so a bucket's launch) interleaved with the remaining products.
  size_t products_computed() const { return computed_.load(); }

  // For model::linear's deferring node and backward_input's capture nodes (run by autograd's engine,
  // possibly on a device thread).
  void push_product(const at::Tensor& weight, const at::Tensor& x, const at::Tensor& dy, bool fp32_products);
  void push_gradient(const at::Tensor& param, const at::Tensor& grad);

 private:
  struct Entry {
    at::Tensor param;
    at::Tensor grad;   // a finished gradient, or undefined for a product:
    at::Tensor x, dy;  // dW = dyᵀ·x over all leading dimensions
    bool fp32_products = false;
  };
  std::atomic<size_t> computed_{0};
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
};

// y = x @ wᵀ whose backward gives x its gradient and queues w's product into `queue` (model::linear
// calls it under a Recording). fp32_products: the products in fp32, each rounded once to the
// inputs' type, as model/fp32_products.h computes them.
at::Tensor linear_deferring_weight_grad(const at::Tensor& x, const at::Tensor& w, WeightGradQueue& queue,
                                        bool fp32_products);

}  // namespace shardlm::model

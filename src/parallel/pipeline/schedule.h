// Step schedules: one optimizer step's forward and backward passes of `micro` micro-batches
// through this rank's stage of p stages, activations sent forward and their gradients backward
// between neighbouring stages (asynchronous sends, so a stage never waits for its neighbour to take
// what it sent). Every run has one: without pipeline parallelism it is the one-stage schedule, whose
// action list is forward 0, backward 0, forward 1, ... with nothing to send or receive, so the
// trainer drives every layout through the same calls and measures every one the same way.
//   gpipe: every forward, then every backward. Stage s keeps all m micro-batches' activations.
//   1f1b:  stage s runs p - s - 1 warm-up forwards, then alternates one forward and one backward,
//          then drains the remaining backwards: at most p - s micro-batches alive (PipeDream-Flush,
//          as Megatron-LM's non-interleaved schedule).
//   interleaved_1f1b: Megatron-LM's virtual pipeline (Narayanan et al. 2021; torchtitan's
//          Interleaved1F1B): each rank holds v model chunks, rank s chunks s, s + p, s + 2p, ...
//          (virtual stages k = c·p + s), so activations travel rank s -> s + 1 and from the last
//          rank back to the first for the next chunk. Forwards go round-robin over the chunks in
//          groups of p micro-batches (depth first), with (p - s - 1)·2 + (v - 1)·p warm-up forwards
//          (Megatron's forward_backward_pipelining_with_interleaving; every forward first when
//          m = p). m must be a multiple of p. Bubble (p - 1) / (v·m + p - 1) of the step.
//   zb_h1: Zero Bubble's ZB-H1 (Qi et al. 2023; PyTorch's ScheduleInterleavedZeroBubble with one
//          stage per rank): each backward is split per linear layer (model/weight_grad_deferral.h)
//          into B, every linear's input product dX = dY·W back to the stage's input (sent upstream
//          at once; the graph freed), and W, the weight products dW = dYᵀ·X B queued with their
//          kept X and dY. 1F1B's warm-up, then F B per micro-batch with stage s deferring its W
//          passes by s, filling the drain's idle time; at most p micro-batches alive on any stage,
//          1F1B's peak (stage 0's), though an alive micro-batch holds only X and dY between B and W.
//          Parameters that are not linear weights (norms, embeddings, biases) get their gradients
//          computed in B, but held in the queue with the products: W accumulates every parameter's
//          gradient into .grad once, through its gradient accumulator, in the order B produced them.
//          So the gradient-ready hooks fire once per parameter per micro-batch, all in W:
//          - DDP: buckets fill and launch their all-reduces during the step's last W (the
//            strategy's boundary micro-step), the last layers' first, overlapping the rest of that
//            W's products; earlier Ws only accumulate. They hide behind that W alone (the dW
//            half of a backward, where 1f1b's last whole backward hides them behind dX and dW),
//            so a stage's exposed all-reduce can grow by up to its share of B's time.
//          - ZeRO-2: each unit's reduce-scatter starts when the unit's last parameter arrives in
//            that micro-batch's W (every W, as every backward without the split), so a unit's full
//            gradient lives from its W to its reduce-scatter, never across Bs.
//          - ZeRO-1: reduces at the boundary as without the split.
//          - ZeRO-3: a unit's gathered parameters would be released only after its last W (its
//            reduce-scatter), holding every unit gathered from B to W; refused (parallelize.cpp).
// A schedule is a per-stage list of actions (schedule_actions), as PyTorch's PipelineScheduleMulti
// expresses one, so every schedule is a list, driven by one loop. All leave the same gradients
// (each micro-batch's parameter gradients come from the same products, accumulated in the same
// micro-batch order per parameter: zb_h1's bit-identical to 1f1b's); the idle fraction of each stage is the bubble
// (p - 1) / (m + p - 1) for gpipe and 1f1b.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"

namespace shardlm::parallel::pp {

enum class Schedule { GPipe, OneFOneB, Interleaved1F1B, ZeroBubbleH1 };
Schedule parse_schedule(const std::string& name);  // "gpipe" | "1f1b" | "interleaved_1f1b" | "zb_h1"
const char* schedule_name(Schedule schedule);
// Refuses what a schedule cannot run, naming the key to change: interleaved_1f1b needs
// virtual_pipeline_parallel (v) >= 2, micro-batches (gradient_accumulation_steps) a multiple of p
// and the decoder layers a multiple of p·v; v > 1 needs interleaved_1f1b and p >= 2. One stage (p = 1)
// runs the one-stage schedule whatever the name.
void check_schedule(Schedule schedule, int stages, int chunks, int64_t micro, int64_t layers);

// One step of a stage: compute micro-batch m's forward or backward on model chunk `chunk` (0 but
// for interleaved_1f1b). Sends and receives belong to them (a forward receives its input from the
// virtual stage before and sends its output on; a backward, or the input part B of a split one,
// receives the output's gradient and sends the input's back), so the list holds computations only.
//   Backward: the whole backward (input and parameter gradients).
//   BackwardInput (zb_h1's B): the input's gradient (every dX product); frees the graph, queues the
//   BackwardWeight (zb_h1's W): parameters' gradients (the dW products), accumulated into .grad.
struct Action {
  enum Kind { Forward, Backward, BackwardInput, BackwardWeight };
  Kind kind;
  int64_t micro;
  int chunk = 0;
};
// The actions of `stage` of `stages` for one step of `micro` micro-batches over `chunks` model
// chunks per stage, in order (one stage: F0 B0 F1 B1 ... whatever the schedule).
std::vector<Action> schedule_actions(Schedule schedule, int stage, int stages, int64_t micro, int chunks = 1);
// The idle fraction of the step the schedule's shape predicts with equal forward and backward
// times per stage: (p - 1) / (m + p - 1); interleaved (p - 1) / (v·m + p - 1). zb_h1 reports
// 1f1b's (what it improves on depends on W's share of the backward, see time_model.cpp).
double schedule_bubble(Schedule schedule, int stages, int64_t micro, int chunks = 1);

// The step the action lists make when every action takes a fixed time: each stage runs its list in
// order, an action starting when its stage is free and its input has arrived (sends cost nothing
// and never block, as Pipeline::train's asynchronous sends). For the planner's time model and the
// action lists' tests. Costs are per micro-batch of one virtual stage k = chunk·p + stage
// (`costs` holds p·chunks entries): forward, whole backward, and zb_h1's B and W.
struct ActionCost {
  double forward = 1, backward = 2, backward_input = 1, backward_weight = 1;
};
struct SimulatedStep {
  bool deadlock = false;           // some stage never got its input
  double span = 0;                 // from the first action's start to the last's end
  std::vector<double> busy;        // per stage: the summed time of its actions
  std::vector<int64_t> max_alive;  // per stage: most (micro-batch, chunk) pairs between F and their last backward part
};
SimulatedStep simulate_schedule(Schedule schedule, int stages, int64_t micro, int chunks,
                                const std::vector<ActionCost>& costs);

struct StageCalls {
  // Optional: before the first action of a step (or evaluation) of `micro` micro-batches.
  std::function<void(int64_t micro)> begin;
  // The first stage's input of micro-batch m (token ids).
  std::function<at::Tensor(int64_t m)> input;
  // This stage's units on `in` (token ids, or the hidden states received from the stage before).
  std::function<at::Tensor(int64_t m, int chunk, const at::Tensor& in)> forward;
  // (The forward above runs model chunk `chunk` of this stage: 0 but for interleaved_1f1b.)
  // The last stage only: the loss to back-propagate for micro-batch m from the stage's output
  // (already divided by the accumulation and multiplied by any loss scale), and the unscaled loss
  // to report.
  std::function<std::pair<at::Tensor, at::Tensor>(int64_t m, const at::Tensor& out)> loss;
  // Before micro-batch m's backward (zb_h1: before its W, where parameter gradients are accumulated);
  // `last` is the last of the step.
  std::function<void(int64_t m, bool last)> before_backward;
  // Optional: bytes of activations held now (heap or device allocator, from a baseline).
  std::function<int64_t()> held_bytes;
  // Optional: waits for the device's queued work (GPU), so a stage's compute time, and so its bubble,
  // is measured rather than launch time. Used with two or more stages only: one stage has no bubble,
  // and a wait per micro-batch would stop the host queueing ahead and overlapping gradient reduction.
  std::function<void()> synchronize;
  // Optional: after micro-batch m's forward (its loss included) and after its backward (with model
  // chunks: after its last chunk's forward and its first chunk's backward).
  std::function<void(int64_t m)> after_forward, after_backward;
  // Optional side messages (Pipeline::set_side_messages): a small vector that travels forward beside
  // the activations and one that travels backward beside their gradient, from and to the same
  // virtual stages (the MoE load-balancing loss's running sums and their gradient, parallelize.cpp).
  // side_before_forward: before forward(m, chunk), what the virtual stage before sent (undefined on
  // the first). side_after_forward: after it, what to send on (not called on the last virtual stage).
  // side_backward: before the backward of (m, chunk), from what the virtual stage after sent
  // (undefined on the last): {a scalar to back-propagate with gradient 1 beside the output (undefined
  // or without gradient: none), the vector to send upstream}.
  std::function<void(int64_t m, int chunk, const at::Tensor& received)> side_before_forward;
  std::function<at::Tensor(int64_t m, int chunk)> side_after_forward;
  std::function<std::pair<at::Tensor, at::Tensor>(int64_t m, int chunk, const at::Tensor& received)> side_backward;
};

// One interval of a stage's step, for the timeline (`shardlm report`): computing a micro-batch's
// forward or backward, waiting to receive its activations (forward) or gradient (backward), or a
// send from posting until its completion was observed (an upper bound: completion is checked when
// the next send is posted and at the end of the step). Times are wall-clock seconds (system_clock,
// so the stages of one node, and NTP-synchronised nodes, share one time base).
struct StageEvent {
  // Backward: the whole backward, or zb_h1's B (the input's gradient); BackwardWeight: zb_h1's W.
  enum Kind {
    Forward = 0, Backward = 1, RecvActivation = 2, RecvGradient = 3, SendActivation = 4, SendGradient = 5,
    BackwardWeight = 6
  };
  static constexpr int kKinds = 7;  // at most one of each kind per micro-batch and chunk
  int kind = Forward;
  int64_t micro = 0;
  double start_s = 0, end_s = 0;
  int chunk = 0;
};
const char* event_name(int kind);  // "forward", "backward", "recv_activation", ..., "backward_weight"

// What one stage did during one train() call, measured.
struct StageTimes {
  double span_s = 0;     // from the first forward to the last backward
  double busy_s = 0;     // computing forwards and backwards (not waiting to receive)
  double bubble() const { return span_s > 0 ? 1.0 - busy_s / span_s : 0.0; }
  int64_t activation_peak = 0;  // the largest held_bytes() seen after a forward
  int64_t max_alive = 0;        // most micro-batches whose activations were alive at once
  std::vector<StageEvent> events;  // in the order they started
  double seconds(int kind) const;  // the summed length of the events of one kind
};

// The file in out_dir that holds the timelines, one JSON line per reported step.
inline const char* const kTimelineFile = "pipeline_timeline.jsonl";

// What a step's schedule adds to the step's metrics: every stage's measured bubble, activation
// peak and live micro-batches (pipeline_*.stage<s>) beside the formula's bubble, and for the steps
// the report draws, the timeline of every stage (timeline.h). Nothing for one stage.
struct StageReport {
  std::vector<std::pair<std::string, double>> metrics;
  std::optional<nlohmann::json> timeline;  // on the pipeline's stage 0
};

class Pipeline {
 public:
  // pp: this (dp, tp) position's pipeline group, rank = stage (one rank: the one-stage schedule).
  // hidden: the shape of the activations passed between stages ([B, T_local, h]) and their options
  // (dtype, device). Activations and gradients travel on two communicators split from pp: on NCCL
  // each has its own stream, so a send queued behind a receive in the other direction cannot block
  // it (1F1B's steady state sends forward and receives backward at once).
  // chunks: model chunks per stage (virtual_pipeline_parallel; 1 but for interleaved_1f1b).
  Pipeline(comm::CommPtr pp, Schedule schedule, std::vector<int64_t> hidden, at::TensorOptions options,
           int chunks = 1);
  // The communicators it moves data on (for the metrics); none for one stage.
  std::vector<comm::CommPtr> groups() const;
  int stage() const { return pp_->rank(); }
  int stages() const { return pp_->size(); }
  int chunks() const { return chunks_; }
  bool first() const { return stage() == 0; }
  bool last() const { return stage() == stages() - 1; }
  // Whether chunk c of this stage is the whole pipeline's first (embedding) or last (head) virtual stage.
  bool first_virtual(int c) const { return first() && c == 0; }
  bool last_virtual(int c) const { return last() && c == chunks_ - 1; }

  // Forward and backward of micro-batches 0..micro-1 in the schedule's order. Returns the sum of
  // the reported losses (computed on the last stage) as one double on the CPU, on every stage.
  at::Tensor train(int64_t micro, const StageCalls& calls, StageTimes* times = nullptr);
  // Forward only (evaluation), the same sum on every stage.
  at::Tensor evaluate(int64_t micro, const StageCalls& calls);
  // Side messages of `numel` elements of `options` follow every activation and gradient message
  // (StageCalls' side_*), on the same communicator and tag (received in the order sent). 0: none.
  void set_side_messages(int64_t numel, at::TensorOptions options) {
    side_numel_ = numel;
    side_options_ = options;
  }
  // For the start-up line: the stages, schedule and bubble; empty for one stage.
  std::string describe(int64_t micro) const;
  // The step's StageReport (a collective over the stages): with `timeline`, the timeline too.
  StageReport report(const StageTimes& times, int64_t micro, int64_t step, bool timeline) const;

 private:
  at::Tensor receive(comm::Communicator& c, int64_t tag, int from, bool side = false);  // side: a side message
  // Micro-batch m's message into chunk c of the receiving rank: activations 2(m·v + c), gradients + 1
  // (unique for each pair of ranks; MPI keeps messages between two ranks in order, so tags may
  // repeat across steps).
  int64_t tag(int64_t m, int c, bool gradient) const { return 2 * (m * chunks_ + c) + (gradient ? 1 : 0); }
  int next_rank() const { return (stage() + 1) % stages(); }
  int previous_rank() const { return (stage() + stages() - 1) % stages(); }
  void send(comm::Communicator& c, const at::Tensor& t, int64_t tag, int to, StageEvent event);
  void drain_sends();
  void retire_sends(bool wait);  // forget the sends found complete (all of them when wait)
  at::Tensor sum_over_stages(const at::Tensor& loss_sum) const;  // the last stage's sum, everywhere

  struct PendingSend {
    at::Tensor buffer;  // kept alive until sent
    comm::WorkPtr work;
    StageEvent event;
  };

  comm::CommPtr pp_, forward_, backward_;
  Schedule schedule_;
  int chunks_ = 1;
  std::vector<int64_t> hidden_;
  at::TensorOptions options_;
  int64_t side_numel_ = 0;
  at::TensorOptions side_options_;
  std::vector<PendingSend> sends_;
  std::vector<StageEvent>* events_ = nullptr;  // where train() records the intervals, when asked
};

}  // namespace shardlm::parallel::pp

#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "data/data_loader.h"
#include "data/token_file.h"
#include "io/hf_weights.h"
#include "io/safetensors.h"
#include "comm/checked_communicator.h"
#include "comm/nccl_communicator.h"
#include "model/attention.h"
#include "model/fp32_products.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "parallel/consistency.h"
#include "parallel/parallel_dims.h"
#include "parallel/parallelize.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/timeline.h"
#include "plan/planner.h"
#include "precision/grad_scaler.h"
#include "train/checkpoint.h"
#include "util/device.h"
#include "util/error.h"
#include "util/process_memory.h"
#include "observe/rank_memory.h"
#include "util/available_memory.h"
#include "util/out_dir_lock.h"
#include "util/units.h"
#include "train/nonfinite.h"

namespace shardlm::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int configure_threads(int requested) {
  int n = requested;
  if (n <= 0) {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int ranks_here = local ? std::max(1, std::atoi(local)) : 1;
    n = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks_here);
  }
  at::set_num_threads(n);
  // The torch wheel's BLAS (MKL) follows the line above. A libtorch built on OpenBLAS (Debian's)
  // does not: its pool starts one thread per core in every rank, so 2 ranks on 2 cores ran 4 busy
  // threads (measured: 12% slower, irregular steps). Size it too when OpenBLAS is in the process.
  using SetThreads = void (*)(int);
  if (auto set_blas_threads = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    set_blas_threads(n);
  return n;
}

namespace {

// Maps a token file and checks it against the model's vocabulary (one pass, before any step).
std::shared_ptr<const data::Tokens> load_tokens(const std::string& path, const std::string& format,
                                                int64_t vocab_size) {
  auto tokens = std::make_shared<const data::Tokens>(data::read_tokens(path, data::parse_token_format(format)));
  data::check_token_ids(*tokens, vocab_size);
  return tokens;
}

at::ScalarType compute_dtype(const TrainConfig& cfg) {
  return cfg.bf16 ? at::kBFloat16 : cfg.fp16.enabled ? at::kHalf : cfg.float64_for_tests ? at::kDouble : at::kFloat;
}

model::Attention attention_for(const TrainConfig& cfg) {
  return model::resolve_attention(cfg.attn_implementation, cfg.device == "cuda", compute_dtype(cfg));
}

// The planner's view of this run.
plan::PlanRequest plan_request(const TrainConfig& cfg, int devices, int zero_stage, int64_t micro_batch) {
  plan::PlanRequest r;
  r.model = cfg.model;
  r.model_name = cfg.model_preset;
  r.devices = devices;
  r.device_memory = cfg.device_memory;
  r.micro_batch = micro_batch;
  r.seq_len = cfg.data.seq_len;
  r.accumulation = cfg.grad_accum;
  r.zero_stage = zero_stage;
  r.precision = cfg.bf16 ? "bf16" : cfg.fp16.enabled ? "fp16" : "fp32";
  r.grad_accum_dtype = cfg.grad_accum_dtype;
  r.persistence_threshold = cfg.zero.stage3_param_persistence_threshold;
  r.prefetch = cfg.zero.stage3_prefetch_bucket_size;
  r.reduce_bucket = cfg.zero.reduce_bucket_size;
  r.fused_attention = model::attention_is_fused(attention_for(cfg));
  r.recompute = cfg.activation_checkpointing.mode;
  r.tp = cfg.parallelism.tensor_parallel;
  r.sequence_parallel = cfg.parallelism.sequence_parallel;
  r.pp = cfg.parallelism.pipeline_parallel;
  r.pipeline_schedule = cfg.parallelism.pipeline_schedule;
  r.pipeline_split = cfg.parallelism.pipeline_split;
  r.products_in_fp32 = cfg.device == "cpu" && (cfg.fp16.enabled || (cfg.bf16 && model::bf16_products_in_fp32()));
  return r;
}

// Measures the first micro-step's activations. CPU: held = heap bytes in use after forward (what
// backward will read), peak = growth of the resident set's high-water mark over forward and
// backward. GPU: the caching allocator's bytes in tensors after forward, and its peak over both.
class ActivationProbe {
 public:
  explicit ActivationProbe(c10::Device device) : device_(device) {}
  void start() {
    if (device_.is_cuda()) {
      synchronize(device_);
      reset_device_peaks(device_);
      before_ = device_memory(device_).allocated;
      return;
    }
    // One-time allocations (BLAS thread buffers, autograd engine state) are not activations:
    // trigger them before the measurement starts.
    auto w = at::ones({64, 64}).set_requires_grad(true);
    at::mm(w, w).sum().backward();
    reset_peak_resident();
    before_ = resident_bytes();
    heap_before_ = heap_in_use_bytes();
  }
  int64_t held_now() const {
    return device_.is_cuda() ? device_memory(device_).allocated - before_ : heap_in_use_bytes() - heap_before_;
  }
  int64_t peak_growth() const {
    return device_.is_cuda() ? device_memory(device_).peak_allocated - before_ : peak_resident_bytes() - before_;
  }

 private:
  c10::Device device_;
  int64_t before_ = 0, heap_before_ = 0;
};

// Wall time of the phases of a step (forward, backward, grad_sync, optimizer; micro-steps add up),
// recorded as time_<phase>_s: where a step's time goes, e.g. what ZeRO's stages add to stage 0.
// CPU only: on a GPU the host just queues the work, and synchronizing to time it would change it.
class PhaseTimer {
 public:
  explicit PhaseTimer(c10::Device device) : enabled_(device.is_cpu()) {}
  void start() { t0_ = Clock::now(); }
  void stop(const std::string& phase) {
    if (enabled_) seconds_[phase] += std::chrono::duration<double>(Clock::now() - t0_).count();
  }
  void record(observe::StepMetrics& m) const {
    for (const auto& [phase, s] : seconds_) m.extra["time_" + phase + "_s"] = s;
  }

 private:
  bool enabled_;
  Clock::time_point t0_;
  std::map<std::string, double> seconds_;
};

}  // namespace

// With device_memory set, refuses a run whose predicted peak does not fit, naming the smallest
// change that does: a higher ZeRO stage first, then a smaller micro-batch.
void check_plan_fits(const TrainConfig& cfg, int devices) {
  if (cfg.device_memory <= 0) return check_plan_fits_available_memory(cfg, devices, local_ranks(), 0);
  const auto planned = plan::make_plan(plan_request(cfg, devices, cfg.zero.stage, cfg.micro_batch));
  if (planned.stages.front().fits) return;
  std::string fix;
  for (int stage = cfg.zero.stage + 1; stage <= 3 && fix.empty(); ++stage)
    if (plan::make_plan(plan_request(cfg, devices, stage, cfg.micro_batch)).stages.front().fits)
      fix = "--zero_optimization.stage=" + std::to_string(stage);
  for (int64_t b = cfg.micro_batch / 2; b >= 1 && fix.empty(); b /= 2)
    if (plan::make_plan(plan_request(cfg, devices, cfg.zero.stage, b)).stages.front().fits)
      fix = "--train_micro_batch_size_per_gpu=" + std::to_string(b) + " (raise gradient_accumulation_steps to keep the batch)";
  fail("the plan for this run does not fit device_memory:\n", plan::format_plan(planned),
       fix.empty() ? "no single change fits: use more devices or a smaller model" : "smallest change that fits: " + fix);
}

void check_plan_fits_available_memory(const TrainConfig& cfg, int devices, int ranks_here, int64_t per_rank_overhead) {
  const auto budget = rank_memory_budget(cfg.device, ranks_here, per_rank_overhead);
  auto limited = cfg;
  limited.device_memory = static_cast<double>(std::max<int64_t>(budget.bytes, 1));
  try {
    check_plan_fits(limited, devices);
  } catch (const Error& e) {
    fail(e.what(), "\n(device_memory is not set, so each rank may use what this machine has free: ",
         util::format_bytes(static_cast<double>(budget.bytes)), " = ", budget.why, ".) Other fixes: a smaller model, "
         "--zero_optimization.stage=3, more ranks on more nodes, --activation_checkpointing.mode=full, or set "
         "--device_memory=SIZE to plan for another amount");
  }
}

struct Trainer::State {
  TrainConfig cfg;
  c10::Device device = c10::Device(c10::kCPU);
  parallel::ParallelDims dims;
  bool quiet = false;
  std::unique_ptr<model::Llama> model;
  // What parallelize() built (DDP or ZeRO, under TP and/or PP or not); the loop never asks which.
  std::unique_ptr<parallel::Strategy> strategy;
  int64_t model_parameters = 0;  // the whole model's (a TP shard or pipeline stage holds fewer)
  // Loss scaling (fp16: one dynamic scale or one per unit; otherwise a scale of 1 that always steps).
  precision::GradScaler scaler;
  int64_t activations_measured = 0;  // RSS growth over the first micro-step's forward + backward
  int64_t activations_held = 0;      // allocator bytes in use after that forward: what backward will read
  // GPU, once the strategy is built: bytes in tensors (the model states, nothing else) and bytes the
  // caching allocator holds (stage 3: plus the released units' blocks, kept for the next gathers).
  int64_t device_allocated_after_init = 0, device_reserved_after_init = 0;
  optim::LrSchedule schedule;
  std::unique_ptr<data::DataLoader> train_loader, val_loader;
  std::unique_ptr<observe::MetricsWriter> metrics;
  int64_t start_step = 0;  // optimizer steps already taken (resumed runs)
  std::unique_ptr<OutDirLock> out_dir_lock;  // the logging rank's, held while it writes out_dir
  // Every rank's peak memory of the step (see observe/rank_memory.h) into the logging rank's metrics.
  void record_rank_memory(observe::StepMetrics& m) const;

  bool logging() const { return dims.is_logging_rank(); }
  void log(const std::string& line) const {
    if (logging() && !quiet) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
  }
  double evaluate();
  // Pipeline parallelism: the stages' schedule, and the calls it makes into this stage for a loader
  // position (train or validation batches starting at `first`).
  std::unique_ptr<parallel::pp::Pipeline> pipeline;
  parallel::pp::Schedule pipeline_schedule = parallel::pp::Schedule::OneFOneB;
  parallel::pp::StageCalls stage_calls(data::DataLoader& loader, int64_t first, double loss_multiplier);
  // Every stage's measured bubble, activation peak and live micro-batches into the step's metrics
  // (pipeline_*.stage<s>), beside the formula's bubble (p-1)/(m+p-1).
  void record_stage_times(const parallel::pp::StageTimes& t, observe::StepMetrics& m) const;
  void save_final();
  // Sharded checkpoints (checkpoint.h): the trainer's own state beside the strategy's.
  bool resumed = false, saved_once = false;
  // Micro-steps added to the loader's position: a resume whose global batch differs from the
  // checkpoint's continues from the windows it consumed instead of this layout's step position.
  int64_t data_offset = 0;
  std::string resumed_dir;
  nlohmann::json checkpoint_state() const;
  void save_checkpoint_at(int64_t step);
  void resume_from_checkpoint();
  at::Tensor forward(const at::Tensor& inputs) const { return model->forward(inputs, strategy->forward_hooks()); }
  void write_memory_report(bool print);
};

Trainer::Trainer(const TrainConfig& cfg, comm::CommPtr world, bool quiet) : s_(std::make_unique<State>()) {
  s_->cfg = cfg;
  s_->quiet = quiet;
  s_->device = select_device(cfg.device);  // first: --device cuda without a GPU stops here
  world->set_timeout_seconds(cfg.comm.timeout_s);
  // NCCL is bootstrapped over the launcher's (MPI) world and then carries every collective.
  if (cfg.comm_backend() == "nccl") {
    world = comm::nccl_world(world, s_->device.index());
    world->set_timeout_seconds(cfg.comm.timeout_s);  // before any split: sub-communicators copy it
  }
  cfg.validate_for(world->size());
  // Desync detection: every communicator split from here on checks its collectives (debug section).
  if (cfg.debug.check_collectives) world = comm::checked_communicator(world, world->rank());
  s_->dims = parallel::ParallelDims::build(world, 0, cfg.parallelism.tensor_parallel, cfg.parallelism.pipeline_parallel);
  model::set_bf16_products(model::parse_bf16_products(cfg.bf16_cpu_products));
  check_plan_fits(cfg, world->size());
  // Data first: a bad token file stops the run before out_dir is created or locked.
  const auto& mc = cfg.model;
  s_->train_loader = std::make_unique<data::DataLoader>(load_tokens(cfg.data.train, cfg.data.format, mc.vocab_size),
                                                        cfg.micro_batch, cfg.data.seq_len, s_->dims.dp_rank(),
                                                        s_->dims.dp);
  if (!cfg.data.val.empty())
    s_->val_loader = std::make_unique<data::DataLoader>(load_tokens(cfg.data.val, cfg.data.format, mc.vocab_size),
                                                        cfg.micro_batch, cfg.data.seq_len, s_->dims.dp_rank(),
                                                        s_->dims.dp);
  if (s_->logging()) s_->out_dir_lock = std::make_unique<OutDirLock>(cfg.out_dir);  // before anything is written
  const int threads = configure_threads(cfg.threads);

  // Initialised (or loaded) on the CPU, so every device starts from the same weights; the strategy
  // below moves them to the device.
  s_->model = std::make_unique<model::Llama>(mc, cfg.seed, cfg.float64_for_tests ? at::kDouble : at::kFloat);
  if (!cfg.init.empty()) {
    std::string weights;
    const auto tensors = io::load_hf_weights(cfg.init, &weights);
    s_->model->load(tensors, weights);
    check_finite_weights(*s_->model, weights);
  }
  s_->model->set_attention(attention_for(cfg));
  const auto& o = cfg.optimizer;
  const optim::AdamWOptions adam{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
  s_->schedule = optim::LrSchedule{cfg.scheduler.type,          o.lr,
                                   cfg.scheduler.warmup_num_steps, cfg.scheduler.warmup_min_ratio,
                                   cfg.scheduler.cos_min_ratio,    cfg.scheduler.total_num_steps > 0
                                                                       ? cfg.scheduler.total_num_steps
                                                                       : cfg.steps};
  s_->scaler = precision::GradScaler(
      {cfg.fp16.enabled, cfg.fp16.per_unit_loss_scaling,
       precision::LossScalerOptions{cfg.fp16.loss_scale, cfg.fp16.initial_scale_power, cfg.fp16.loss_scale_window,
                                    cfg.fp16.hysteresis, cfg.fp16.min_loss_scale},
       cfg.fp16.max_loss_scale},
      s_->model->units().size());
  parallel::ParallelizeOptions po;
  po.sequence_parallel = cfg.parallelism.sequence_parallel;
  po.pipeline_split = cfg.parallelism.pipeline_split;
  po.recompute = model::parse_recompute(cfg.activation_checkpointing.mode);
  po.ddp_bucket_bytes = static_cast<int64_t>(cfg.ddp.bucket_cap_mb * (1 << 20));
  po.adam = adam;
  auto& z = po.zero;
  z.stage = cfg.zero.stage;
  z.device = s_->device;
  z.compute_dtype = compute_dtype(cfg);
  z.grad_accum_dtype = cfg.grad_accum_dtype == "bf16" ? at::kBFloat16 : z.compute_dtype == at::kDouble ? at::kDouble : at::kFloat;
  z.overlap_comm = cfg.zero.overlap_comm;
  z.prefetch_numel = static_cast<int64_t>(cfg.zero.stage3_prefetch_bucket_size);
  z.persistence_threshold = static_cast<int64_t>(cfg.zero.stage3_param_persistence_threshold);
  z.reduce_bucket_numel = static_cast<int64_t>(cfg.zero.reduce_bucket_size);
  z.allgather_bucket_numel = static_cast<int64_t>(cfg.zero.allgather_bucket_size);
  z.per_unit_loss_scaling = cfg.fp16.enabled && cfg.fp16.per_unit_loss_scaling;
  const bool resuming = cfg.resume && has_checkpoint(cfg.out_dir);
  s_->model_parameters = s_->model->num_parameters();  // before TP / PP keep a part
  s_->strategy = parallel::parallelize(*s_->model, s_->dims, po);
  if (s_->dims.pp > 1) {
    // Between stages travel the hidden states [micro-batch, this rank's positions, hidden].
    const int64_t positions = cfg.data.seq_len / (cfg.parallelism.sequence_parallel ? s_->dims.tp : 1);
    s_->pipeline = std::make_unique<parallel::pp::Pipeline>(
        s_->dims.pp_comm, std::vector<int64_t>{cfg.micro_batch, positions, mc.hidden_size},
        at::TensorOptions().dtype(compute_dtype(cfg)).device(s_->device));
    s_->pipeline_schedule = parallel::pp::parse_schedule(cfg.parallelism.pipeline_schedule);
  }
  // Every rank reads the same checkpoint files, so the ranks still agree after the load.
  if (resuming) s_->resume_from_checkpoint();

  const auto built = device_memory(s_->device);
  s_->device_allocated_after_init = built.allocated;
  s_->device_reserved_after_init = built.reserved;
  if (s_->logging()) {
    fs::create_directories(cfg.out_dir);
    std::ofstream(cfg.out_dir + "/train_config.json") << config_to_json(cfg) << "\n";
    s_->metrics = std::make_unique<observe::MetricsWriter>(cfg.out_dir + "/metrics.jsonl", s_->start_step);
    if (s_->start_step == 0) fs::remove(cfg.out_dir + "/pipeline_timeline.jsonl");  // an earlier run's
  }
  char line[512];
  std::snprintf(line, sizeof line,
                "shardlm: model %s, %.2fM parameters | %d rank(s) (dp=%d tp=%d pp=%d), %d thread(s) each | micro-batch %lld x "
                "seq %lld x accumulation %lld x dp %d = %lld tokens/step | %lld steps | %s",
                s_->cfg.model_preset.c_str(), s_->model_parameters / 1e6,
                world->size(), s_->dims.dp, s_->dims.tp, s_->dims.pp, threads,
                static_cast<long long>(cfg.micro_batch), static_cast<long long>(cfg.data.seq_len),
                static_cast<long long>(cfg.grad_accum), s_->dims.dp,
                static_cast<long long>(cfg.micro_batch * cfg.data.seq_len * cfg.grad_accum * s_->dims.dp),
                static_cast<long long>(cfg.steps), s_->strategy->describe().c_str());
  s_->log(line);
  s_->log(std::string("shardlm: device ") + s_->device.str() + ", communicator " + cfg.comm_backend() +
          ", attention " + model::attention_name(s_->model->attention()) + ", activation checkpointing " +
          model::recompute_name(s_->model->recompute()));
  if (s_->dims.pp > 1) {
    const double p = s_->dims.pp, m = static_cast<double>(cfg.grad_accum);
    char bubble[320];
    std::snprintf(bubble, sizeof bubble,
                  "shardlm: pipeline %d stages, schedule %s, %lld micro-batch(es) per step: bubble (p-1)/(m+p-1) = "
                  "%.0f%%%s",
                  s_->dims.pp, cfg.parallelism.pipeline_schedule.c_str(), static_cast<long long>(cfg.grad_accum),
                  100 * (p - 1) / (m + p - 1),
                  m < p ? " — fewer micro-batches than stages leaves most stages idle; raise "
                          "gradient_accumulation_steps (the micro-batches) to at least the stages"
                        : "");
    s_->log(bubble);
  }
  if (cfg.bf16 && s_->device.is_cpu()) s_->log("shardlm: " + model::describe_bf16_products());
  s_->write_memory_report(/*print=*/true);
  if (s_->start_step > 0)
    s_->log("shardlm: resumed from " + s_->resumed_dir + " after step " + std::to_string(s_->start_step));
}

Trainer::~Trainer() = default;

model::Llama& Trainer::model() { return *s_->model; }
parallel::ModelStateMemory Trainer::memory() const { return s_->strategy->memory(); }

parallel::pp::StageCalls Trainer::State::stage_calls(data::DataLoader& loader, int64_t first,
                                                     double loss_multiplier) {
  parallel::pp::StageCalls calls;
  // Every stage reads the micro-batch: the first needs its tokens, the last its targets.
  auto batch = [this, &loader, first](int64_t m) { return loader.batch(first + m, device); };
  const auto units = strategy->stage_units();
  const int64_t T = cfg.data.seq_len;
  calls.input = [batch](int64_t m) { return batch(m).inputs; };
  calls.forward = [this, units, T](int64_t, const at::Tensor& in) {
    return model->forward_units(in, units.first, units.last, T, strategy->forward_hooks());
  };
  calls.loss = [this, batch, loss_multiplier](int64_t m, const at::Tensor& logits) {
    const auto loss = model->loss(logits, batch(m).targets);
    return std::make_pair(loss * loss_multiplier, loss.detach());
  };
  calls.before_backward = [this](int64_t, bool last) { strategy->begin_micro_step(last); };
  return calls;
}

void Trainer::State::record_stage_times(const parallel::pp::StageTimes& t, observe::StepMetrics& m) const {
  const auto mine = at::tensor({t.bubble(), static_cast<double>(t.activation_peak), static_cast<double>(t.max_alive)},
                               at::kDouble);
  auto all = at::empty({3 * dims.pp}, at::kDouble);
  dims.pp_comm->all_gather(mine, all);
  for (int st = 0; st < dims.pp; ++st) {
    const auto tag = ".stage" + std::to_string(st);
    m.extra["pipeline_bubble" + tag] = all[3 * st].item<double>();
    m.extra["pipeline_activation_peak" + tag] = all[3 * st + 1].item<double>();
    m.extra["pipeline_alive_micro_batches" + tag] = all[3 * st + 2].item<double>();
  }
  double mean = 0;
  for (int st = 0; st < dims.pp; ++st) mean += all[3 * st].item<double>() / dims.pp;
  m.extra["pipeline_bubble"] = mean;  // the stages' idle fraction, averaged
  const double p = dims.pp, micro = static_cast<double>(cfg.grad_accum);
  m.extra["pipeline_bubble_formula"] = (p - 1) / (micro + p - 1);

  // The timeline of the process's first three steps and of the last one (pipeline_timeline.jsonl).
  if (m.step - start_step > 3 && m.step != cfg.steps) return;
  auto events = at::empty({dims.pp * 6 * cfg.grad_accum, 4}, at::kDouble);
  dims.pp_comm->all_gather(parallel::pp::pack_events(t, cfg.grad_accum), events);
  if (!logging()) return;
  std::vector<double> bubbles;
  for (int st = 0; st < dims.pp; ++st) bubbles.push_back(all[3 * st].item<double>());
  std::ofstream(cfg.out_dir + "/pipeline_timeline.jsonl", std::ios::app)
      << parallel::pp::timeline_json(events, dims.pp, cfg.grad_accum, m.step, bubbles).dump() << "\n";
}

double Trainer::State::evaluate() {
  at::NoGradGuard no_grad;
  double sum = 0;
  if (pipeline) {  // the last stage computes the losses; the sum reaches every stage
    auto t = pipeline->evaluate(cfg.data.eval_batches, stage_calls(*val_loader, 0, 1.0)).to(at::kCPU).reshape({1});
    dims.pp_comm->all_reduce(t);
    sum = t.item<double>();
  }
  for (int64_t m = 0; !pipeline && m < cfg.data.eval_batches; ++m) {
    auto batch = val_loader->batch(m, device);
    sum += model->loss(forward(batch.inputs), batch.targets).item<double>();
  }
  auto total = at::tensor({sum}, at::kDouble);
  dims.dp_comm->all_reduce(total);
  return total.item<double>() / (cfg.data.eval_batches * dims.dp);
}

nlohmann::json Trainer::State::checkpoint_state() const {
  const int64_t windows = cfg.grad_accum * dims.dp;
  nlohmann::json j = {
      {"global_batch_windows", windows},
      {"micro_batch", cfg.micro_batch},
      {"seq_len", cfg.data.seq_len},
      {"skipped_steps", scaler.state().skipped_steps},
      {"unit_loss_scales", scaler.state().unit_scales},
      {"layout", {{"world", dims.world->size()}, {"dp", dims.dp}, {"tp", dims.tp}, {"pp", dims.pp},
                  {"zero_stage", cfg.zero.stage},
                  {"dtype", cfg.bf16 ? "bf16" : cfg.fp16.enabled ? "fp16" : cfg.float64_for_tests ? "fp64" : "fp32"}}},
      {"config", nlohmann::json::parse(config_to_json(cfg))}};
  if (const auto st = scaler.state().dynamic) {
    j["loss_scaler"] = {{"scale", st->scale}, {"hysteresis_left", st->hysteresis_left}, {"iteration", st->iteration},
                        {"last_overflow_iteration", st->last_overflow_iteration}};
  }
  return j;
}

void Trainer::State::save_checkpoint_at(int64_t step) {
  auto state = checkpoint_state();
  // The data position: the loader's next micro-step, in windows of micro_batch x seq_len over dp.
  state["windows_consumed"] = (step * cfg.grad_accum + data_offset) * dims.dp;
  state["tokens_consumed"] = state["windows_consumed"].get<int64_t>() * cfg.micro_batch * cfg.data.seq_len;
  const auto t0 = Clock::now();
  save_checkpoint(cfg.out_dir, step, *strategy, *model, dims, state, cfg.checkpoint_keep, !resumed && !saved_once);
  saved_once = true;
  char line[160];
  std::snprintf(line, sizeof line, "shardlm: checkpoint of step %lld saved in %.3f s", static_cast<long long>(step),
                std::chrono::duration<double>(Clock::now() - t0).count());
  log(line);
}

void Trainer::State::resume_from_checkpoint() {
  const auto t0 = Clock::now();
  const auto loaded = load_checkpoint(cfg.out_dir, *strategy, *model, dims, [this](const std::string& l) {
    if (logging()) std::fprintf(stderr, "%s\n", l.c_str());
  });
  if (!loaded) return;
  char line[160];
  std::snprintf(line, sizeof line, "shardlm: checkpoint of step %lld verified and loaded in %.3f s",
                static_cast<long long>(loaded->step), std::chrono::duration<double>(Clock::now() - t0).count());
  log(line);
  const auto& meta = loaded->meta;
  if (cfg.steps < loaded->step)
    fail("out_dir '", cfg.out_dir, "' holds a checkpoint at step ", loaded->step, ", beyond --steps=", cfg.steps,
         ": its weights cannot be relabelled as an earlier step. Pass --steps >= ", loaded->step,
         " to continue it, or --resume=false (or another out_dir) to start over");
  resumed = true;
  resumed_dir = loaded->dir;
  start_step = loaded->step;
  precision::GradScaler::State saved{meta.value("skipped_steps", int64_t{0}),
                                     meta.value("unit_loss_scales", std::vector<double>{}), std::nullopt};
  if (meta.contains("loss_scaler")) {
    const auto& ls = meta["loss_scaler"];
    saved.dynamic = precision::LossScaler::State{ls.at("scale").get<double>(), ls.at("hysteresis_left").get<int>(),
                                                 ls.at("iteration").get<int64_t>(),
                                                 ls.at("last_overflow_iteration").get<int64_t>()};
  }
  scaler.restore(saved);
  const auto& layout = meta.at("layout");
  const int64_t windows = cfg.grad_accum * dims.dp;
  if (layout.at("dp") != dims.dp || layout.at("tp") != dims.tp || layout.at("pp") != dims.pp ||
      layout.at("zero_stage") != cfg.zero.stage)
    log("shardlm: checkpoint layout dp=" + layout.at("dp").dump() + " tp=" + layout.at("tp").dump() +
        " pp=" + layout.at("pp").dump() + " ZeRO " + layout.at("zero_stage").dump() + " resharded to dp=" +
        std::to_string(dims.dp) + " tp=" + std::to_string(dims.tp) + " pp=" + std::to_string(dims.pp) + " ZeRO " +
        std::to_string(cfg.zero.stage));
  // Where this layout's data order would be at start_step, against the tokens the checkpoint read.
  const int64_t consumed = meta.value("tokens_consumed", start_step * windows * cfg.micro_batch * cfg.data.seq_len);
  const int64_t per_micro_step = dims.dp * cfg.micro_batch * cfg.data.seq_len;
  if (consumed != start_step * cfg.grad_accum * per_micro_step) {
    data_offset = consumed / per_micro_step - start_step * cfg.grad_accum;
    log("shardlm: the global batch changed (" + meta.value("global_batch_windows", nlohmann::json()).dump() + " windows of " +
        meta.value("micro_batch", nlohmann::json()).dump() + "x" + meta.value("seq_len", nlohmann::json()).dump() +
        " tokens per step, now " + std::to_string(windows) + " of " + std::to_string(cfg.micro_batch) + "x" +
        std::to_string(cfg.data.seq_len) + "): continuing from the " + std::to_string(consumed) +
        " tokens the checkpoint consumed, at token " + std::to_string((consumed / per_micro_step) * per_micro_step) +
        (consumed % per_micro_step ? " (rounded down to a whole step of this layout)" : "") + " (README: Data order)");
  }
}

void Trainer::State::save_final() {
  // Every rank takes part in gathering the shards (ZeRO's fp32 masters, TP's pieces) into HF tensors.
  const auto tensors = strategy->full_parameters();
  if (!(resumed && start_step == cfg.steps)) save_checkpoint_at(cfg.steps);  // else that checkpoint is this state
  if (!logging()) return;
  io::save_safetensors(cfg.out_dir + "/model.safetensors", tensors, {{"format", "pt"}});
  model::write_hf_config(cfg.out_dir + "/config.json", cfg.model);
  if (!cfg.data.tokenizer.empty())
    fs::copy_file(cfg.data.tokenizer, cfg.out_dir + "/tokenizer.model", fs::copy_options::overwrite_existing);
  log("shardlm: saved " + cfg.out_dir + "/model.safetensors and config.json (a Hugging Face model directory)");
}

// Bytes of model state this rank holds, by category; rank 0 prints them and writes memory.json.
void Trainer::State::write_memory_report(bool print) {
  const auto m = strategy->memory();
  nlohmann::json j = {{"stage", cfg.zero.stage},
                      {"compute_params", m.compute_params},
                      {"gradients", m.gradients},
                      {"master_params", m.master_params},
                      {"optimizer_states", m.optimizer_states},
                      {"gathered_peak", m.gathered_peak},
                      {"padding_elements", m.padding_elements}};
  const int64_t psi = model->num_parameters();  // held on this rank: a shard under tensor parallelism
  j["parameters"] = model_parameters;
  j["parameters_held"] = psi;
  j["tp_size"] = dims.tp;
  j["sequence_parallel"] = cfg.parallelism.sequence_parallel;
  j["activations_measured"] = activations_measured;
  j["activations_held"] = activations_held;
  j["dp_size"] = dims.dp;
  j["device"] = device.str();
  const auto dm = device_memory(device);  // GPU allocator counters; zeros on the CPU
  j["device_allocated_after_init"] = device_allocated_after_init;
  j["device_reserved_after_init"] = device_reserved_after_init;
  j["device_peak_allocated"] = dm.peak_allocated;
  j["device_peak_reserved"] = dm.peak_reserved;
  j["compute_dtype"] = cfg.bf16 ? "bf16" : cfg.fp16.enabled ? "fp16" : "fp32";
  j["total_model_states"] = j["compute_params"].get<int64_t>() + j["gradients"].get<int64_t>() +
                            j["master_params"].get<int64_t>() + j["optimizer_states"].get<int64_t>();
  if (!logging()) return;
  std::ofstream(cfg.out_dir + "/memory.json") << j.dump(2) << "\n";
  if (!print) return;  // the end-of-run rewrite only updates the measured numbers
  // The planner's prediction for this very run, for the report and for checking the planner.
  const auto planned = plan::make_plan(plan_request(cfg, dims.world->size(), cfg.zero.stage, cfg.micro_batch));
  std::ofstream(cfg.out_dir + "/plan.json") << plan::plan_to_json(planned).dump(2) << "\n";
  char line[256];
  const auto size = [&](const char* key) { return util::format_bytes(double(j[key].get<int64_t>())); };
  std::snprintf(line, sizeof line,
                "shardlm: model states per rank: params %s, grads %s, fp32 master %s, optimizer %s = %s (%.2f bytes/param)",
                size("compute_params").c_str(), size("gradients").c_str(), size("master_params").c_str(),
                size("optimizer_states").c_str(), size("total_model_states").c_str(),
                double(j["total_model_states"].get<int64_t>()) / psi);
  log(line);
}

void Trainer::State::record_rank_memory(observe::StepMetrics& m) const {
  const int n = dims.world->size();
  const auto mine = at::tensor({static_cast<double>(peak_resident_bytes()),
                                static_cast<double>(device_memory(device).peak_allocated)}, at::kDouble);
  auto all = at::empty({2 * n}, at::kDouble);
  dims.world->all_gather(mine, all);
  std::vector<double> rss(n), gpu(n);
  for (int r = 0; r < n; ++r) {
    rss[r] = all[2 * r].item<double>();
    gpu[r] = all[2 * r + 1].item<double>();
  }
  observe::record_rank_memory(observe::kPeakRss, rss, m);
  if (device.is_cuda()) observe::record_rank_memory(observe::kDevicePeakAllocated, gpu, m);
}

TrainResult Trainer::run() {
  auto& s = *s_;
  const auto& cfg = s.cfg;
  TrainResult result;
  const int64_t tokens_per_step = cfg.micro_batch * cfg.data.seq_len * cfg.grad_accum * s.dims.dp;
  const auto t_start = Clock::now();
  for (int64_t step = s.start_step; step < cfg.steps; ++step) {
    const auto t0 = Clock::now();
    reset_peak_resident();  // the step's own peak RSS (record_rank_memory)
    s.dims.dp_comm->reset_stats();
    if (s.dims.tp > 1) s.dims.tp_comm->reset_stats();
    if (s.dims.pp > 1) s.dims.pp_comm->reset_stats();
    if (s.pipeline)
      for (const auto& group : s.pipeline->groups()) group->reset_stats();
    for (const auto& [prefix, group] : s.strategy->extra_groups()) group->reset_stats();
    if (!s.scaler.unit_scales().empty()) s.strategy->set_unit_loss_scales(s.scaler.unit_scales());
    auto loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(s.device));
    parallel::pp::StageTimes stage_times;
    PhaseTimer phases(s.device);
    if (s.pipeline) {
      // Activations held by this stage after each forward: every step on the CPU; on a GPU the first
      // step only (the probe resets the allocator's peaks, which memory.json reports for the run).
      ActivationProbe probe(s.device);
      auto calls = s.stage_calls(*s.train_loader, step * cfg.grad_accum + s.data_offset,
                                 s.scaler.loss_scale() / static_cast<double>(cfg.grad_accum));
      if (s.device.is_cpu() || step == s.start_step) {
        probe.start();
        calls.held_bytes = [&probe] { return probe.held_now(); };
      }
      if (s.device.is_cuda()) calls.synchronize = [&s] { synchronize(s.device); };
      loss_sum = s.pipeline->train(s.pipeline_schedule, cfg.grad_accum, calls, &stage_times);
    }
    for (int64_t micro = 0; !s.pipeline && micro < cfg.grad_accum; ++micro) {
      const auto batch = s.train_loader->batch(step * cfg.grad_accum + s.data_offset + micro, s.device);
      const bool boundary = micro == cfg.grad_accum - 1;
      s.strategy->begin_micro_step(boundary);
      // The first micro-step of the process measures the activations (see ActivationProbe).
      const bool measure = step == s.start_step && micro == 0;
      ActivationProbe probe(s.device);
      if (measure) probe.start();
      phases.start();
      const auto loss = s.model->loss(s.forward(batch.inputs), batch.targets);
      phases.stop("forward");
      if (measure) s.activations_held = probe.held_now();
      phases.start();
      (loss * (s.scaler.loss_scale() / static_cast<double>(cfg.grad_accum))).backward();
      phases.stop("backward");
      if (measure) s.activations_measured = probe.peak_growth();
      // Summed where the loss lives: no host synchronisation inside the micro-step loop.
      loss_sum.add_(loss.detach().to(at::kDouble));
    }
    phases.start();
    s.strategy->finish_gradients(s.scaler.loss_scale());
    phases.stop("grad_sync");
    const bool check = parallel::consistency_due(cfg.debug.consistency_interval, step + 1);
    const double check_s = check ? parallel::check_consistency(*s.strategy, s.dims.world, step + 1, /*gradients=*/true) : 0;
    auto loss_t = loss_sum.to(at::kCPU).reshape({1});
    if (s.pipeline) s.dims.pp_comm->all_reduce(loss_t);  // from the last stage, which owns the loss
    s.dims.dp_comm->all_reduce(loss_t);

    observe::StepMetrics m;
    m.step = step + 1;
    m.loss = loss_t.item<double>() / (cfg.grad_accum * s.dims.dp);
    m.lr = s.schedule.lr_at(step);
    // The scaler reads the units' gradients (an all-reduce) only when it scales, i.e. in fp16.
    const auto unit_names = s.strategy->unit_names();
    const auto verdict = s.scaler.update(m.step, [&s] {
      std::vector<precision::UnitGradient> out;
      for (const auto& u : s.strategy->unit_grad_stats()) out.push_back({u.overflow, u.max_abs});
      return out;
    }, unit_names);
    for (const auto& [key, value] : s.scaler.metrics(unit_names)) m.extra[key] = value;
    if (!verdict.step) {
      s.strategy->skip_step();
      m.grad_norm = NAN;
      s.log("shardlm: step " + std::to_string(m.step) + " skipped: fp16 gradients overflowed in " + verdict.overflowed +
            "; loss scale now " + observe::format_number(s.scaler.loss_scale()));
    } else {
      phases.start();
      m.grad_norm = s.strategy->grad_norm();
      s.strategy->step(m.grad_norm, cfg.gradient_clipping, m.lr);
      phases.stop("optimizer");
    }
    if (check)
      m.extra["debug_consistency_s"] = check_s + parallel::check_consistency(*s.strategy, s.dims.world, step + 1, false);

    if (s.val_loader && ((cfg.eval_interval > 0 && m.step % cfg.eval_interval == 0) || m.step == cfg.steps))
      m.val_loss = s.evaluate();
    synchronize(s.device);  // GPU work still queued belongs to this step's time
    m.step_time_s = std::chrono::duration<double>(Clock::now() - t0).count();
    m.tokens_per_s = tokens_per_step / m.step_time_s;
    // Data-parallel collectives as comm_<op>_*, tensor-parallel ones as comm_tp_<op>_*, pipeline
    // sends and receives as comm_pp_<op>_* (several communicators under one prefix add up).
    auto record = [&m](const comm::Communicator& c, const std::string& prefix) {
      for (const auto& [op, st] : c.stats()) {
        m.extra[prefix + op + "_bytes"] += static_cast<double>(st.bytes);
        m.extra[prefix + op + "_wait_s"] += st.wait_seconds;
        m.extra[prefix + op + "_inflight_s"] += st.inflight_seconds;
      }
    };
    record(*s.dims.dp_comm, "comm_");
    if (s.dims.tp > 1) record(*s.dims.tp_comm, "comm_tp_");
    if (s.dims.pp > 1) record(*s.dims.pp_comm, "comm_pp_");
    if (s.pipeline)
      for (const auto& group : s.pipeline->groups()) record(*group, "comm_pp_");
    for (const auto& [prefix, group] : s.strategy->extra_groups()) record(*group, prefix);
    if (s.pipeline) s.record_stage_times(stage_times, m);
    phases.record(m);
    s.record_rank_memory(m);
    if (s.metrics) s.metrics->write(m);
    if (m.step % cfg.log_interval == 0 || m.step == cfg.steps || m.val_loss)
      s.log(observe::progress_line(m, cfg.steps, std::chrono::duration<double>(Clock::now() - t_start).count(),
                                   m.step - s.start_step));
    if (!std::isfinite(m.loss))
      fail(nonfinite_loss_message(cfg, m.loss, m.step, m.step == s.start_step + 1));
    result.history.push_back(m);
    if (cfg.checkpoint_interval > 0 && m.step % cfg.checkpoint_interval == 0 && m.step < cfg.steps)
      s.save_checkpoint_at(m.step);
  }
  s.save_final();
  s.write_memory_report(/*print=*/false);  // again, now with the peak gathered working set
  return result;
}

}  // namespace shardlm::train

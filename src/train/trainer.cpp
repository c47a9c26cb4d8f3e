#include "train/trainer.h"

#include <ATen/ATen.h>

#include <chrono>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>

#include <nlohmann/json.hpp>

#include "comm/checked_communicator.h"
#include "comm/flight_recorder.h"
#include "comm/job_world.h"
#include "comm/mpi_communicator.h"
#include "data/loader/data_loader.h"
#include "data/loader/data_position.h"
#include "data/loader/prefetch.h"
#include "data/loader/token_file.h"
#include "io/hf_weights.h"
#include "model/fp32_products.h"
#include "model/hf_export.h"
#include "model/llama.h"
#include "model/quant/quantized_base.h"
#include "observe/monitors.h"
#include "observe/rank_memory.h"
#include "observe/step_probes.h"
#include "optim/lr_schedule.h"
#include "parallel/consistency.h"
#include "parallel/context/context_parallel.h"
#include "parallel/expert/moe_step_stats.h"
#include "parallel/parallelize.h"
#include "parallel/stage_batches.h"
#include "plan/machine_profile.h"
#include "plan/planner.h"
#include "plan/time_model.h"
#include "precision/grad_scaler.h"
#include "report/diagnosis.h"
#include "train/checkpoint.h"
#include "train/config_options.h"
#include "train/lora_config.h"
#include "train/nonfinite.h"
#include "train/plan_check.h"
#include "train/preemption.h"
#include "util/device.h"
#include "util/error.h"
#include "util/out_dir_lock.h"
#include "util/process_memory.h"
#include "util/threads.h"

namespace shardlm::train {
namespace {
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
}  // namespace

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Maps a token file and checks it against the model's vocabulary (one pass, before any step).
std::shared_ptr<const data::Tokens> load_tokens(const std::string& path, const std::string& format,
                                                int64_t vocab_size) {
  auto tokens = std::make_shared<const data::Tokens>(data::read_tokens(path, data::parse_token_format(format)));
  data::check_token_ids(*tokens, vocab_size);
  return tokens;
}

// Hybrid sharding's shard group (parallel/parallel_dims.h): MiCS's or the configured size, or the
// data-parallel ranks of one node (gcd with dp; the smallest over all nodes); 0: no hybrid sharding.
int shard_group_size(const TrainConfig& cfg, comm::Communicator& world, c10::Device device) {
  if (cfg.zero.mics_shard_size > 0) return cfg.zero.mics_shard_size;
  if (!cfg.parallelism.hybrid_shard) return 0;
  if (cfg.parallelism.shard_group_size > 0) return cfg.parallelism.shard_group_size;
  const int tp = cfg.parallelism.tensor_parallel, dp = world.size() / (tp * cfg.parallelism.pipeline_parallel);
  auto g = at::full({1}, std::gcd(dp, std::max(1, comm::node_ranks() / tp)), at::TensorOptions(at::kLong).device(device));
  world.all_reduce(g, comm::ReduceOp::Min);
  return static_cast<int>(g.item<int64_t>());
}

// The training data: data.train, or the datasets of data.blend with their weights.
std::unique_ptr<data::DataLoader> train_loader(const TrainConfig& cfg, int rank, int world) {
  const auto& d = cfg.data;
  const data::DataLoader::Order order{d.shuffle, cfg.seed};
  if (d.blend.empty())
    return std::make_unique<data::DataLoader>(load_tokens(d.train, d.format, cfg.model.vocab_size), cfg.micro_batch,
                                              d.seq_len, rank, world, order);
  std::vector<data::DataLoader::Dataset> datasets;
  for (const auto& [weight, path] : d.blend)
    datasets.push_back({load_tokens(path, d.format, cfg.model.vocab_size), weight});
  return std::make_unique<data::DataLoader>(std::move(datasets), cfg.micro_batch, d.seq_len, rank, world, order);
}

}  // namespace

struct Trainer::State {
  TrainConfig cfg;
  c10::Device device = c10::Device(c10::kCPU);
  parallel::ParallelDims dims;
  bool quiet = false;
  std::unique_ptr<model::Llama> model;
  // What parallelize() built (DDP or ZeRO, under TP and/or PP or not); the loop never asks which.
  std::unique_ptr<parallel::Strategy> strategy;
  // The step's schedule (pipeline/schedule.h): the stages' order of forwards and backwards, one
  // stage without pipeline parallelism; every layout's micro-batches go through it.
  std::unique_ptr<parallel::pp::Pipeline> schedule;
  precision::Policy precision;
  int64_t model_parameters = 0;  // the whole model's (a TP shard or pipeline stage holds fewer)
  // machine_profile: the rates plan.json's predicted seconds are priced at (plan/time_model.h).
  std::optional<plan::MachineProfile> machine;
  // Loss scaling (fp16: one dynamic scale or one per unit; otherwise a scale of 1 that always steps).
  precision::GradScaler scaler;
  // The process's first micro-batch: the resident set's growth from the step's start to the end of
  // its backward (with pipelining, the stage's warm-up forwards included), and the allocator bytes in
  // use after its forward (what backward will read).
  int64_t activations_measured = 0;
  int64_t activations_held = 0;
  // GPU, once the strategy is built: bytes in tensors (the model states, nothing else) and bytes the
  // caching allocator holds (stage 3: plus the released units' blocks, kept for the next gathers).
  int64_t device_allocated_after_init = 0, device_reserved_after_init = 0;
  optim::LrSchedule lr_schedule;
  // The data loaders behind their prefetch threads (data/loader/prefetch.h).
  std::unique_ptr<data::BatchPrefetcher> train_batches, val_batches;
  std::unique_ptr<OutDirLock> out_dir_lock;  // the logging rank's, held while it writes out_dir
  // metrics.jsonl, TensorBoard, CSV (observe/monitors.h); declared after the lock, so its last
  // flush happens before the lock is released (report --watch stops when it is).
  std::unique_ptr<observe::MetricsStream> metrics;
  int64_t start_step = 0;  // optimizer steps already taken (resumed runs)

  bool logging() const { return dims.is_logging_rank(); }
  void log(const std::string& line) const {
    if (logging() && !quiet) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
  }
  double evaluate();
  // The calls the schedule makes into this rank's stage for a loader position (train or validation
  // batches starting at `first`).
  parallel::pp::StageCalls stage_calls(data::BatchPrefetcher& batches, int64_t first, double loss_multiplier);
  // Every group this step's traffic went over, with its metrics prefix.
  std::vector<std::pair<std::string, comm::CommPtr>> comm_groups() const;
  void save_final();
  // Sharded checkpoints (checkpoint.h): the trainer's own state beside the strategy's.
  bool resumed = false, saved_once = false;
  // Micro-steps added to the loader's position: a resume whose global batch differs from the
  // checkpoint's continues from the windows it consumed instead of this layout's step position.
  int64_t data_offset = 0;
  int64_t configured_accum = 0;  // the config's accumulation, before a resume on another dp scaled it
  data::DataLayout data_layout() const {
    return {dims.data_ranks(), cfg.micro_batch, cfg.data.seq_len, cfg.grad_accum, cfg.data.shuffle, cfg.seed,
            data::blend_text(cfg.data.blend)};
  }
  double data_seconds = 0;  // this step's batch assembly (stage_calls)
  // Times the elastic supervisor restarted this job before this attempt (cli/elastic.h).
  int64_t restarts = std::getenv("SHARDLM_RESTARTS") ? std::atoll(std::getenv("SHARDLM_RESTARTS")) : 0;
  std::string resumed_dir;
  nlohmann::json checkpoint_state() const;
  void save_checkpoint_at(int64_t step);
  // checkpoint_async: the save whose shards are being written behind training (checkpoint.h).
  PendingCheckpointPtr pending_checkpoint;
  int64_t pending_step = 0;
  void finish_pending_checkpoint();
  double checkpoint_stall = 0;  // seconds the loop spent on checkpoints since the last metrics record
  int64_t flight_recorded = 0;  // the flight recorder's count at the last metrics record
  void resume_from_checkpoint();
  void write_memory_report(bool print);
};

Trainer::Trainer(const TrainConfig& cfg, comm::CommPtr world, bool quiet) : s_(std::make_unique<State>()) {
  s_->cfg = cfg;
  s_->configured_accum = cfg.grad_accum;
  s_->quiet = quiet;
  s_->device = select_device(cfg.device);  // first: --device cuda without a GPU stops here
  // NCCL is bootstrapped over the launcher's (MPI) world and then carries every collective.
  world = comm::job_world(world, cfg.comm_backend() == "nccl", s_->device.index(), cfg.comm.timeout_s);
  cfg.validate_for(world->size());
  // Desync detection: every communicator split from here on checks its collectives (debug section).
  if (cfg.debug.check_collectives) world = comm::checked_communicator(world, world->rank());
  s_->dims = parallel::ParallelDims::build(world, 0, cfg.parallelism.tensor_parallel, cfg.parallelism.pipeline_parallel,
                                           shard_group_size(cfg, *world, s_->device), cfg.parallelism.expert_parallel,
                                           cfg.parallelism.context_parallel);
  // The shard group as resolved (a node's ranks by default), for the planner and train_config.json.
  if (s_->dims.hybrid() && cfg.zero.mics_shard_size <= 0) s_->cfg.parallelism.shard_group_size = s_->dims.shard;
  model::set_bf16_products(model::parse_bf16_products(cfg.bf16_cpu_products));
  check_plan_fits(s_->cfg, world->size());
  if (!cfg.machine_profile.empty()) s_->machine = plan::read_machine_profile(cfg.machine_profile);
  // Data first: a bad token file stops the run before out_dir is created or locked.
  const auto& mc = cfg.model;
  const int prefetch = static_cast<int>(cfg.data.prefetch);
  s_->train_batches = std::make_unique<data::BatchPrefetcher>(train_loader(cfg, s_->dims.data_rank(), s_->dims.data_ranks()),
                                                              prefetch, s_->device);
  if (!cfg.data.val.empty())
    s_->val_batches = std::make_unique<data::BatchPrefetcher>(
        std::make_unique<data::DataLoader>(load_tokens(cfg.data.val, cfg.data.format, mc.vocab_size), cfg.micro_batch,
                                           cfg.data.seq_len, s_->dims.data_rank(), s_->dims.data_ranks()),
        prefetch, s_->device);
  if (s_->logging()) s_->out_dir_lock = std::make_unique<OutDirLock>(cfg.out_dir);  // before anything is written
  const int threads = util::configure_threads(cfg.threads);

  // Initialised (or loaded) on the CPU, so every device starts from the same weights; the strategy
  // below moves them to the device.
  s_->precision = precision_of(cfg);
  s_->model = std::make_unique<model::Llama>(mc, cfg.seed, s_->precision.parameters);
  if (!cfg.init.empty()) {
    std::string weights;
    const auto tensors = io::load_hf_weights(cfg.init, &weights);
    s_->model->load(tensors, weights);
    check_finite_weights(*s_->model, weights);
  }
  // LoRA (train/lora_config.h): the base becomes frozen, the adapters are what every strategy trains.
  if (cfg.lora.enabled) {
    const int64_t all = s_->model->num_parameters();
    train::apply_lora(*s_->model, cfg.lora, cfg.seed);
    s_->log("shardlm: LoRA, " + std::to_string(s_->model->lora_plan().targets.size()) + " adapted linears, " +
        std::to_string(s_->model->num_parameters()) + " trainable parameters of " + std::to_string(all) +
        " (the base frozen: " + std::to_string(s_->model->frozen_base()->bytes()) + " bytes before any split)");
    // QLoRA: the decoder's linears of the frozen base kept in bitsandbytes' 4-bit form (model/quant/).
    if (cfg.quantization.load_in_4bit) {
      const auto q = model::quant::quantize_frozen_base(
          *s_->model->frozen_base(), {model::quant::parse_four_bit_type(cfg.quantization.bnb_4bit_quant_type),
                                      cfg.quantization.bnb_4bit_use_double_quant, s_->precision.compute});
      s_->model->set_frozen_base(q);
      s_->log("shardlm: QLoRA, the base's decoder linears in " + cfg.quantization.bnb_4bit_quant_type +
              (cfg.quantization.bnb_4bit_use_double_quant ? " with double quantization" : "") + ": " +
              std::to_string(q->quantized_bytes()) + " bytes (" + std::to_string(q->quantized_bf16_bytes()) +
              " in bf16); the base now holds " + std::to_string(q->bytes()) + " bytes");
    }
  }
  s_->model->set_attention(attention_for(cfg));
  s_->lr_schedule = lr_schedule(cfg);
  s_->scaler = precision::GradScaler(grad_scaler_options(cfg), s_->model->units().size());
  const bool resuming = cfg.resume && has_checkpoint(cfg.out_dir);
  s_->model_parameters = s_->model->num_parameters();  // before TP / PP keep a part
  auto parallelized = parallel::parallelize(*s_->model, s_->dims, parallelize_options(cfg, s_->device));
  s_->strategy = std::move(parallelized.strategy);
  s_->schedule = std::move(parallelized.schedule);
  // The frozen base is no parameter of any strategy: it goes to the device in the compute dtype here.
  if (const auto& base = s_->model->frozen_base()) base->to(s_->device, s_->precision.compute);
  // Every rank reads the same checkpoint files, so the ranks still agree after the load.
  if (resuming) s_->resume_from_checkpoint();

  const auto built = device_memory(s_->device);
  s_->device_allocated_after_init = built.allocated;
  s_->device_reserved_after_init = built.reserved;
  if (s_->logging()) {
    fs::create_directories(cfg.out_dir);
    std::ofstream(cfg.out_dir + "/train_config.json") << config_to_json(cfg) << "\n";
    s_->metrics = observe::open_metrics(cfg.out_dir, s_->start_step, {cfg.tensorboard, cfg.csv_monitor, cfg.log_interval});
    if (s_->start_step == 0) fs::remove(cfg.out_dir + "/" + parallel::pp::kTimelineFile);  // an earlier run's
  }
  char line[512];
  const std::string cp_ranks = s_->dims.cp > 1 ? " cp=" + std::to_string(s_->dims.cp) : "";  // context parallelism
  std::snprintf(line, sizeof line,
                "shardlm: model %s, %.2fM parameters | %d rank(s) (dp=%d%s tp=%d pp=%d), %d thread(s) each | micro-batch %lld x "
                "seq %lld x accumulation %lld x dp %d = %lld tokens/step | %lld steps | ",
                s_->cfg.model_preset.c_str(), s_->model_parameters / 1e6,
                world->size(), s_->dims.data_ranks(),
                cp_ranks.c_str(), s_->dims.tp, s_->dims.pp, threads,
                static_cast<long long>(cfg.micro_batch), static_cast<long long>(cfg.data.seq_len),
                static_cast<long long>(cfg.grad_accum), s_->dims.data_ranks(),
                static_cast<long long>(cfg.micro_batch * cfg.data.seq_len * cfg.grad_accum * s_->dims.data_ranks()),
                static_cast<long long>(cfg.steps));
  // The strategy's description is appended whole: with offload and hybrid groups it outgrows any buffer.
  s_->log(line + s_->strategy->describe());
  for (const auto& notice : cfg.notices) s_->log("shardlm: config: " + notice);  // DeepSpeed keys (config_deepspeed.h)
  s_->log(std::string("shardlm: device ") + s_->device.str() + ", communicator " + cfg.comm_backend() +
          ", attention " + model::attention_name(s_->model->attention()) + ", activation checkpointing " +
          model::recompute_name(s_->model->recompute()));
  for (const std::string& line : {s_->schedule->describe(cfg.grad_accum), s_->precision.describe_products(s_->device)})
    if (!line.empty()) s_->log("shardlm: " + line);
  if ((cfg.parallelism.hybrid_shard || cfg.zero.mics_shard_size > 0) && !s_->dims.hybrid())
    s_->log("shardlm: hybrid sharding: one shard group holds all " + std::to_string(s_->dims.dp) +
            " data-parallel ranks (one node), so ZeRO shards over all of them with no replicas");
  if (!cfg.data.blend.empty()) s_->log("shardlm: data blend (weight, file): " + data::blend_text(cfg.data.blend));
  s_->write_memory_report(/*print=*/true);
  if (s_->start_step > 0)
    s_->log("shardlm: resumed from " + s_->resumed_dir + " after step " + std::to_string(s_->start_step));
}

Trainer::~Trainer() = default;

model::Llama& Trainer::model() { return *s_->model; }
parallel::ModelStateMemory Trainer::memory() const { return s_->strategy->memory(); }

parallel::pp::StageCalls Trainer::State::stage_calls(data::BatchPrefetcher& source, int64_t first,
                                                     double loss_multiplier) {
  auto batches = parallel::stage_batches(source, first, &data_seconds);  // time_data_s
  if (dims.cp > 1)  // this rank's chunks of every sequence (parallel/context/context_parallel.h)
    batches = [batches, c = dims.cp, r = dims.cp_rank()](int64_t m) {
      return parallel::context::split_batch(batches(m), c, r);
    };
  return parallel::stage_calls(*model, *strategy, batches, cfg.data.seq_len / dims.cp, loss_multiplier);
}

std::vector<std::pair<std::string, comm::CommPtr>> Trainer::State::comm_groups() const {
  auto groups = dims.metric_groups();
  for (const auto& group : schedule->groups()) groups.emplace_back("comm_pp_", group);
  for (const auto& group : strategy->extra_groups()) groups.push_back(group);
  return groups;
}

double Trainer::State::evaluate() {
  at::NoGradGuard no_grad;
  // The last stage computes the losses; the schedule's sum reaches every stage.
  auto total = schedule->evaluate(cfg.data.eval_batches, stage_calls(*val_batches, 0, 1.0));
  dims.dp_comm->all_reduce(total);
  return total.item<double>() / (cfg.data.eval_batches * dims.dp);
}

nlohmann::json Trainer::State::checkpoint_state() const {
  nlohmann::json j = data::checkpoint_meta(data_layout(), configured_accum);  // data_position.h
  j.update({{"layout", dims.layout_json(cfg.zero.stage, precision.name)},  // parallel_dims.h
            {"config", nlohmann::json::parse(config_to_json(cfg))}});
  j.update(scaler.state_json());  // skipped_steps, unit_loss_scales, loss_scaler
  return j;
}

void Trainer::State::save_checkpoint_at(int64_t step) {
  auto state = checkpoint_state();
  // The data position: the global index of the next sample (window of micro_batch x seq_len), which
  // alone fixes the window it reads on any number of data-parallel ranks (data_loader.h).
  state["windows_consumed"] = (step * cfg.grad_accum + data_offset) * dims.data_ranks();
  state["tokens_consumed"] = state["windows_consumed"].get<int64_t>() * cfg.micro_batch * cfg.data.seq_len;
  finish_pending_checkpoint();  // the previous asynchronous save is committed first (its own stall)
  const auto t0 = Clock::now();
  char line[200];
  if (cfg.checkpoint_async) {
    pending_checkpoint = begin_checkpoint(cfg.out_dir, step, *strategy, *model, dims, state, cfg.checkpoint_keep,
                                          !resumed && !saved_once);
    pending_step = step;
    std::snprintf(line, sizeof line, "shardlm: checkpoint of step %lld: state copied in %.3f s, written in the background",
                  static_cast<long long>(step), std::chrono::duration<double>(Clock::now() - t0).count());
  } else {
    save_checkpoint(cfg.out_dir, step, *strategy, *model, dims, state, cfg.checkpoint_keep, !resumed && !saved_once);
    std::snprintf(line, sizeof line, "shardlm: checkpoint of step %lld saved in %.3f s", static_cast<long long>(step),
                  std::chrono::duration<double>(Clock::now() - t0).count());
  }
  saved_once = true;
  checkpoint_stall += std::chrono::duration<double>(Clock::now() - t0).count();
  log(line);
}

void Trainer::State::finish_pending_checkpoint() {
  if (!pending_checkpoint) return;
  const auto t0 = Clock::now();
  const double waited = finish_checkpoint(std::move(pending_checkpoint));
  checkpoint_stall += std::chrono::duration<double>(Clock::now() - t0).count();
  char line[160];
  std::snprintf(line, sizeof line, "shardlm: checkpoint of step %lld committed (the step waited %.3f s for its writer)",
                static_cast<long long>(pending_step), waited);
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
  scaler.restore_json(meta);
  const std::string saved = parallel::ParallelDims::grid_text(meta.at("layout")),
                    now = parallel::ParallelDims::grid_text(dims.layout_json(cfg.zero.stage, precision.name));
  if (saved != now) log("shardlm: checkpoint layout " + saved + " resharded to " + now);
  // The same global samples on another data-parallel size; where the data order continues.
  const auto resumed_data = data::resume_data(meta, start_step, data_layout());
  cfg.grad_accum = resumed_data.accumulation;
  data_offset = resumed_data.micro_step_offset;
  for (const auto& note : resumed_data.notes) log("shardlm: " + note);
}

void Trainer::State::save_final() {
  // Every rank takes part in gathering the shards (ZeRO's fp32 masters, TP's pieces) into HF tensors.
  const auto tensors = strategy->full_parameters();
  if (!(resumed && start_step == cfg.steps)) save_checkpoint_at(cfg.steps);  // else that checkpoint is this state
  finish_pending_checkpoint();
  if (!logging()) return;
  if (cfg.lora.enabled) {  // a PEFT adapter directory (PeftModel.from_pretrained reads it)
    write_peft_adapter_dir(cfg.out_dir, *model, tensors, cfg.init);
    log("shardlm: saved " + cfg.out_dir + "/adapter_model.safetensors and adapter_config.json (a PEFT adapter)");
    return;
  }
  model::write_hf_model_dir(cfg.out_dir, tensors, cfg.model, cfg.data.tokenizer);  // with the tokenizer
  log("shardlm: saved " + cfg.out_dir + "/model.safetensors and config.json (a Hugging Face model directory)");
}

// Bytes of model state this rank holds, by category; rank 0 prints them and writes memory.json.
void Trainer::State::write_memory_report(bool print) {
  const auto m = strategy->memory();
  nlohmann::json j = m.to_json();
  const int64_t held = model->num_parameters();  // held on this rank: a shard under tensor parallelism
  const auto dm = device_memory(device);         // GPU allocator counters; zeros on the CPU
  j.update({{"stage", cfg.zero.stage}, {"parameters", model_parameters}, {"parameters_held", held},
            {"tp_size", dims.tp}, {"sequence_parallel", cfg.parallelism.sequence_parallel},
            {"activations_measured", activations_measured}, {"activations_held", activations_held},
            {"dp_size", dims.dp}, {"device", device.str()}, {"device_allocated_after_init", device_allocated_after_init},
            {"device_reserved_after_init", device_reserved_after_init}, {"device_peak_allocated", dm.peak_allocated},
            {"device_peak_reserved", dm.peak_reserved}, {"compute_dtype", precision.name},
            {"frozen_base", model->frozen_base() ? model->frozen_base()->bytes() : 0}});
  if (!logging()) return;
  std::ofstream(cfg.out_dir + "/memory.json") << j.dump(2) << "\n";
  if (!print) return;  // the end-of-run rewrite only updates the measured numbers
  // The planner's prediction for this very run, for the report and for checking the planner.
  const auto planned = plan::make_plan(plan_request(cfg, dims.world->size(), cfg.zero.stage, cfg.micro_batch));
  auto plan_json = plan::plan_to_json(planned);
  if (machine) {
    plan_json["predicted"] = plan::to_json(plan::predict_step_time(planned, cfg.zero.stage, *machine));
    plan_json["predicted"]["machine"] = machine->description;
  }
  std::ofstream(cfg.out_dir + "/plan.json") << plan_json.dump(2) << "\n";
  log("shardlm: " + m.describe(held));
}

TrainResult Trainer::run() {
  auto& s = *s_;
  const auto& cfg = s.cfg;
  TrainResult result;
  const int64_t tokens_per_step = cfg.micro_batch * cfg.data.seq_len * cfg.grad_accum * s.dims.data_ranks();
  const auto t_start = Clock::now();
  for (int64_t step = s.start_step; step < cfg.steps; ++step) {
    const auto t0 = Clock::now();
    const double cpu0 = process_cpu_seconds();
    reset_peak_resident();  // the step's own peak RSS (gather_rank_memory)
    for (const auto& [prefix, group] : s.comm_groups()) group->reset_stats();
    if (!s.scaler.unit_scales().empty()) s.strategy->set_unit_loss_scales(s.scaler.unit_scales());
    observe::PhaseTimer phases(s.device);
    s.data_seconds = 0;
    // Forwards and backwards of the step's micro-batches in the schedule's order, their activations
    // probed (step_probes.h: every step on the CPU, the first on a GPU, whose first micro-batch
    // gives memory.json's activations).
    parallel::pp::StageTimes stage_times;
    observe::ActivationProbe probe(s.device);
    auto calls = s.stage_calls(*s.train_batches, step * cfg.grad_accum + s.data_offset,
                               s.scaler.loss_scale() / static_cast<double>(cfg.grad_accum));
    auto probed = probe.step_calls(s.device.is_cpu(), step == s.start_step, &s.activations_held, &s.activations_measured);
    calls.held_bytes = std::move(probed.held_bytes);
    calls.after_forward = std::move(probed.after_forward);
    calls.after_backward = std::move(probed.after_backward);
    if (s.device.is_cuda()) calls.synchronize = [&s] { synchronize(s.device); };
    auto loss_t = s.schedule->train(cfg.grad_accum, calls, &stage_times);
    phases.add("forward", stage_times.seconds(parallel::pp::StageEvent::Forward));
    phases.add("backward", stage_times.seconds(parallel::pp::StageEvent::Backward) +
                               stage_times.seconds(parallel::pp::StageEvent::BackwardWeight));  // zb_h1's W
    phases.start();
    s.strategy->finish_gradients(s.scaler.loss_scale());
    phases.stop("grad_sync");
    const bool check = parallel::consistency_due(cfg.debug.consistency_interval, step + 1);
    const double check_s = check ? parallel::check_consistency(*s.strategy, s.dims.world, step + 1, /*gradients=*/true) : 0;
    s.dims.dp_comm->all_reduce(loss_t);
    observe::StepMetrics m;
    m.step = step + 1;
    m.loss = loss_t.item<double>() / (cfg.grad_accum * s.dims.dp);
    // MoE: router counts and load-balancing losses, summed over the layout's groups (parallel/expert/moe_step_stats.h).
    for (const auto& [key, value] : parallel::moe_step_metrics(*s.model, s.dims, cfg.parallelism.sequence_parallel))
      m.extra[key] = value;
    m.lr = s.lr_schedule.lr_at(step);
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
    synchronize(s.device);  // GPU work still queued belongs to this step's time
    // The training step's time, throughput and batch assembly; an evaluation after it is timed apart
    // (eval_time_s), so tokens/s does not drop on evaluation steps.
    m.step_time_s = std::chrono::duration<double>(Clock::now() - t0).count();
    // The process's CPU seconds (every thread) of the step: what a step costs on a host shared with
    // other work, whose wall time measures the sharing as much (bench/lora.py).
    m.extra["step_cpu_s"] = process_cpu_seconds() - cpu0;
    m.tokens_per_s = tokens_per_step / m.step_time_s;
    m.extra["time_data_s"] = s.data_seconds;
    if (s.val_batches && ((cfg.eval_interval > 0 && m.step % cfg.eval_interval == 0) || m.step == cfg.steps)) {
      const auto e0 = Clock::now();
      m.val_loss = s.evaluate();
      synchronize(s.device);
      m.extra["eval_time_s"] = std::chrono::duration<double>(Clock::now() - e0).count();
    }
    // Data-parallel collectives as comm_<op>_*, tensor-parallel ones as comm_tp_<op>_*, pipeline
    // sends and receives as comm_pp_<op>_* (several communicators under one prefix add up).
    for (const auto& [prefix, group] : s.comm_groups()) observe::record_comm_stats(*group, prefix, m);
    // The schedule's own numbers (pipeline bubbles; the timeline of the first three steps and the last).
    const auto report = s.schedule->report(stage_times, cfg.grad_accum, m.step,
                                           m.step - s.start_step <= 3 || m.step == cfg.steps);
    for (const auto& [key, value] : report.metrics) m.extra[key] = value;
    if (report.timeline && s.logging())
      std::ofstream(cfg.out_dir + "/" + parallel::pp::kTimelineFile, std::ios::app) << report.timeline->dump() << "\n";
    phases.record(m);
    if (s.restarts > 0) m.extra["restarts"] = static_cast<double>(s.restarts);  // cli/elastic.h
    if (s.checkpoint_stall > 0) m.extra["checkpoint_stall_s"] = s.checkpoint_stall, s.checkpoint_stall = 0;
    observe::gather_rank_memory(*s.dims.world, s.device, m);
    // The operations this rank's flight recorder recorded since the last record (one step's, its
    // memory gather included): bench/flight_recorder_cost.py multiplies them by one record's cost.
    if (comm::flight_recorder().enabled()) {
      const int64_t recorded = comm::flight_recorder().recorded();
      m.extra["flight_records"] = static_cast<double>(recorded - s.flight_recorded);
      s.flight_recorded = recorded;
    }
    if (s.metrics) s.metrics->write(m);
    if (m.step % cfg.log_interval == 0 || m.step == cfg.steps || m.val_loss)
      s.log(observe::progress_line(m, cfg.steps, std::chrono::duration<double>(Clock::now() - t_start).count(),
                                   m.step - s.start_step));
    if (!std::isfinite(m.loss))
      fail(nonfinite_loss_message(cfg, m.loss, m.step, m.step == s.start_step + 1));
    result.history.push_back(m);
    const auto end = step_end(m.step, cfg.steps, cfg.checkpoint_interval, *s.dims.world);  // or a stop signal
    if (end.checkpoint) s.save_checkpoint_at(m.step);
    if (end.stop_signal) return s.finish_pending_checkpoint(), s.log(stop_message(end.stop_signal, m.step, cfg.steps)), result;
  }
  if (s.metrics) s.metrics->flush();  // the monitors' last records, before the final save
  s.save_final();
  s.write_memory_report(/*print=*/false);  // again, now with the peak gathered working set
  // Where the step's time went and what to try (report/diagnosis.h), from the files just written.
  // The run itself is complete: a file the diagnosis cannot read is reported, not a failed run.
  if (s.logging() && s.metrics && cfg.steps - s.start_step > 0) {
    try {
      for (const auto& finding : observe::diagnose(observe::load_run(cfg.out_dir)).findings)
        s.log("shardlm: diagnosis: " + finding);
    } catch (const Error& e) {
      s.log(std::string("shardlm: diagnosis skipped: ") + e.what());
    }
  }
  return result;
}

}  // namespace shardlm::train

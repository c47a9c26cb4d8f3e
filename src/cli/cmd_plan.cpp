// `shardlm plan --model llama-7b --devices 8 --device-memory 32GB [...]`: predicted memory and
// communication per rank for each ZeRO stage (with --pp, per pipeline stage too), and a recommended
// strategy (see plan/planner.h).
// --emit-config writes that strategy as a training config: ZeRO stage, precision, activation
// checkpointing and the tensor / sequence / pipeline parallelism.
// `--lora-r R [--qlora]` plans a LoRA (QLoRA) run (plan/adapters.h); `--config FILE [--section.key=value]`
// plans a training config as the trainer does (its lora and quantization sections included).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "model/hf_config_keys.h"
#include "plan/machine_profile.h"
#include "plan/planner.h"
#include "plan/search.h"
#include "plan/time_model.h"
#include "train/config.h"
#include "train/plan_check.h"
#include "util/error.h"

namespace shardlm::cli {
namespace {

// The options a training config gives (`--config`): each flag that sets one of them is refused beside it.
const char* const kLayoutFlags[] = {"--model", "--params", "--micro-batch", "--seq-len", "--accumulation",
                                    "--gradient-clipping", "--tp", "--sp", "--pp", "--ep", "--cp", "--shard",
                                    "--schedule", "--vpp", "--pipeline-split", "--precision", "--optimizer-states",
                                    "--master-precision", "--master-rounding", "--min-8bit-size", "--recompute",
                                    "--attention", "--offload-optimizer", "--offload-param",
                                    "--offload-param-max-in-cpu", "--lora-r", "--lora-targets", "--qlora"};

// The trainer's plan request for a training config (train::plan_request) on `devices` ranks, at the
// config's ZeRO stage unless --zero-stage names one; --device-memory replaces the config's.
plan::PlanRequest request_from_config(const CLI::App& app, const std::string& path,
                                      const std::vector<std::string>& extras, int devices, int zero_stage) {
  for (const char* flag : kLayoutFlags)
    if (app.count(flag))
      fail(flag, " with --config: the config gives it; set its key in the config or override it as --section.key=value");
  std::vector<std::string> overrides;
  for (const auto& a : extras) {
    if (a.rfind("--", 0) != 0 || a.find('=') == std::string::npos)
      fail("unexpected argument '", a, "': with --config, config keys are overridden as --section.key=value");
    overrides.push_back(a.substr(2));
  }
  auto cfg = train::load_train_config(path, overrides);
  cfg.resolve_for(devices);
  auto r = train::plan_request(cfg, devices, zero_stage >= 0 ? zero_stage : cfg.zero.stage, cfg.micro_batch);
  r.model_name = cfg.model_preset.empty() ? "config:" + path : cfg.model_preset;
  return r;
}

// --lora-r, --lora-targets, --qlora and --config (with its --section.key=value overrides).
struct ExtraFlags {
  int64_t lora_r = -1;  // -1: not given
  std::vector<std::string> lora_targets;
  bool qlora = false;
  std::string config;
};
void add_extra_flags(CLI::App& app, ExtraFlags& f) {
  app.add_option("--lora-r", f.lora_r, "plan a LoRA run of this rank: the adapters train, the base is frozen (lora.r)");
  app.add_option("--lora-targets", f.lora_targets,
                 "with --lora-r: the adapted modules, e.g. q_proj,v_proj or all-linear (default: PEFT's for the model "
                 "type, lora.target_modules)")
      ->delimiter(',');
  app.add_flag("--qlora", f.qlora,
               "with --lora-r: the base's decoder linears in 4-bit NF4 with double quantization (QLoRA; the "
               "quantization section)");
  app.add_option("--config", f.config,
                 "plan this training config as the trainer would (its model, batch, precision, layout, lora and "
                 "quantization sections); override keys as --section.key=value")
      ->type_name("FILE");
  app.allow_extras();
}

// --lora-r R [--lora-targets ...] [--qlora]: a LoRA (QLoRA) run's request (plan/adapters.h).
void apply_lora_flags(plan::PlanRequest& r, const ExtraFlags& f) {
  const int64_t lora_r = f.lora_r;
  const auto& targets = f.lora_targets;
  const bool qlora = f.qlora;
  if (qlora && lora_r <= 0) fail("--qlora needs --lora-r R (the adapters' rank)");
  if (lora_r < 0 && targets.empty()) return;
  if (lora_r <= 0) fail("--lora-r must be > 0 (the adapters' rank), got ", lora_r);
  r.lora = true;
  r.lora_options.r = lora_r;
  r.lora_options.lora_alpha = static_cast<double>(2 * lora_r);  // no memory or time depends on it
  if (targets.size() == 1 && targets[0] == "all-linear") r.lora_options.target_regex = "all-linear";
  else r.lora_options.target_modules = targets;
  r.load_in_4bit = r.double_quant = qlora;  // QLoRA's NF4 with double quantization (the bytes of FP4 are the same)
}

// --emit-config: the recommendation as a training config, with the layout's offload.
void write_emitted_config(const plan::Plan& p, const std::string& emit_config, std::string nvme_path,
                          const plan::MachineProfile* machine, bool as_json) {
  auto config = plan::recommended_config(p);
  // The layout's offload (the recommendation itself knows none): where the files go.
  if (nvme_path.empty()) nvme_path = machine && !machine->disk_dir.empty() ? machine->disk_dir : "/var/tmp";
  if (p.request.offload_optimizer_nvme && p.recommended_stage >= 1)
    config["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", nvme_path}};
  if (p.request.offload_optimizer_host && p.recommended_stage >= 1)
    config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  if (p.request.offload_param_nvme && p.recommended_stage == 3)
    config["zero_optimization"]["offload_param"] = {
        {"device", "nvme"}, {"nvme_path", nvme_path}, {"max_in_cpu", p.request.offload_param_max_in_cpu}};
  std::ofstream out(emit_config);
  out << config.dump(2) << "\n";
  if (!out) fail("cannot write '", emit_config, "'");
  if (!as_json) std::printf("wrote %s\n", emit_config.c_str());
}

}  // namespace

int run_plan(int argc, char** argv) {
  // `plan --hf-keys`: every config.json key shardlm knows and what it does with it (alone: needs no plan).
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--hf-keys") {
      std::printf("%s", model::hf_config_keys_markdown().c_str());
      return 0;
    }
  CLI::App app{"Predict memory and communication per rank and recommend a strategy", "shardlm plan"};
  plan::PlanRequest r;
  std::string model = "llama-7b", device_memory, emit_config;
  double params = 0;
  bool as_json = false;
  app.add_option("--model", model, "preset (tiny, demo, llama-7b, llama-13b, llama-70b), an HF config.json or its directory");
  app.add_option("--params", params, "plan model states for a bare parameter count instead (e.g. 175e9)");
  app.add_option("--devices", r.devices, "number of devices (ranks)")->required();
  app.add_option("--device-memory", device_memory, "memory per device, e.g. 32GB or 80GiB");
  app.add_option("--micro-batch", r.micro_batch, "sequences per rank per micro-step");
  app.add_option("--seq-len", r.seq_len, "sequence length");
  app.add_option("--accumulation", r.accumulation, "gradient accumulation steps");
  app.add_option("--gradient-clipping", r.gradient_clipping,
                 "global norm limit (1.0; 0: no clipping): the time model prices clipping's pass over the gradients")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--zero-stage", r.zero_stage, "show one stage (default: all side by side)")->check(CLI::Range(0, 3));
  app.add_option("--tp", r.tp, "tensor-parallel size (Megatron layout; refused where the heads, MLP width or "
                 "vocabulary do not split)");
  app.add_flag("--sp,--sequence-parallel", r.sequence_parallel,
               "sequence parallelism: split the norms and residual stream over the tensor-parallel ranks");
  app.add_option("--pp", r.pp, "pipeline-parallel size (memory shown per pipeline stage)");
  app.add_option("--ep", r.ep, "expert parallelism (MoE models): each sparse layer's experts over this many "
                 "data-parallel ranks (parallelism.expert_parallel)");
  app.add_option("--cp", r.cp, "context parallelism: every sequence over this many data-parallel ranks, each holding "
                 "seq_len / cp positions plus the other ranks' K/V per layer (parallelism.context_parallel)");
  app.add_option("--cp-mode", r.cp_mode, "how context-parallel ranks exchange K/V: p2p (ring) | all_gather | "
                 "all_to_all (parallelism.context_parallel_mode)");
  app.add_option("--shard", r.shard, "hybrid sharding: ZeRO shards within groups of this many data-parallel ranks and "
                 "all-reduces gradients across groups (parallelism.shard_group_size; 0: over all of them)");
  app.add_option("--schedule", r.pipeline_schedule,
                 "pipeline schedule: 1f1b (stage s holds min(pp - s, m) micro-batches) | gpipe (all m) | "
                 "interleaved_1f1b (with --vpp model chunks per rank) | zb_h1 (backward split in B and W)")
      ->check(CLI::IsMember({"1f1b", "gpipe", "interleaved_1f1b", "zb_h1"}));
  app.add_option("--vpp,--virtual-pipeline", r.virtual_pipeline,
                 "model chunks per pipeline rank for interleaved_1f1b (parallelism.virtual_pipeline_parallel)");
  app.add_option("--pipeline-split", r.pipeline_split, "decoder layers per pipeline stage, e.g. 15,17 (default: balanced)")
      ->delimiter(',');
  app.add_option("--precision", r.precision, "bf16 | fp16 | fp32")->check(CLI::IsMember({"bf16", "fp16", "fp32"}));
  app.add_option("--optimizer-states", r.optimizer_state_precision,
                 "how Adam's moments are kept: fp32 | bf16 | 8bit (optimizer.state_precision)")
      ->check(CLI::IsMember({"fp32", "bf16", "8bit"}));
  app.add_option("--master-precision", r.master_precision,
                 "master weights: fp32 | bf16 (the bf16 shard is the master; optimizer.master_precision)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--master-rounding", r.master_rounding,
                 "bf16 masters: kahan (+2 bytes per parameter) | stochastic | nearest (optimizer.master_rounding)")
      ->check(CLI::IsMember({"kahan", "stochastic", "nearest"}));
  app.add_option("--min-8bit-size", r.min_8bit_size, "8bit: parameters with fewer elements keep fp32 moments (4096)")
      ->check(CLI::PositiveNumber);
  app.add_option("--recompute", r.recompute, "none | full | selective (activation checkpointing)")
      ->check(CLI::IsMember({"none", "full", "selective"}));
  std::string attention = "fused";
  app.add_option("--attention", attention, "fused (sdpa: flash / memory-efficient kernels) | eager (keeps heads x T^2)")
      ->check(CLI::IsMember({"fused", "eager"}));
  std::string offload_optimizer = "none", offload_param = "none", nvme_path;
  app.add_option("--offload-optimizer", offload_optimizer,
                 "none | nvme: the fp32 masters and Adam moments in files | cpu: in host memory, stepped by the host "
                 "(a GPU run's ZeRO-Offload) (zero_optimization.offload_optimizer.device; stages 1-3)")
      ->check(CLI::IsMember({"none", "nvme", "cpu"}));
  app.add_option("--offload-param", offload_param,
                 "none | nvme: stage 3's parameter shards in files (zero_optimization.offload_param.device)")
      ->check(CLI::IsMember({"none", "nvme"}));
  app.add_option("--offload-param-max-in-cpu", r.offload_param_max_in_cpu,
                 "with --offload-param nvme: elements of the first sharded units kept in memory (1e9)");
  app.add_option("--nvme-path", nvme_path,
                 "the offload directory --emit-config writes for an offloaded layout (default: the --machine "
                 "profile's measured disk, else /var/tmp)");
  ExtraFlags extra;
  add_extra_flags(app, extra);
  app.add_flag("--hf-keys", "print every HF config.json key shardlm knows (honoured or math-neutral) and exit");
  app.add_flag("--json", as_json, "print the plan as JSON (category names as in the trainer's memory.json)");
  app.add_option("--emit-config", emit_config, "write a training config for the recommendation to this file");
  std::string machine_path;
  bool search = false;
  size_t search_show = 10;
  app.add_option("--machine", machine_path,
                 "a machine profile from `shardlm bench machine --out FILE`: predict each stage's step time");
  app.add_flag("--search", search,
               "list every layout of the devices that fits (tp, sp, pp, ZeRO stage, micro-batch at the same global "
               "batch, recompute, NVMe offload), fastest predicted first with --machine, else smallest; --emit-config "
               "writes the first");
  app.add_option("--search-show", search_show, "layouts --search prints (10)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!extra.config.empty()) {
    r = request_from_config(app, extra.config, app.remaining(), r.devices, r.zero_stage);
    if (!device_memory.empty()) r.device_memory = plan::parse_bytes(device_memory);
  } else {
    if (!app.remaining().empty())
      fail("unexpected argument '", app.remaining().front(), "' (--section.key=value overrides need --config FILE)\n",
           app.help());
    r.fused_attention = attention == "fused";
    r.offload_optimizer_nvme = offload_optimizer == "nvme";
    r.offload_optimizer_host = offload_optimizer == "cpu";
    r.offload_param_nvme = offload_param == "nvme";
    if (r.offload_param_nvme && r.zero_stage >= 0 && r.zero_stage != 3)
      fail("--offload-param nvme needs ZeRO stage 3 (--zero-stage 3, or no --zero-stage to see every stage)");
    if (!device_memory.empty()) r.device_memory = plan::parse_bytes(device_memory);
    if (params > 0) {
      r.params_override = static_cast<int64_t>(params);
      r.model_name = "bare";
    } else if (std::filesystem::exists(model)) {
      const auto path = std::filesystem::is_directory(model) ? model + "/config.json" : model;
      r.model = model::read_hf_config(path);
      r.model_name = "init:" + path;
      // What config.json held that changes nothing (stderr, so that --json stays one JSON document).
      for (const auto& n : r.model.notices) std::fprintf(stderr, "shardlm: %s: %s\n", path.c_str(), n.c_str());
    } else {
      r.model = model::preset(model);
      r.model_name = model;
    }
    apply_lora_flags(r, extra);
  }
  std::optional<plan::MachineProfile> machine;
  if (!machine_path.empty()) machine = plan::read_machine_profile(machine_path);
  auto p = plan::make_plan(r);
  if (search) {
    const auto found = plan::search_layouts(r, machine ? &*machine : nullptr);
    if (as_json) std::printf("%s\n", plan::search_to_json(found).dump(2).c_str());
    else std::printf("%s", plan::format_search(found, search_show).c_str());
    if (found.fitting.empty()) fail("no layout of ", r.devices, " devices fits --device-memory");
    // The first choice becomes the plan --emit-config writes.
    const auto& best = found.fitting.front().request;
    p = plan::make_plan(best);
    p.recommended_stage = best.zero_stage;
    p.recommended_tp = best.tp;
    p.recommended_pp = best.pp;
    p.recommended_sequence_parallel = best.sequence_parallel;
    p.recommended_recompute = best.recompute;
  } else if (as_json) {
    auto j = plan::plan_to_json(p);
    if (machine) j["predicted"] = plan::predicted_json(p, *machine);
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s", plan::format_plan(p).c_str());
    if (machine) std::printf("%s", plan::format_predicted(p, *machine).c_str());
  }
  if (!emit_config.empty()) write_emitted_config(p, emit_config, nvme_path, machine ? &*machine : nullptr, as_json);
  return 0;
}

}  // namespace shardlm::cli

// The optimizer and scheduler sections: DeepSpeed's optimizer.type and params, shardlm's compact
// states and masters, and DeepSpeed's learning-rate schedules step for step (optim/).
#include "train/keys/sections.h"

#include "train/keys/rows.h"
#include "util/error.h"

namespace shardlm::train::keys {
namespace {

bool lamb(const TrainConfig& c) { return c.optimizer.type == "Lamb"; }

// optimizer.type as the pinned DeepSpeed (0.19.8) reads it: its own optimizers by any case
// (DEEPSPEED_OPTIMIZERS), stored under one spelling; the 1-bit family it removed, and the
// optimizers shardlm does not implement, refused by name.
void set_optimizer_type(TrainConfig& c, const json& v) {
  const std::string name = v.get<std::string>(), low = lower(name);
  if (low == "adamw") c.optimizer.type = "AdamW";
  else if (low == "adam") c.optimizer.type = "Adam";
  else if (low == "lamb") c.optimizer.type = "Lamb";
  else if (low == "onebitadam" || low == "zerooneadam" || low == "onebitlamb")
    fail("optimizer.type = \"", name, "\": the 1-bit optimizers (OneBitAdam, ZeroOneAdam, OneBitLamb) are not in the "
         "pinned DeepSpeed 0.19.8 (removed from deepspeed/runtime/fp16/onebit), and shardlm does not implement their "
         "compressed communication; use \"Adam\" (what they compute before compression starts) or \"Lamb\"");
  else
    fail("optimizer.type must be \"AdamW\", \"Adam\" or \"Lamb\" (any case, as DeepSpeed), got \"", name,
         "\": shardlm does not implement it");
}

}  // namespace

// The optimizer section: DeepSpeed's optimizer.type and params, and shardlm's compact states and masters
// (optim/).
std::vector<ConfigKey> optimizer() {
  return {
    custom(D, "optimizer.type", "string",
           "the optimizer, as the pinned DeepSpeed builds it; naming one gives its absent params DeepSpeed's "
           "defaults (lr 1e-3, betas [0.9, 0.999], eps 1e-8, weight_decay 0, or torch_adam AdamW's 0.01)",
           [](const json& v) { return json_type_problem<std::string>(v); }, set_optimizer_type,
           [](const TrainConfig& c) { return json(c.optimizer.type); })
        .choice("AdamW", "decoupled weight decay").choice("Adam", "AdamW's arithmetic unless adam_w_mode is false")
        .choice("Lamb", "FusedLamb's layer-wise trust ratio; not with ZeRO stages 1-3 or tensor parallelism")
        .hint("any case, as DeepSpeed"),
    key(D, "optimizer.params.lr", FIELD(optimizer.lr), "peak learning rate").finite().at_least(0),
    custom(D, "optimizer.params.betas", "[number, number]", "AdamW's [beta1, beta2]",
           [](const json& v) { return json_type_problem<std::vector<double>>(v); },
           [](TrainConfig& c, const json& v) {
             const auto betas = v.get<std::vector<double>>();
             if (betas.size() != 2) fail("optimizer.params.betas must be [beta1, beta2], got ", v.dump());
             c.optimizer.beta1 = betas[0], c.optimizer.beta2 = betas[1];
           },
           [](const TrainConfig& c) { return json{c.optimizer.beta1, c.optimizer.beta2}; })
        .within_below(0, 1).hint("both; e.g. [0.9, 0.95]"),
    key(D, "optimizer.params.eps", FIELD(optimizer.eps), "AdamW's epsilon").above(0),
    key(D, "optimizer.params.weight_decay", FIELD(optimizer.weight_decay),
        "decoupled weight decay (Adam with adam_w_mode false: L2, added to the gradient), applied to tensors with "
        ">= 2 dimensions")
        .at_least(0),
    key(D, "optimizer.params.adam_w_mode", FIELD(optimizer.adam_w_mode),
        "Adam: true is AdamW's arithmetic, false L2-regularized Adam (torch.optim.Adam); AdamW ignores it, as "
        "DeepSpeed does")
        .optional("`true`").written_if([](const TrainConfig& c) { return c.optimizer.type == "Adam"; }),
    key(D, "optimizer.params.bias_correction", FIELD(optimizer.bias_correction),
        "Adam, AdamW, Lamb: false uses the moments without bias correction (DeepSpeed's FusedAdam/FusedLamb)")
        .optional("`true`").written_if([](const TrainConfig& c) { return !c.optimizer.bias_correction; }),
    key(NOEFFECT, "optimizer.params.torch_adam", FIELD(optimizer.torch_adam),
        "DeepSpeed's choice of torch.optim.Adam(W) over FusedAdam: the same arithmetic (only the default "
        "weight_decay differs: AdamW's 0.01)")
        .optional("`false`").written_if([](const TrainConfig& c) { return c.optimizer.torch_adam; }),
    key(D, "optimizer.params.max_coeff", FIELD(optimizer.max_coeff), "Lamb: the trust ratio's upper clamp")
        .above(0).optional("`10`").written_if(lamb),
    key(D, "optimizer.params.min_coeff", FIELD(optimizer.min_coeff), "Lamb: the trust ratio's lower clamp")
        .at_least(0).optional("`0.01`").written_if(lamb),
    key(D, "optimizer.params.eps_inside_sqrt", FIELD(optimizer.eps_inside_sqrt),
        "Lamb: m / sqrt(v + eps) instead of m / (sqrt(v) + eps)")
        .optional("`false`").written_if(lamb),
    only("optimizer.params.amsgrad", false, "AMSGrad is not implemented (DeepSpeed's FusedAdam refuses it too)",
         "AMSGrad is not implemented (DeepSpeed's FusedAdam and FusedLamb refuse it too); set it to false or remove "
         "it"),
    refused("optimizer.params.max_grad_norm", "number", [](const json&) { return false; }, "absent",
            "DeepSpeed refuses it: clipping is gradient_clipping",
            "DeepSpeed refuses an optimizer max_grad_norm; clipping is the top-level gradient_clipping key (e.g. "
            "\"gradient_clipping\": 1.0)"),
    noted<bool>("optimizer.params.set_grad_none", "FusedAdam's way of clearing gradients; shardlm clears them"),
    key(D, "optimizer.params.fp32_optimizer_states", FIELD(optimizer.fp32_optimizer_states),
        "DeepSpeed's CPU Adam state dtype: false with bf16.bf16_master_weights_and_grads keeps the moments in "
        "bf16 (optimizer.state_precision \"bf16\", as its CPU Adam makes them in the masters' dtype); no effect "
        "otherwise (shardlm's moments follow optimizer.state_precision)")
        .optional("`true`").written_if([](const TrainConfig& c) { return c.bf16_master_weights_and_grads; }),
    key(OWN, "optimizer.state_precision", FIELD(optimizer.state_precision),
        "how Adam's moments are stored; the update is computed in fp32 either way (Compact optimizer states)")
        .choice("fp32", "torch.optim.AdamW's states")
        .choice("bf16", "bf16 moments (torchao's bf16 optimizer states, AnyPrecisionAdamW)")
        .choice("8bit", "bitsandbytes AdamW8bit's block-wise dynamic quantization (256-element blocks); "
                        "parameters under optimizer.min_8bit_size keep fp32; not with Lamb or tensor parallelism")
        .optional("`\"fp32\"`").written_if([](const TrainConfig& c) { return c.optimizer.state_precision != "fp32"; }),
    key(OWN, "optimizer.min_8bit_size", FIELD(optimizer.min_8bit_size),
        "8-bit states: parameters with fewer elements keep fp32 moments (bitsandbytes' min_8bit_size)")
        .at_least(1).optional("`4096`")
        .written_if([](const TrainConfig& c) { return c.optimizer.state_precision == "8bit"; }),
    key(OWN, "optimizer.master_precision", FIELD(optimizer.master_precision),
        "the master weights the update is applied to; bf16 drops the fp32 copy (4 bytes per parameter) beside the "
        "bf16 working shard (Compact optimizer states)")
        .choice("fp32", "fp32 masters (mixed precision, DeepSpeed's bf16 optimizer)")
        .choice("bf16", "the bf16 shard is the master: bf16.enabled only, not with Lamb; with offload_optimizer "
                        "the bf16 master and Kahan's compensation live in host memory or the NVMe files; a CUDA run "
                        "needs offload_optimizer (its update is host code), and with offload_param offload_optimizer \"cpu\" "
                        "(the host parameter shards are its masters); rounded back by optimizer.master_rounding")
        .optional("`\"fp32\"`").written_if([](const TrainConfig& c) { return c.optimizer.master_precision != "fp32"; }),
    key(OWN, "optimizer.master_rounding", FIELD(optimizer.master_rounding),
        "bf16 masters: how the fp32 update returns to bf16")
        .choice("kahan", "torchdistx AnyPrecisionAdamW's Kahan summation (a bf16 compensation buffer, 2 bytes per "
                         "parameter)")
        .choice("stochastic", "torchao's bf16 stochastic rounding (AdamW bf16_stochastic_round), random bits "
                              "from Philox keyed by seed, step, parameter and element")
        .choice("nearest", "round to nearest even (plain bf16 training; the baseline the other two improve on)")
        .optional("`\"kahan\"`")
        .written_if([](const TrainConfig& c) { return c.optimizer.master_precision == "bf16"; }),
  };
}

// The scheduler section: DeepSpeed's learning-rate schedules, step for step (optim/lr_schedule.h).
std::vector<ConfigKey> scheduler() {
  return {
    custom(D, "scheduler.type", "string",
           "learning-rate schedule; the Warmup* curves are the pinned DeepSpeed's, step for step (Learning-rate "
           "schedules)",
           [](const json& v) { return json_type_problem<std::string>(v); },
           [](TrainConfig& c, const json& v) { c.scheduler.type = v.get<std::string>(); },
           [](const TrainConfig& c) { return json(c.scheduler.type); })
        .choice("constant").choice("WarmupLR", "warm-up from warmup_min_lr to warmup_max_lr, then constant")
        .choice("WarmupDecayLR", "the same warm-up, then linear decay to 0 at total_num_steps")
        .choice("WarmupCosineLR", "warm-up from lr × warmup_min_ratio to lr, then cosine decay to lr × cos_min_ratio"),
    key(D, "scheduler.params.warmup_min_lr", FIELD(scheduler.warmup_min_lr),
        "WarmupLR, WarmupDecayLR: the lr the warm-up starts from (and the first step's)")
        .finite().at_least(0).optional("`0`").written_if(takes("warmup_min_lr")),
    key(D, "scheduler.params.warmup_max_lr", FIELD(scheduler.warmup_max_lr),
        "WarmupLR, WarmupDecayLR: the lr the warm-up reaches; absent: WarmupLR uses optimizer.params.lr, "
        "WarmupDecayLR 1e-3 (DeepSpeed's defaults)")
        .finite().at_least(0).optional("`1e-3` (WarmupLR: optimizer.params.lr)").written_if(takes("warmup_max_lr")),
    key(D, "scheduler.params.warmup_num_steps", FIELD(scheduler.warmup_num_steps),
        "warm-up steps W (DeepSpeed takes max(2, W))")
        .at_least(1).optional("`1000`").written_if(takes("warmup_num_steps")),
    key(D, "scheduler.params.warmup_type", FIELD(scheduler.warmup_type), "the warm-up's curve")
        .choice("log", "log(i + 1) / log(W)").choice("linear", "i / W")
        .optional("`\"log\"`").written_if(takes("warmup_type")),
    key(D, "scheduler.params.warmup_min_ratio", FIELD(scheduler.warmup_min_ratio),
        "WarmupCosineLR's r0: warm-up starts at lr × r0")
        .within(0, 1).optional("`0`").written_if(takes("warmup_min_ratio")),
    key(D, "scheduler.params.cos_min_ratio", FIELD(scheduler.cos_min_ratio),
        "WarmupCosineLR's rmin: decay ends at lr × rmin")
        .within(0, 1).optional("`1e-4`").written_if(takes("cos_min_ratio")),
    key(D, "scheduler.params.total_num_steps", FIELD(scheduler.total_num_steps),
        "WarmupDecayLR, WarmupCosineLR: S, the step the decay ends at")
        .at_least(0).hint("0: the run's steps").optional("`0`").written_if(takes("total_num_steps")),
    only("scheduler.params.last_batch_iteration", -1, "resuming sets the scheduler's step; only -1",
         "shardlm's scheduler resumes from the checkpoint's step; last_batch_iteration other than -1 is not "
         "implemented. Remove it"),
  };
}

}  // namespace shardlm::train::keys

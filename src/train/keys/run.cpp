// The run's own top-level keys and the data, comm, ddp and debug sections: batch, steps, seed,
// intervals, out_dir, checkpoints, the memory guard, device, attention kernel; token files, blends,
// order and prefetch (data/); timeouts, backend, DDP buckets and the desync checks.
#include "train/keys/sections.h"

#include <cmath>
#include <cstdlib>

#include "plan/planner.h"
#include "train/keys/rows.h"
#include "util/error.h"

namespace shardlm::train::keys {
namespace {

const char* const derive = "leave it out next to train_batch_size to derive it from the other two";

// data.blend: Megatron's --data-path list, [weight, file, weight, file, ...]; a weight may be a
// number or a string holding one ("0.3", as Megatron's command line gives it).
std::string blend_type_problem(const json& v) {
  if (!v.is_array() || v.empty() || v.size() % 2 != 0)
    return "a list of weight and file pairs, [weight, file, weight, file, ...]";
  for (size_t i = 0; i < v.size(); i += 2) {
    const json& w = v[i];
    bool number = w.is_number();
    if (w.is_string()) {
      char* end = nullptr;
      const std::string text = w.get<std::string>();
      std::strtod(text.c_str(), &end);
      number = !text.empty() && end && *end == '\0';
    }
    if (!number) return "a number at position " + std::to_string(i + 1) + " (a weight), not " + w.dump();
    if (!v[i + 1].is_string() || v[i + 1].get<std::string>().empty())
      return "a token file or glob at position " + std::to_string(i + 2) + ", not " + v[i + 1].dump();
  }
  return "";
}

std::vector<std::pair<double, std::string>> parse_blend(const json& v) {
  std::vector<std::pair<double, std::string>> out;
  for (size_t i = 0; i < v.size(); i += 2) {
    const double w = v[i].is_string() ? std::strtod(v[i].get<std::string>().c_str(), nullptr) : v[i].get<double>();
    if (!std::isfinite(w) || w <= 0)
      fail("data.blend: the weight of ", v[i + 1].dump(), " is ", v[i].dump(), "; every weight must be a finite "
           "number > 0 (leave a dataset out instead of giving it weight 0)");
    out.emplace_back(w, v[i + 1].get<std::string>());
  }
  return out;
}

}  // namespace

// The top-level keys of a run: the batch, steps, seed, intervals, out_dir, checkpoints, the memory guard,
// device and attention kernel.
std::vector<ConfigKey> run() {
  return {
    key(D, "train_micro_batch_size_per_gpu", FIELD(micro_batch), "sequences per rank per micro-step")
        .at_least(1).fix(derive),
    key(D, "gradient_accumulation_steps", FIELD(grad_accum),
        "micro-steps per optimizer step (with pipeline parallelism: the micro-batches of a pipeline step)")
        .at_least(1).fix(derive),
    key(D, "train_batch_size", FIELD(train_batch_size),
        "must equal micro-batch × accumulation × data-parallel ranks, else an error shows the arithmetic; a batch "
        "key left out next to it is derived (DeepSpeed configs)")
        .at_least(1).optional("not set").fix("leave it out to let it follow from the other two")
        .written_if([](const TrainConfig& c) { return c.train_batch_size != 0; }),
    key(D, "gradient_clipping", FIELD(gradient_clipping), "global L2 norm limit, `clip_grad_norm_` semantics")
        .at_least(0).hint("0 disables clipping"),
    key(OWN, "steps", FIELD(steps), "optimizer steps to train").at_least(1),
    key(OWN, "seed", FIELD(seed), "seed of the initial weights and of the shuffled data order"),
    key(OWN, "eval_interval", FIELD(eval_interval), "evaluate on data.val every this many steps; 0: only at the end")
        .at_least(0),
    key(OWN, "log_interval", FIELD(log_interval), "print a step's line every this many steps").at_least(1),
    key(OWN, "out_dir", FIELD(out_dir), "run directory: metrics, checkpoints, the final model"),
    key(OWN, "threads", FIELD(threads), "libtorch threads per rank").at_least(0).hint("0: cores / local ranks"),
    key(OWN, "init", FIELD(init),
        "HF directory (`config.json` + `model.safetensors`, or shards listed by `model.safetensors.index.json` "
        "as the Hub holds larger models) to start from; its config defines the model")
        .written_if([](const TrainConfig& c) { return !c.init.empty(); }),
    key(OWN, "checkpoint_interval", FIELD(checkpoint_interval), "also save a checkpoint every this many steps")
        .at_least(0).hint("0: only at the end"),
    key(OWN, "checkpoint_keep", FIELD(checkpoint_keep), "sharded checkpoints kept in `out_dir/checkpoints`")
        .at_least(1).hint("the newest checkpoints kept"),
    key(OWN, "checkpoint_async", FIELD(checkpoint_async),
        "copy each checkpoint's state to host memory and write its shards on a thread while training goes on; "
        "committed at the next save or the run's end (Checkpoints)"),
    custom(OWN, "device_memory", "bytes or size",
           "bytes per rank, a number or a size such as \"32GB\" or \"80GiB\": the run is refused before it "
           "starts when the plan does not fit (Memory guard); 0: what this machine has free",
           [](const json& v) -> std::string {
             return v.is_number() || v.is_string() ? ""
                                                   : "must be a number of bytes or a size such as \"32GB\" or \"80GiB\"";
           },
           [](TrainConfig& c, const json& v) {
             c.device_memory = v.is_number() ? v.get<double>() : plan::parse_bytes(v.get<std::string>());
           },
           [](const TrainConfig& c) { return json(c.device_memory); })
        .at_least(0).hint("0: no limit"),
    key(OWN, "machine_profile", FIELD(machine_profile),
        "a `shardlm bench machine --out` profile: plan.json then holds this run's predicted seconds per phase "
        "(Time model), and the end-of-run diagnosis and the report compare them with the measured ones")
        .optional("not set").written_if([](const TrainConfig& c) { return !c.machine_profile.empty(); }),
    key(OWN, "resume", FIELD(resume),
        "continue from the newest good checkpoint in `out_dir/checkpoints` when present; false starts over and "
        "replaces them at its first save (`scripts/demo.sh` passes false)"),
    key(OWN, "device", FIELD(device),
        "also `--device cuda`; rank r uses GPU (local rank mod GPUs); without a GPU the run stops at once, saying so")
        .choice("cpu").choice("cuda"),
    key(OWN, "attn_implementation", FIELD(attn_implementation),
        "attention kernel; auto: sdpa on CUDA and for fp32/fp64 on CPU, eager for CPU bf16 without AVX-512 BF16 "
        "and CPU fp16 (Attention)")
        .choice("auto").choice("sdpa", "the library's fused `scaled_dot_product_attention`")
        .choice("eager", "HF's eager math, the parity reference"),
  };
}

// The data section: token files, blends, order and prefetch (data/).
std::vector<ConfigKey> data() {
  return {
    key(OWN, "data.train", FIELD(data.train),
        "training token file, or a glob of shards (\"DIR/train_*.bin\", read as one sequence in sorted order)")
        .required("give the training token file (e.g. data/brown/train.bin), or several in data.blend")
        .only_if([](const TrainConfig& c) { return c.data.blend.empty(); }, "without data.blend"),
    key(OWN, "data.val", FIELD(data.val), "validation token file or glob; \"\": no validation"),
    key(OWN, "data.seq_len", FIELD(data.seq_len), "tokens per sequence").at_least(1),
    key(OWN, "data.format", FIELD(data.format), "token file format")
        .choice("llmc", "llm.c `.bin` with a 1024-byte header, 16- or 32-bit ids as it says")
        .choice("raw_u16", "bare uint16 ids, nanoGPT").choice("raw_u32", "bare uint32 ids"),
    key(OWN, "data.eval_batches", FIELD(data.eval_batches), "how much of data.val an evaluation reads")
        .at_least(1).hint("micro-batches per rank per evaluation").fix("to skip validation set data.val to \"\""),
    key(OWN, "data.tokenizer", FIELD(data.tokenizer),
        "SentencePiece model or `tokenizer.json`, copied into out_dir for `generate`; \"\": none"),
    key(OWN, "data.shuffle", FIELD(data.shuffle), "training windows in a new seeded order each pass (Data order)"),
    custom(OWN, "data.blend", "[weight, file, weight, file, ...]",
           "several training datasets (token files or globs) drawn by weight, as Megatron-LM's --data-path "
           "blends them (Data order); in place of data.train",
           blend_type_problem,
           [](TrainConfig& c, const json& v) { c.data.blend = parse_blend(v); },
           [](const TrainConfig& c) {
             json j = json::array();
             for (const auto& [weight, path] : c.data.blend) j.push_back(weight), j.push_back(path);
             return j;
           })
        .optional("not set").hint("weights > 0, normalised to sum 1")
        .written_if([](const TrainConfig& c) { return !c.data.blend.empty(); }),
    key(OWN, "data.prefetch", FIELD(data.prefetch),
        "batches a background thread assembles ahead of the step (Data order); 0: on the step's thread")
        .at_least(0),
  };
}

// The comm, flight_recorder, ddp and debug sections: timeouts, backend, the flight recorder, DDP buckets
// and the desync checks.
std::vector<ConfigKey> comm() {
  return {
    key(OWN, "comm.timeout_s", FIELD(comm.timeout_s),
        "longest any rank waits in one communication before exiting with a message")
        .above(0),
    key(OWN, "comm.backend", FIELD(comm.backend), "collectives backend")
        .choice("auto", "nccl on cuda, mpi on cpu").choice("mpi").choice("nccl", "needs device \"cuda\""),
    key(OWN, "flight_recorder.enabled", FIELD(flight_recorder.enabled),
        "keep each rank's last 2000 communication operations, written to out_dir/flight_recorder on a timeout, "
        "fatal signal or request for `shardlm diagnose`; false: nothing recorded, no files"),
    key(OWN, "ddp.bucket_cap_mb", FIELD(ddp.bucket_cap_mb), "DDP's gradient bucket size (MB)").above(0),
    key(OWN, "debug.consistency_interval", FIELD(debug.consistency_interval),
        "compare replicated gradients and parameters across replicas every k steps (Debugging desyncs)")
        .at_least(0).hint("0: off, k: check every k steps"),
    key(OWN, "debug.check_collectives", FIELD(debug.check_collectives),
        "check before every collective that all ranks of the group make the same call"),
  };
}

}  // namespace shardlm::train::keys

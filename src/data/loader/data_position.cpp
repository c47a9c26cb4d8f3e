// See data_position.h.
#include "data/loader/data_position.h"

#include <cstdio>

#include "util/error.h"

namespace shardlm::data {

std::string blend_text(const std::vector<std::pair<double, std::string>>& blend) {
  std::string out;
  for (const auto& [weight, path] : blend) {
    char w[32];
    std::snprintf(w, sizeof w, "%.17g", weight);
    out += (out.empty() ? "" : " ") + std::string(w) + " " + path;
  }
  return out;
}

nlohmann::json checkpoint_meta(const DataLayout& now, int64_t configured_accumulation) {
  return {{"global_batch_windows", now.accumulation * now.dp},
          {"micro_batch", now.micro_batch},
          {"seq_len", now.seq_len},
          {"configured_accumulation", configured_accumulation},
          {"data_blend", now.blend}};
}

ResumedData resume_data(const nlohmann::json& meta, int64_t start_step, const DataLayout& now) {
  ResumedData r;
  r.accumulation = now.accumulation;
  const int64_t saved_micro = meta.value("micro_batch", now.micro_batch), saved_seq = meta.value("seq_len", now.seq_len);
  const int64_t saved_windows = meta.value("global_batch_windows", now.accumulation * now.dp);
  const auto saved_cfg = meta.value("config", nlohmann::json::object());
  const int64_t saved_configured =
      meta.value("configured_accumulation", saved_cfg.value("gradient_accumulation_steps", now.accumulation));
  // Same batch settings, another data-parallel size: keep the global batch.
  if (saved_micro == now.micro_batch && saved_seq == now.seq_len && saved_configured == now.accumulation &&
      saved_windows != now.accumulation * now.dp) {
    if (saved_windows % now.dp != 0)
      fail("the checkpoint's global batch is ", saved_windows, " micro-batches of ", saved_micro, "x", saved_seq,
           " per step, which ", now.dp, " data-parallel ranks cannot share evenly: resume on a number of "
           "data-parallel ranks that divides ", saved_windows, " (gradient_accumulation_steps is then scaled to keep "
           "the batch), or set gradient_accumulation_steps to change the global batch on purpose");
    r.accumulation = saved_windows / now.dp;
    r.notes.push_back("the checkpoint ran " + std::to_string(saved_windows) + " micro-batches per step; on " +
                      std::to_string(now.dp) + " data-parallel rank(s) gradient_accumulation_steps is now " +
                      std::to_string(r.accumulation) + " (was " + std::to_string(now.accumulation) +
                      "), so every step reads the same global samples");
  }
  // Where this layout's order continues, from the tokens the checkpoint read.
  const int64_t per_micro_step = now.dp * now.micro_batch * now.seq_len;
  const int64_t consumed = meta.value("tokens_consumed", start_step * r.accumulation * per_micro_step);
  if (consumed != start_step * r.accumulation * per_micro_step) {
    r.micro_step_offset = consumed / per_micro_step - start_step * r.accumulation;
    r.notes.push_back("the global batch changed (" + std::to_string(saved_windows) + " windows of " +
                      std::to_string(saved_micro) + "x" + std::to_string(saved_seq) + " tokens per step, now " +
                      std::to_string(r.accumulation * now.dp) + " of " + std::to_string(now.micro_batch) + "x" +
                      std::to_string(now.seq_len) + "): continuing from the " + std::to_string(consumed) +
                      " tokens the checkpoint consumed, at token " +
                      std::to_string((consumed / per_micro_step) * per_micro_step) +
                      (consumed % per_micro_step ? " (rounded down to a whole step of this layout)" : "") +
                      " (docs/data.md, Data order)");
  }
  // The shuffled order.
  const bool saved_shuffle = saved_cfg.value("data", nlohmann::json::object()).value("shuffle", false);
  const uint64_t saved_seed = saved_cfg.value("seed", now.seed);
  if (saved_shuffle && now.shuffle && saved_micro * saved_seq != now.micro_batch * now.seq_len)
    fail("the checkpoint's run shuffled windows of ", saved_micro * saved_seq, " tokens (micro-batch x seq_len) and ",
         "this one would shuffle windows of ", now.micro_batch * now.seq_len, ": another permutation, which would "
         "re-read some text and skip the rest. Resume with the same train_micro_batch_size_per_gpu and data.seq_len "
         "(change the ranks and gradient_accumulation_steps instead), or start over with --resume=false");
  const std::string saved_blend = meta.value("data_blend", std::string());
  if (saved_blend != now.blend)
    r.notes.push_back("the data mix changed on resume: data.blend was " +
                      (saved_blend.empty() ? std::string("not set") : "\"" + saved_blend + "\"") + ", now " +
                      (now.blend.empty() ? std::string("not set") : "\"" + now.blend + "\"") +
                      "; the samples from here on are drawn from the new mix");
  if (saved_shuffle != now.shuffle)
    r.notes.push_back(std::string("the data order changed on resume: data.shuffle was ") +
                      (saved_shuffle ? "true" : "false") + ", now " + (now.shuffle ? "true" : "false"));
  else if (now.shuffle && saved_seed != now.seed)
    r.notes.push_back("the data order changed on resume: the shuffle seed was " + std::to_string(saved_seed) +
                      ", now " + std::to_string(now.seed));
  return r;
}

}  // namespace shardlm::data

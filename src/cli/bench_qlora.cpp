// `shardlm bench qlora --config config.json`: what QLoRA's 4-bit base (model/quant/quantized_base.h)
// stores and what its dequantization costs, on a model of that shape with random weights. Prints one
// JSON object: the 4-bit linears' stored bytes against the same tensors in bf16 (NF4 and FP4, with
// and without double quantization), and, R times interleaved, the seconds of a LoRA forward+backward
// on the plain base and on the 4-bit one (same adapters, same tokens), and of the dequantizations
// alone that step makes (each 4-bit weight once in forward, once in backward). bench/qlora.py runs it
// and writes bench/results/qlora.json.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <functional>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/llama.h"
#include "model/quant/quantized_base.h"
#include "util/error.h"

namespace shardlm::cli {

namespace {

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace

int run_bench_qlora(int argc, char** argv) {
  CLI::App app{"bytes of QLoRA's 4-bit linears against bf16, and seconds of a LoRA step on the plain and the 4-bit base",
               "shardlm bench qlora"};
  std::string config;
  int64_t r = 16, batch = 1, seq = 256;
  int repeats = 5;
  app.add_option("--config", config, "the model's HF config.json")->required()->type_name("FILE");
  app.add_option("--r", r, "LoRA rank on every linear but the head (16)")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--micro-batch", batch, "sequences per step (1)")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  app.add_option("--seq-len", seq, "tokens per sequence (256)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--repeats", repeats, "timed steps of each kind, interleaved (5)")->check(CLI::Range(1, 1000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const auto cfg = model::read_hf_config(config);
  model::Llama m(cfg, 1, at::kFloat);
  nlohmann::json out = {{"config", config}, {"parameters", m.num_parameters()}};
  {
    const auto named = m.named_tensors();
    for (const auto type : {model::quant::FourBitType::NF4, model::quant::FourBitType::FP4})
      for (const bool dq : {false, true}) {
        const model::quant::QuantizedFrozenBase store(named, {type, dq, at::kFloat});
        const std::string key = std::string(model::quant::four_bit_type_name(type)) + (dq ? "_double_quant" : "");
        out["bytes"][key] = {{"four_bit", store.quantized_bytes()},
                             {"bf16", store.quantized_bf16_bytes()},
                             {"ratio", static_cast<double>(store.quantized_bytes()) / store.quantized_bf16_bytes()}};
      }
  }
  model::LoraOptions o;
  o.r = r;
  o.lora_alpha = static_cast<double>(2 * r);
  o.target_regex = "all-linear";
  m.apply_lora(model::resolve_lora(o, cfg), 2);
  const std::shared_ptr<model::FrozenBase> plain = m.frozen_base();
  const auto quant = model::quant::quantize_frozen_base(*plain, {model::quant::FourBitType::NF4, true, at::kFloat});
  const auto ids = at::randint(cfg.vocab_size, {batch, seq + 1}, at::kLong);
  const auto inputs = ids.slice(1, 0, seq).contiguous(), targets = ids.slice(1, 1, seq + 1).contiguous();
  const auto step = [&] {
    for (auto& p : m.parameters()) p.tensor.mutable_grad() = at::Tensor();
    m.loss(m.forward(inputs), targets).backward();
  };
  const auto dequantize_all = [&] {
    for (size_t k = 0; k < quant->size(); ++k)
      if (quant->quantized(k)) (void)quant->weight(k), (void)quant->weight(k);
  };
  m.set_frozen_base(plain), step();
  m.set_frozen_base(quant), step();
  std::vector<double> lora, qlora, deq;
  for (int i = 0; i < repeats; ++i) {
    m.set_frozen_base(plain);
    lora.push_back(seconds_of(step));
    m.set_frozen_base(quant);
    qlora.push_back(seconds_of(step));
    deq.push_back(seconds_of(dequantize_all));
  }
  auto& t = out["timing"];
  t["lora_step_s"] = lora, t["qlora_step_s"] = qlora, t["dequantize_s"] = deq;
  t["micro_batch"] = batch, t["seq_len"] = seq, t["r"] = r, t["threads"] = at::get_num_threads();
  t["base"] = "nf4 double quant, fp32 compute", t["load_average"] = load_average();
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace shardlm::cli

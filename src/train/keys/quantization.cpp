// The quantization section: QLoRA's 4-bit frozen base (model/quant/quantized_base.h), with the keys
// and meanings of transformers' BitsAndBytesConfig, so that a `quantization_config` written for
// transformers reads here unchanged (docs/qlora.md). What is not built is refused by key and value:
// 8-bit bases, modules kept out of 4-bit, and fp32 CPU offload; how 4-bit meets the rest of the run
// (compute dtype, tensor parallelism, MoE) is check_relations' (config_ranges.cpp).
#include "train/keys/sections.h"

#include "train/keys/rows.h"

namespace shardlm::train::keys {
namespace {

// transformers writes llm_int8_skip_modules as null when no module is kept out.
std::string skip_modules_problem(const json& v) {
  return v.is_null() ? "" : json_type_problem<std::vector<std::string>>(v);
}

void set_skip_modules(TrainConfig& c, const json& v) {
  c.quantization.llm_int8_skip_modules = v.is_null() ? std::vector<std::string>{} : v.get<std::vector<std::string>>();
}

}  // namespace

std::vector<ConfigKey> quantization() {
  return {
    key(OWN, "quantization.load_in_4bit", FIELD(quantization.load_in_4bit),
        "keep the frozen base's decoder linears in bitsandbytes' 4-bit form, dequantized one at a time (QLoRA)"),
    custom(OWN, "quantization._load_in_4bit", "bool", "BitsAndBytesConfig.to_dict()'s copy of load_in_4bit",
           &json_type_problem<bool>, [](TrainConfig& c, const json& v) { c.quantization.load_in_4bit = v.get<bool>(); },
           nullptr),
    key(OWN, "quantization.load_in_8bit", FIELD(quantization.load_in_8bit), "bitsandbytes' LLM.int8 base")
        .refusing(true, "8-bit (LLM.int8) frozen bases are not built; QLoRA's 4-bit base is "
                        "quantization.load_in_4bit = true. Set load_in_8bit to false or remove it"),
    custom(OWN, "quantization._load_in_8bit", "bool", "BitsAndBytesConfig.to_dict()'s copy of load_in_8bit",
           &json_type_problem<bool>,
           [](TrainConfig& c, const json& v) { c.quantization.load_in_8bit = c.quantization.load_in_8bit || v.get<bool>(); },
           nullptr),
    key(OWN, "quantization.bnb_4bit_quant_type", FIELD(quantization.bnb_4bit_quant_type),
        "the 4-bit code: NormalFloat (QLoRA's) or bitsandbytes' FP4 (transformers' default)")
        .choice("nf4", "NormalFloat4, QLoRA's").choice("fp4", "1 sign, 2 exponent, 1 mantissa bit"),
    key(OWN, "quantization.bnb_4bit_use_double_quant", FIELD(quantization.bnb_4bit_use_double_quant),
        "quantize the per-64 absmax values again (8-bit, blocks of 256): 0.516 instead of 0.5625 byte per weight"),
    key(OWN, "quantization.bnb_4bit_compute_dtype", FIELD(quantization.bnb_4bit_compute_dtype),
        "the dtype the 4-bit weights are dequantized to; must be the run's compute dtype")
        .choice("auto", "the run's compute dtype (transformers' default is float32)")
        .choice("float32").choice("bfloat16").choice("float16"),
    key(OWN, "quantization.bnb_4bit_quant_storage", FIELD(quantization.bnb_4bit_quant_storage),
        "the tensor dtype the packed codes are stored as")
        .choice("uint8"),
    key(OWN, "quantization.quant_method", FIELD(quantization.quant_method), "the quantizer (transformers' field)")
        .choice("bitsandbytes"),
    custom(OWN, "quantization.llm_int8_skip_modules", "list of strings or null",
           "modules transformers keeps out of 4-bit; only empty or null (the output head is never 4-bit)",
           &skip_modules_problem, &set_skip_modules,
           [](const TrainConfig& c) { return json(c.quantization.llm_int8_skip_modules); }),
    key(OWN, "quantization.llm_int8_threshold", FIELD(quantization.llm_int8_threshold),
        "LLM.int8's outlier threshold; no effect on a 4-bit base"),
    key(OWN, "quantization.llm_int8_has_fp16_weight", FIELD(quantization.llm_int8_has_fp16_weight),
        "LLM.int8's 16-bit weight copy; no effect on a 4-bit base"),
    key(OWN, "quantization.llm_int8_enable_fp32_cpu_offload", FIELD(quantization.llm_int8_enable_fp32_cpu_offload),
        "transformers' device_map offload of modules in fp32")
        .refusing(true, "device_map offload of quantized models is not built; set it to false or remove it"),
  };
}

}  // namespace shardlm::train::keys

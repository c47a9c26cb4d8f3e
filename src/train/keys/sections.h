// The training config's sections, one function each, in the files of src/train/keys/ (rows.h has
// the row builders; a file holds a few related sections, since each file costs the build some 5 s
// of CPU). config_keys() joins them in kSections' order, which is the order of the key table
// (`shardlm config-keys`, the docs' table) and of the valid names an unknown-key error lists: a
// section comes where its first key is. A new section is a function plus its place in kSections.
#pragma once
#include <vector>

#include "train/config_keys.h"

namespace shardlm::train::keys {

std::vector<ConfigKey> run();                        // run.cpp: batch, steps, out_dir, checkpoints, device
std::vector<ConfigKey> optimizer();                  // optimizer.cpp
std::vector<ConfigKey> scheduler();                  // optimizer.cpp
std::vector<ConfigKey> data();                       // run.cpp
std::vector<ConfigKey> comm();                       // run.cpp: comm, flight_recorder, ddp, debug
std::vector<ConfigKey> zero();                       // zero.cpp: zero_optimization
std::vector<ConfigKey> zero_offload();               // zero.cpp: its offloads, ZeRO++, MiCS
std::vector<ConfigKey> precision();                  // precision_parallelism.cpp: bf16, fp16, data_types
std::vector<ConfigKey> activation_checkpointing();   // precision_parallelism.cpp
std::vector<ConfigKey> parallelism();                // precision_parallelism.cpp
std::vector<ConfigKey> lora();                       // lora.cpp: LoRA adapters (PEFT's LoraConfig)
std::vector<ConfigKey> quantization();               // quantization.cpp: QLoRA's 4-bit base
// DeepSpeed's other keys: older names, and what cannot change the arithmetic (accepted with a
// notice) or would and is not built (refused).
std::vector<ConfigKey> deepspeed_runtime();          // deepspeed_accepted.cpp
std::vector<ConfigKey> deepspeed_monitors();         // deepspeed_accepted.cpp
std::vector<ConfigKey> deepspeed_compile();          // deepspeed_accepted.cpp
std::vector<ConfigKey> deepspeed_engine();           // deepspeed_accepted.cpp
std::vector<ConfigKey> deepspeed_masters();          // deepspeed_more.cpp
std::vector<ConfigKey> deepspeed_tensor_parallel();  // deepspeed_more.cpp
std::vector<ConfigKey> deepspeed_zero();             // deepspeed_more.cpp
std::vector<ConfigKey> deepspeed_removed();          // deepspeed_more.cpp

inline constexpr std::vector<ConfigKey> (*kSections[])() = {
    run,         optimizer,          scheduler,         data,
    comm,        zero,               zero_offload,      precision,
    activation_checkpointing,        parallelism,       lora,              quantization,
    deepspeed_runtime,
    deepspeed_monitors,              deepspeed_compile, deepspeed_engine,
    deepspeed_masters,               deepspeed_tensor_parallel,
    deepspeed_zero,                  deepspeed_removed,
};

}  // namespace shardlm::train::keys

// Checkpoints that survive crashes: out_dir/checkpoint/ holds the model (HF safetensors names),
// the AdamW moments and the step counter. A save is written to checkpoint.tmp/ and renamed into
// place, so a crash mid-save leaves the previous checkpoint intact. Because the data order is a
// function of the step (README: Data order), resuming at step s replays exactly what an
// uninterrupted run would have done.
#pragma once
#include <cstdint>
#include <string>

namespace shardlm::model {
class Llama;
}
namespace shardlm::optim {
class AdamW;
}

namespace shardlm::train {

std::string checkpoint_dir(const std::string& out_dir);
bool checkpoint_exists(const std::string& out_dir);
void save_checkpoint(const std::string& out_dir, const model::Llama& model, const optim::AdamW& opt, int64_t step);
// Loads weights and optimizer state; returns the number of optimizer steps already taken.
// Every problem (missing/corrupt file, shape mismatch, a config that no longer fits) is an Error
// naming the file and the tensor.
int64_t load_checkpoint(const std::string& out_dir, model::Llama& model, optim::AdamW& opt);

}  // namespace shardlm::train

// Activation checkpointing: run part of the forward without keeping its intermediate tensors, and
// run it again in backward to get them back (trading compute for activation memory).
//   none:      every tensor backward needs is kept;
//   full:      each decoder layer keeps only its input; backward re-runs the layer;
//   selective: Megatron-LM's selective recomputation (Korthikanti et al. 2022): the attention core
//              softmax(QK^T/sqrt(d))V keeps only q, k and v; everything else is kept. It removes the
//              heads x T^2 tensors of eager attention (a fused kernel already keeps none of them).
// The recomputed forward uses the same parameters and kernels, so gradients are bit-identical to
// none on a deterministic device. It composes with ZeRO-3: a unit is re-gathered right before its
// backward, which is where its recomputation runs.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace shardlm::model {

enum class Recompute { None, Full, Selective };

// "none" | "full" | "selective"; anything else is refused naming the valid values.
Recompute parse_recompute(const std::string& name);
const char* recompute_name(Recompute r);

using Region = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

// Forward: returns region(inputs) computed with autograd off, and saves only `inputs` and the
// random generator's state (the default generator of the inputs' device, as torch.utils.checkpoint's
// preserve_rng_state). Backward: sets that state, re-runs region on detached copies of the inputs
// with autograd on (so a dropout inside draws the forward's mask again), restores the generator, back-propagates the
// incoming gradient through that graph (parameter gradients accumulate as usual, and their hooks
// fire) and returns the inputs' gradients. Inputs that need no gradient (e.g. RoPE tables) get none.
at::Tensor recomputed(const Region& region, const std::vector<at::Tensor>& inputs);
// True on this thread while backward re-runs a region: what a region records once per forward
// (the MoE routing counts) is recorded here, the one run that has autograd on, and not in forward.
bool replaying_recomputation();
// True on this thread while a training forward runs, including the autograd-off forward of a
// recomputed region: what only training does (LoRA's dropout) asks this rather than GradMode.
bool training_forward();

}  // namespace shardlm::model

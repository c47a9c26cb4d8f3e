// Precompiled header: ATen, which nearly every file uses. Only the build uses this file; sources
// still include what they need, so they also compile without it. The autograd headers
// (torch/csrc/autograd/...) are left to the few files that define autograd functions: in the PCH
// they made every file pay for their pending template instantiations (an empty file cost 4.2
// CPU-s with them, 2.2 without; measured on this 2-core host).
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <string>
#include <vector>
#include <map>
#include <memory>
#include <stdexcept>

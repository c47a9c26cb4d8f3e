// Precompiled header: ATen and the autograd pieces nearly every layer uses. Only the build uses
// this file; sources still include what they need, so they also compile without it.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <string>
#include <vector>
#include <map>
#include <memory>
#include <stdexcept>

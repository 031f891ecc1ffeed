// SPDX-License-Identifier: Apache-2.0
// The whole-stack translation unit scripts/compile-time times over the CUDA runtime: the caching
// allocator, the pinned pool, the transfer pipeline, the checkpoint planner and executor
// (whole_stack.hpp). Compiled header-only and in the compiled mode (GPUKIT_COMPILED_LIBRARY,
// gpukit::compiled), never run.
#include "whole_stack.hpp"

#include <gpukit/runtime/cuda_runtime.hpp>

int main() { return whole_stack::step(gpukit::cuda_runtime::instance()); }

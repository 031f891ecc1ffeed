// SPDX-FileCopyrightText: gpukit contributors
// SPDX-License-Identifier: Apache-2.0
//
// Include order does not matter for nvcc users either: Thrust and <cuda/memory_resource> first,
// then gpukit's Thrust allocator.
#include <thrust/device_vector.h>
#include <thrust/reduce.h>

#include <cuda/memory_resource>

#include <gpukit/memory/thrust_allocator.cuh>

#include "cccl_checks.hpp"

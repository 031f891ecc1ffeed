// SPDX-License-Identifier: Apache-2.0
// gpukit::compiled: the checkpoint planners (gpukit/checkpoint/planners.hpp), compiled once here
// with their algorithms (detail/planners_impl.hpp). In compiled mode planners.hpp declares them and
// leaves its body file out; GPUKIT_DETAIL_COMPILED_INLINE makes the bodies ordinary definitions in
// this source alone (gpukit/detail/compiled_mode.hpp).
#include <gpukit/checkpoint/planners.hpp>

#include <gpukit/checkpoint/detail/planners_impl.hpp>

# SPDX-License-Identifier: Apache-2.0
# gpukit_syntax_only(<target>): <target>, an object library that is a compile check and is never
# linked, has its C++ and CUDA sources checked by the compiler's front end alone
# (gpukit_syntax_only.sh beside this file, as their compiler launcher): they parse, instantiate what
# they use and warn as a full compile would, and no code is generated.
function(gpukit_syntax_only target)
  set_target_properties(${target} PROPERTIES
    CXX_COMPILER_LAUNCHER "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/gpukit_syntax_only.sh"
    CUDA_COMPILER_LAUNCHER "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/gpukit_syntax_only.sh")
endfunction()

# SPDX-License-Identifier: Apache-2.0
# cmake -DNM=<nm> -DOBJECTS=<object files> -P check_objects.cmake
# Fails when an object defines a member of a class that gpukit::compiled compiles, over either
# runtime, or a checkpoint planner: the headers' `extern template` declarations
# (GPUKIT_COMPILED_LIBRARY) should have kept the consumer from compiling the class templates'
# members, and sim_runtime.hpp and planners.hpp from compiling their bodies. Members of a class
# nested in one of them are left out: the implicitly defined ones (a nested struct's destructor) are
# compiled where they are used.
set(compiled_classes sim_runtime)
foreach(runtime IN ITEMS cuda_runtime sim_runtime)
  foreach(class IN ITEMS basic_caching_allocator basic_pinned_pool pinned_buffer
                         basic_transfer_pipeline basic_prefetcher basic_checkpoint_executor)
    list(APPEND compiled_classes "${class}<gpukit::${runtime}>")
  endforeach()
endforeach()
# A member of the class itself: no further scope before its parameters.
list(TRANSFORM compiled_classes PREPEND " gpukit::")
list(TRANSFORM compiled_classes APPEND "::[^:(]+\\(")
set(compiled_patterns ${compiled_classes}
  " gpukit::(plan_[a-z_]+|optimal_min_budget|revolve_advances|revolve_schedule)\\(")
foreach(object IN LISTS OBJECTS)
  execute_process(COMMAND "${NM}" -C --defined-only "${object}"
    OUTPUT_VARIABLE symbols COMMAND_ERROR_IS_FATAL ANY)
  string(REPLACE "\n" ";" symbols "${symbols}")
  set(found "")
  foreach(symbol IN LISTS symbols)
    foreach(pattern IN LISTS compiled_patterns)
      if(symbol MATCHES "${pattern}")
        list(APPEND found "${symbol}")
      endif()
    endforeach()
  endforeach()
  if(found)
    list(JOIN found "\n  " found)
    message(FATAL_ERROR "${object} compiled what gpukit::compiled holds "
      "(are the extern template declarations missing, or a body file included?):\n  ${found}")
  endif()
endforeach()
message(STATUS "no gpukit::compiled instantiation compiled again in: ${OBJECTS}")

# SPDX-License-Identifier: Apache-2.0
# cmake -DNM=<nm> -DOBJECTS=<object files> -P check_objects.cmake
# Fails when an object defines a member of a class template that gpukit::compiled instantiates over
# cuda_runtime: the headers' `extern template` declarations (GPUKIT_COMPILED_LIBRARY) should have
# kept the consumer from compiling them.
set(instantiated
  "gpukit::basic_caching_allocator<gpukit::cuda_runtime>::"
  "gpukit::basic_pinned_pool<gpukit::cuda_runtime>::"
  "gpukit::pinned_buffer<gpukit::cuda_runtime>::"
  "gpukit::basic_transfer_pipeline<gpukit::cuda_runtime>::"
  "gpukit::basic_prefetcher<gpukit::cuda_runtime>::")
foreach(object IN LISTS OBJECTS)
  execute_process(COMMAND "${NM}" -C --defined-only "${object}"
    OUTPUT_VARIABLE symbols COMMAND_ERROR_IS_FATAL ANY)
  string(REPLACE "\n" ";" symbols "${symbols}")
  set(found "")
  foreach(symbol IN LISTS symbols)
    foreach(prefix IN LISTS instantiated)
      string(FIND "${symbol}" " ${prefix}" at)
      if(at GREATER_EQUAL 0)
        list(APPEND found "${symbol}")
      endif()
    endforeach()
  endforeach()
  if(found)
    list(JOIN found "\n  " found)
    message(FATAL_ERROR "${object} compiled members that gpukit::compiled holds "
      "(are the extern template declarations missing?):\n  ${found}")
  endif()
endforeach()
message(STATUS "no gpukit::compiled instantiation compiled again in: ${OBJECTS}")

# SPDX-License-Identifier: Apache-2.0
# Checks shared by the consumer projects: gpukit must leave a consumer's build alone.
get_property(consumer_languages GLOBAL PROPERTY ENABLED_LANGUAGES)
if("CUDA" IN_LIST consumer_languages)
  message(FATAL_ERROR "gpukit enabled the CUDA language in a consumer project")
endif()
if(NOT TARGET gpukit::gpukit)
  message(FATAL_ERROR "gpukit::gpukit is not defined")
endif()
foreach(own_target IN ITEMS gpukit_header_tests demo)
  if(TARGET ${own_target})
    message(FATAL_ERROR "gpukit built its own target ${own_target} inside a consumer project")
  endif()
endforeach()

add_executable(consumer "${CMAKE_CURRENT_LIST_DIR}/consumer.cpp")
target_link_libraries(consumer PRIVATE gpukit::gpukit)
target_compile_options(consumer PRIVATE -Wall -Wextra -Werror)
# The version gpukit's own build says it is: consumer.cpp checks gpukit/version.hpp against it.
target_compile_definitions(consumer PRIVATE
  "GPUKIT_EXPECTED_VERSION_STRING=\"${GPUKIT_EXPECTED_VERSION}\"")

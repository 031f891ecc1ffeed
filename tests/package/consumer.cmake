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

# compile_commands.json: check_consumer.cmake reads how gpukit's include folder reached the compiler.
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)
add_executable(consumer "${CMAKE_CURRENT_LIST_DIR}/consumer.cpp")
target_link_libraries(consumer PRIVATE gpukit::gpukit)
# A strict team's warnings: gpukit's headers, SYSTEM for consumers, must not break this build.
target_compile_options(consumer PRIVATE -Wall -Wextra -Wconversion -Wsign-conversion -Werror)
file(GENERATE OUTPUT "${CMAKE_BINARY_DIR}/gpukit_include_dirs.txt"
  CONTENT "$<TARGET_PROPERTY:gpukit::gpukit,INTERFACE_INCLUDE_DIRECTORIES>")
# The version gpukit's own build says it is: consumer.cpp checks gpukit/version.hpp against it.
target_compile_definitions(consumer PRIVATE
  "GPUKIT_EXPECTED_VERSION_STRING=\"${GPUKIT_EXPECTED_VERSION}\"")

# SPDX-License-Identifier: Apache-2.0
# What the compiled-mode consumer projects share: gpukit::compiled must exist, define
# GPUKIT_COMPILED_LIBRARY (consumer.cpp checks), link (a missing instantiation is an undefined
# symbol) and keep the instantiations out of the consumer's object (check_objects.cmake).
if(NOT TARGET gpukit::compiled)
  message(FATAL_ERROR "gpukit::compiled is not defined")
endif()
if(NOT CMAKE_NM)
  message(FATAL_ERROR "no nm to check the consumer's object with (CMAKE_NM)")
endif()

add_library(consumer_objects OBJECT "${CMAKE_CURRENT_LIST_DIR}/consumer.cpp")
target_link_libraries(consumer_objects PUBLIC gpukit::compiled)
target_compile_options(consumer_objects PRIVATE -Wall -Wextra -Werror)
add_executable(consumer $<TARGET_OBJECTS:consumer_objects>)
set_target_properties(consumer PROPERTIES LINKER_LANGUAGE CXX)
target_link_libraries(consumer PRIVATE gpukit::compiled)
add_custom_command(TARGET consumer POST_BUILD
  COMMAND "${CMAKE_COMMAND}" "-DNM=${CMAKE_NM}" "-DOBJECTS=$<TARGET_OBJECTS:consumer_objects>"
    -P "${CMAKE_CURRENT_LIST_DIR}/check_objects.cmake"
  COMMAND_EXPAND_LISTS
  VERBATIM)

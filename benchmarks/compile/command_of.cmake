# SPDX-License-Identifier: Apache-2.0
# cmake -DDATABASE=<compile_commands.json> -DTARGET=<object library> -DOUTPUT=<file> -P command_of.cmake
# Writes the directory (first line) and the compile command (second line) of TARGET's one source.
file(READ "${DATABASE}" database)
string(JSON count LENGTH "${database}")
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  string(JSON command GET "${database}" ${i} command)
  if(command MATCHES "CMakeFiles/${TARGET}\\.dir/")
    string(JSON directory GET "${database}" ${i} directory)
    file(WRITE "${OUTPUT}" "${directory}\n${command}\n")
    return()
  endif()
endforeach()
message(FATAL_ERROR "no compile command of ${TARGET} in ${DATABASE}")

# SPDX-License-Identifier: Apache-2.0
# The compiled mode's packaging tests (gpukit::compiled, cmake/gpukit_compiled.cmake), included by
# ../CMakeLists.txt after gpukit_add_package_test:
#
#   package.compiled_fetch_content  FetchContent with GPUKIT_COMPILED=ON, links gpukit::compiled
#   package.compiled_install        installs that consumer's build of gpukit (../install.cmake)
#   package.compiled_relocatable    no file of that install (libgpukit_compiled.a included) names
#                                   the source folder or that consumer's build folder
#   package.compiled_find_package   find_package(gpukit) against that install, gpukit::compiled
#
# gpukit::compiled is built once, in the FetchContent consumer, and installed from there.
set(gpukit_compiled_prefix "${CMAKE_CURRENT_BINARY_DIR}/compiled_prefix")

gpukit_add_package_test(compiled_fetch_content OPTIONS "-DGPUKIT_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
set_tests_properties(package.compiled_fetch_content PROPERTIES
  FIXTURES_SETUP gpukit_compiled_build)

add_test(NAME package.compiled_install
  COMMAND "${CMAKE_COMMAND}"
    "-DBUILD_DIR=${CMAKE_CURRENT_BINARY_DIR}/compiled_fetch_content"
    "-DPREFIX=${gpukit_compiled_prefix}" "-DCONFIG=$<CONFIG>"
    "-DINCLUDEDIR=${CMAKE_INSTALL_INCLUDEDIR}" "-DCMAKEDIR=${GPUKIT_INSTALL_CMAKEDIR}"
    "-DDOCDIR=${CMAKE_INSTALL_DOCDIR}"
    -P "${CMAKE_CURRENT_LIST_DIR}/../install.cmake")
set_tests_properties(package.compiled_install PROPERTIES
  FIXTURES_REQUIRED gpukit_compiled_build FIXTURES_SETUP gpukit_compiled_install LABELS package)

add_test(NAME package.compiled_relocatable
  COMMAND "${CMAKE_COMMAND}" "-DPREFIX=${gpukit_compiled_prefix}"
    "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}"
    "-DBUILD_DIR=${CMAKE_CURRENT_BINARY_DIR}/compiled_fetch_content"
    -P "${CMAKE_CURRENT_LIST_DIR}/../relocatable.cmake")
set_tests_properties(package.compiled_relocatable PROPERTIES
  FIXTURES_REQUIRED gpukit_compiled_install LABELS package)

gpukit_add_package_test(compiled_find_package OPTIONS "-DCMAKE_PREFIX_PATH=${gpukit_compiled_prefix}")
set_tests_properties(package.compiled_find_package PROPERTIES
  FIXTURES_REQUIRED gpukit_compiled_install)

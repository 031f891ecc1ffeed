// SPDX-License-Identifier: Apache-2.0
// tests/support/files.hpp: files the build made for a test (a library it loads, a tool it
// attaches), found also when the build tree has moved: the h200 build carries its binaries to
// another machine, where only what lies beside the test binary is there.
//
//   void* lib = dlopen(gpukit::test::built_file(GPUKIT_TEST_LIB_A).c_str(), RTLD_NOW);
#pragma once

#include <unistd.h>

#include <climits>
#include <string>

namespace gpukit::test {

/// The directory of this executable ("." when /proc/self/exe cannot be read).
inline std::string executable_dir()
{
  char exe[PATH_MAX] = {};
  ssize_t const n    = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) { return "."; }
  std::string const path(exe, static_cast<std::size_t>(n));
  return path.substr(0, path.find_last_of('/'));
}

/// The file named `name` beside this executable.
inline std::string beside_executable(std::string const& name)
{
  return executable_dir() + "/" + name;
}

/// `built_at` when it is there, else the file of the same name beside this executable.
inline std::string built_file(std::string const& built_at)
{
  if (::access(built_at.c_str(), R_OK) == 0) { return built_at; }
  return beside_executable(built_at.substr(built_at.find_last_of('/') + 1));
}

}  // namespace gpukit::test

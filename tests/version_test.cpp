// SPDX-License-Identifier: Apache-2.0
// gpukit/version.hpp: the version the header states is the project's (CMakeLists.txt's
// project(VERSION), passed in as GPUKIT_TEST_PROJECT_VERSION), in each of its spellings.
#include <gpukit/version.hpp>

#include <doctest/doctest.h>

#include <string>

TEST_SUITE("version")
{
  TEST_CASE("version: the macros, the string and gpukit::version agree with the project's version")
  {
    std::string const expected = GPUKIT_TEST_PROJECT_VERSION;
    CHECK(std::string{GPUKIT_VERSION_STRING} == expected);
    CHECK(std::string{gpukit::version_string} == expected);
    CHECK(std::to_string(gpukit::version.major) + "." + std::to_string(gpukit::version.minor) +
            "." + std::to_string(gpukit::version.patch) ==
          expected);
    static_assert(GPUKIT_VERSION ==
                  GPUKIT_VERSION_MAJOR * 10000 + GPUKIT_VERSION_MINOR * 100 + GPUKIT_VERSION_PATCH);
  }
}

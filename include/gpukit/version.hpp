// SPDX-FileCopyrightText: gpukit contributors
// SPDX-License-Identifier: Apache-2.0
//
// gpukit/version.hpp: the version of these headers, for the preprocessor and for code.
//
// Quick start:
//
//   #include <gpukit/version.hpp>
//
//   #include <cstdio>
//
//   #if GPUKIT_VERSION < 200  // older than 0.2.0
//   #error "this code needs gpukit 0.2 or later"
//   #endif
//
//   void print_version()
//   {
//     std::printf("built with gpukit %s\n", GPUKIT_VERSION_STRING);  // "0.2.0"
//   }
//
// The numbers here are the source of truth for a build that takes the headers with a plain
// `-I include/`; gpukit's CMakeLists.txt refuses to configure when project(VERSION) says
// otherwise, so find_package, add_subdirectory and FetchContent users see the same version.
// Versions follow semantic versioning; before 1.0 a minor release may change the API, and
// CMake's find_package(gpukit X.Y) accepts only the same minor version. Nothing under `detail/`
// is API. Includes nothing, costs nothing.
#pragma once

/// The major version (incompatible API changes from 1.0 on).
#define GPUKIT_VERSION_MAJOR 0
/// The minor version (new features; before 1.0 also API changes).
#define GPUKIT_VERSION_MINOR 2
/// The patch version (fixes only).
#define GPUKIT_VERSION_PATCH 0

/// The version as one integer, MAJOR * 10000 + MINOR * 100 + PATCH (0.2.0 is 200), for `#if`.
#define GPUKIT_VERSION \
  (GPUKIT_VERSION_MAJOR * 10000 + GPUKIT_VERSION_MINOR * 100 + GPUKIT_VERSION_PATCH)

#define GPUKIT_DETAIL_STRINGIFY_IMPL(x) #x
#define GPUKIT_DETAIL_STRINGIFY(x)      GPUKIT_DETAIL_STRINGIFY_IMPL(x)
/// The version as a string literal, "MAJOR.MINOR.PATCH".
#define GPUKIT_VERSION_STRING                                                    \
  GPUKIT_DETAIL_STRINGIFY(GPUKIT_VERSION_MAJOR)                                  \
  "." GPUKIT_DETAIL_STRINGIFY(GPUKIT_VERSION_MINOR) "." GPUKIT_DETAIL_STRINGIFY( \
    GPUKIT_VERSION_PATCH)

#if GPUKIT_VERSION_MINOR > 99 || GPUKIT_VERSION_PATCH > 99
#error "gpukit/version.hpp: GPUKIT_VERSION holds a minor and a patch version of at most 99 each"
#endif

namespace gpukit {

/// The version these headers declare (the macros above, for code that prefers values).
struct version_info {
  int major;
  int minor;
  int patch;
};
/// gpukit's version, e.g. `gpukit::version.minor`.
inline constexpr version_info version{GPUKIT_VERSION_MAJOR, GPUKIT_VERSION_MINOR,
                                      GPUKIT_VERSION_PATCH};
/// gpukit's version as "MAJOR.MINOR.PATCH".
inline constexpr char const version_string[] = GPUKIT_VERSION_STRING;

}  // namespace gpukit

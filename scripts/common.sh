# SPDX-License-Identifier: Apache-2.0
# Sourced by scripts/demo and scripts/test: finds (or installs) what they need.

# Prints the packages the build needs that this machine lacks (names are Debian's).
gpukit_missing_build_tools() {
  command -v cmake >/dev/null || echo cmake
  command -v ninja >/dev/null || echo ninja-build
}

# True when doctest's header and CMake package can be found in the usual prefixes (or in
# CMAKE_PREFIX_PATH).
gpukit_have_doctest() {
  local prefixes=(/usr /usr/local) p
  if [[ -n "${CMAKE_PREFIX_PATH:-}" ]]; then
    IFS=: read -r -a extra <<<"$CMAKE_PREFIX_PATH"
    prefixes+=("${extra[@]}")
  fi
  for p in "${prefixes[@]}"; do
    [[ -f "$p/include/doctest/doctest.h" ]] || continue
    if compgen -G "$p/lib/cmake/doctest/doctestConfig.cmake" >/dev/null ||
      compgen -G "$p/lib/*/cmake/doctest/doctestConfig.cmake" >/dev/null ||
      compgen -G "$p/lib64/cmake/doctest/doctestConfig.cmake" >/dev/null ||
      compgen -G "$p/share/doctest/cmake/doctestConfig.cmake" >/dev/null ||
      compgen -G "$p/share/cmake/doctest/doctestConfig.cmake" >/dev/null; then
      return 0
    fi
  done
  return 1
}

# How many compile jobs to run: GPUKIT_JOBS, or one per core.
gpukit_jobs() { echo "${GPUKIT_JOBS:-$(nproc)}"; }

# SPDX-License-Identifier: Apache-2.0
# Sourced by the scripts: finds (or installs) what they need, and shared helpers.

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

# Copies this checkout's files (tracked, and untracked but not ignored: what a commit of the
# working tree would hold) into $1, as a user's fresh clone would have them: no build folders.
# Outside a git checkout (an unpacked release archive): every file but build*/ and dot folders.
gpukit_copy_checkout() {
  local dest="$1"
  mkdir -p "$dest"
  if [[ -e .git ]]; then
    git ls-files -z --cached --others --exclude-standard |
      while IFS= read -r -d '' f; do [[ -f "$f" ]] && printf '%s\0' "$f"; done |
      tar --null -T - -cf - | tar -xf - -C "$dest"
  else
    tar --exclude='./build*' --exclude='./.*' -cf - . | tar -xf - -C "$dest"
  fi
}

# Prints the python of a virtual environment build/venv-$1 holding the pip packages $2...,
# created (from the package registry) when missing; prints nothing and returns 1 when it cannot
# be made (no venv module, no registry). The packaging scripts take their tools from it.
gpukit_tool_venv() {
  local venv="build/venv-$1"
  shift
  if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -m pip show -q "${@%%[<>=]*}" >/dev/null 2>&1; then
    rm -rf "$venv"
    { python3 -m venv "$venv" && "$venv/bin/python" -m pip install -q "$@"; } >&2 || {
      rm -rf "$venv"
      return 1
    }
  fi
  echo "$PWD/$venv/bin/python"
}

# Prints the path of PyTorch $1's wheel for python3 in build/torch-wheel, downloaded from the
# package registry (about 530 MB for 2.11) when it is not there yet; prints nothing and returns 1
# when it cannot be had. One download serves scripts/check-torch-backend (PyTorch's headers) and
# scripts/torch-venv (PyTorch installed).
gpukit_torch_wheel() {
  local version="$1" dir=build/torch-wheel tag wheel
  tag="$(python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
  wheel="$(compgen -G "$dir/torch-$version-$tag-*.whl" | head -1 || true)"
  if [[ -z "$wheel" ]]; then
    echo "downloading PyTorch $version's wheel into $dir" >&2
    # Into a folder of its own, then moved: an interrupted download leaves no partial wheel.
    rm -rf "$dir/downloading"
    mkdir -p "$dir/downloading"
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir/downloading" \
      "torch==$version" >&2 && wheel="$(compgen -G "$dir/downloading/torch-$version-$tag-*.whl")" ||
      wheel=""
    if [[ -z "$wheel" ]]; then
      echo "PyTorch $version's wheel for $tag could not be downloaded" >&2
      rm -rf "$dir/downloading"
      return 1
    fi
    mv "$wheel" "$dir/"
    rm -rf "$dir/downloading"
    wheel="$dir/$(basename "$wheel")"
  fi
  echo "$PWD/$wheel"
}

#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# cmake/gpukit_syntax_only.sh COMPILER ARGS...: the compiler launcher that gpukit_syntax_only()
# (gpukit_syntax_only.cmake) sets on object libraries that are compile checks, never linked: the
# quick-start and README snippets, and the header tests in scripts/cccl-compat's builds. Runs the
# compile command CMake gives with -fsyntax-only (nvcc: its device front end only, and
# -fsyntax-only for the host compiler), which parses, instantiates what the file uses and warns as
# a full compile's front end does, but generates no code; then writes the object file (-o) empty,
# so that the build sees it made. A third to 60% less time per file than compiling it to code.
out=""
prev=""
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then out="$arg"; fi
  prev="$arg"
done
case "$(basename "$1")" in
  nvcc*) set -- "$@" -fdevice-syntax-only -Xcompiler=-fsyntax-only ;;
  *) set -- "$@" -fsyntax-only ;;
esac
"$@" || exit $?
if [ -n "$out" ]; then : >"$out"; fi

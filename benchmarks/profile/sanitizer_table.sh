#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# sanitizer_table.sh: how many planted one-byte overruns and reads after free compute-sanitizer
# catches inside gpukit pool blocks, per segment source, with and without the allocator's debug
# mode, and how many errors it reports on a clean run. Needs a GPU and compute-sanitizer.
#
#   benchmarks/profile/sanitizer_table.sh [path/to/sanitizer_planted] [jobs]
#
# Each planted bug is its own process (compute-sanitizer may end the context after an error):
# 8 overruns and 8 reads after free per row. "caught" counts runs whose report names an invalid
# access; "other" counts every other error the runs report (NVTX API misuse, say). Prints a
# Markdown table, then the command and date.
#
# Then the allocator's guard pages (debug.guard_pages, growable segments) WITHOUT any tool: each
# planted bug runs as `sanitizer_planted --guard-pages`, and "faulted" counts runs whose kernel
# failed with cudaErrorIllegalAddress (the program prints "result: faulted (...)" and exits 3).
# Rows: 1024-byte blocks (the overrun p[1024] is the first byte of the guard page) and 1000-byte
# blocks (p[1000] lands in the 24 bytes of alignment slack before the page end: not caught, by
# design). A second Markdown table. GUARD_ONLY=1 skips the compute-sanitizer matrix.
set -u
bin=${1:-build/dev/examples/sanitizer_planted}
jobs=${2:-8}
cs=${COMPUTE_SANITIZER:-compute-sanitizer}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

one() {  # source debug bug index -> writes $work/<name>.log
  local src=$1 dbg=$2 bug=$3 idx=$4
  local flag=""
  [ "$dbg" = on ] && flag=--debug
  "$cs" --tool memcheck --nvtx yes --print-limit 100 "$bin" --source "$src" --bug "$bug" \
    --index "$idx" $flag >"$work/$src.$dbg.$bug.$idx.log" 2>&1
}
export -f one
export bin cs work

guard() {  # bytes bug index -> writes $work/guard.<bytes>.<bug>.<index>.log (no tool)
  "$bin" --guard-pages --bytes "$1" --bug "$2" --index "$3" >"$work/guard.$1.$2.$3.log" 2>&1
  echo "exit: $?" >>"$work/guard.$1.$2.$3.log"
}
export -f guard

if [ "${GUARD_ONLY:-0}" = 1 ]; then matrix_sources=""; else matrix_sources="sync async growable"; fi
for src in $matrix_sources; do
  for dbg in off on; do
    echo "$src $dbg none 0"
    for bug in overrun uaf; do
      for idx in 0 1 2 3 4 5 6 7; do echo "$src $dbg $bug $idx"; done
    done
  done
done | xargs -P "$jobs" -L 1 bash -c 'one "$@"' _
for bytes in 1024 1000; do
  echo "$bytes none 0"
  for bug in overrun uaf; do
    for idx in 0 1 2 3 4 5 6 7; do echo "$bytes $bug $idx"; done
  done
done | xargs -P "$jobs" -L 1 bash -c 'guard "$@"' _

errors() { sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$1" | tail -1; }
invalid() { grep -c 'Invalid __global__' "$1"; }

if [ -n "$matrix_sources" ]; then
  echo "| segment source | debug mode | overruns caught | reads after free caught | clean-run errors | other errors (bug runs) |"
  echo "|---|---|---|---|---|---|"
fi
for src in $matrix_sources; do
  for dbg in off on; do
    declare -A caught=([overrun]=0 [uaf]=0)
    other=0
    for bug in overrun uaf; do
      for idx in 0 1 2 3 4 5 6 7; do
        f=$work/$src.$dbg.$bug.$idx.log
        inv=$(invalid "$f")
        err=$(errors "$f")
        [ "$inv" -gt 0 ] && caught[$bug]=$((caught[$bug] + 1))
        other=$((other + ${err:-0} - inv))
      done
    done
    clean=$(errors "$work/$src.$dbg.none.0.log")
    name=$src
    [ "$src" = sync ] && name=synchronous
    [ "$src" = async ] && name=stream_ordered
    echo "| $name | $dbg | ${caught[overrun]}/8 | ${caught[uaf]}/8 | ${clean:-?} | $other |"
  done
done

faulted() { grep -c 'result: faulted (cudaErrorIllegalAddress' "$1"; }
echo
echo "| guard pages, no tool | block bytes | overruns faulted | reads after free faulted | clean-run faults | other failures |"
echo "|---|---|---|---|---|---|"
for bytes in 1024 1000; do
  declare -A hit=([overrun]=0 [uaf]=0)
  odd=0
  for bug in overrun uaf; do
    for idx in 0 1 2 3 4 5 6 7; do
      f=$work/guard.$bytes.$bug.$idx.log
      if [ "$(faulted "$f")" -gt 0 ]; then
        hit[$bug]=$((hit[$bug] + 1))
      elif ! grep -q 'result: no fault' "$f"; then
        odd=$((odd + 1))  # neither: an error of another kind, or no GPU
      fi
    done
  done
  f=$work/guard.$bytes.none.0.log
  clean=$(grep -c 'result: faulted' "$f")
  grep -q 'result: no fault' "$f" || [ "$clean" -gt 0 ] || odd=$((odd + 1))
  slack=$(( (256 - bytes % 256) % 256 ))
  echo "| growable, debug.guard_pages | $bytes ($slack B slack) | ${hit[overrun]}/8 | ${hit[uaf]}/8 | $clean | $odd |"
done
if [ -n "${SANITIZER_TABLE_LOGS:-}" ]; then cp "$work"/*.log "$SANITIZER_TABLE_LOGS"/ 2>/dev/null; fi
echo
[ -n "$matrix_sources" ] &&
  echo "command: $cs --tool memcheck --nvtx yes $bin --source S --bug B --index I [--debug]"
echo "command (guard pages): $bin --guard-pages --bytes N --bug B --index I"
echo "date: $(date -u +%Y-%m-%d); $("$cs" --version 2>/dev/null | grep -i version | head -1)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1

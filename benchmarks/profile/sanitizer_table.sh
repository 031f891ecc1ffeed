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

for src in sync async growable; do
  for dbg in off on; do
    echo "$src $dbg none 0"
    for bug in overrun uaf; do
      for idx in 0 1 2 3 4 5 6 7; do echo "$src $dbg $bug $idx"; done
    done
  done
done | xargs -P "$jobs" -L 1 bash -c 'one "$@"' _

errors() { sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$1" | tail -1; }
invalid() { grep -c 'Invalid __global__' "$1"; }

echo "| segment source | debug mode | overruns caught | reads after free caught | clean-run errors | other errors (bug runs) |"
echo "|---|---|---|---|---|---|"
for src in sync async growable; do
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
if [ -n "${SANITIZER_TABLE_LOGS:-}" ]; then cp "$work"/*.log "$SANITIZER_TABLE_LOGS"/ 2>/dev/null; fi
echo
echo "command: $cs --tool memcheck --nvtx yes $bin --source S --bug B --index I [--debug]"
echo "date: $(date -u +%Y-%m-%d); $("$cs" --version 2>/dev/null | grep -i version | head -1)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1

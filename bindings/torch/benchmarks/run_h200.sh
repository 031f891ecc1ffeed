#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The PyTorch tables in one GPU call: builds gpukit_torch once (or reuses a build), then runs the
# parts asked for, each within its own budget and all within TOTAL seconds.
#
#   bash bindings/torch/benchmarks/run_h200.sh [compat] [bench] [train]     # none named: all
#   SITE=path/site.tgz bash bindings/torch/benchmarks/run_h200.sh train     # reuse a build
#   bash bindings/torch/benchmarks/run_h200.sh --dry-run [PART ...]         # the plan; no GPU
#
# The three parts together need more than one call's time at their full budgets: run
# `compat bench` (build, about 60-100 s, then 150 + 150 s), then `train` with SITE= pointing at
# the site.tgz the first call left (320 s).
#
# Parts (always in this order):
#   compat  tests/test_compat.py under native, gpukit (the default), gpukit:segments:growable
#           and gpukit:segments:synchronous, JOBS rows at a time
#   bench   near_limit.py, threads_bench.py, empty_free.py (the C++ library of threads_bench is
#           built with the package)
#   train   train_table.py (five models, native / expandable / gpukit, alternated in rounds)
#
# Writes into $OUT (default $WORK/out): summary.md (every table with its command and the date,
# GPU, driver and torch it ran on), results.tgz (results/: the raw JSON, tables and logs, to
# unpack as benchmarks/results/<date>-h200-torch-default/) and site.tgz (the built package and
# library: give it back as SITE= to the next call, which then builds nothing).
#
# Environment: PY (default /opt/torch/.venv/bin/python, else python3), TOTAL (560 s), budgets
# BUILD_S (300), COMPAT_S (150), BENCH_S (150, split 35/35/30% over near_limit, threads_bench,
# empty_free), TRAIN_S (320), JOBS (8), MAX_JOBS (compiler jobs, 8), WORK (scratch,
# /tmp/gpukit-h200); COMPAT_ALLOCATORS (test_compat's --allocators) and TRAIN_ARGS (more options
# for train_table.py, e.g. "--configs native,expandable,gpukit,gpukit:segments:growable"). A part whose budget the time left cannot give (less than MIN_PART_S, 40 s)
# is skipped and summary.md says so; each script also stops starting work at its own deadline.
set -u -o pipefail
# Paths given relative to where the script was started from, before it moves to the repository.
[ -n "${SITE:-}" ] && SITE=$(realpath -m "$SITE")
[ -n "${OUT:-}" ] && OUT=$(realpath -m "$OUT")
[ -n "${WORK:-}" ] && WORK=$(realpath -m "$WORK")
SCRIPT=$(realpath "${BASH_SOURCE[0]}")
cd "$(dirname "$SCRIPT")/../../.." || exit 2
REPO=$PWD
BENCH=bindings/torch/benchmarks

dry_run=0
parts=()
for a in "$@"; do
  case "$a" in
    compat | bench | train) parts+=("$a") ;;
    --dry-run) dry_run=1 ;;
    -h | --help)
      sed -n '2,/^set -u/p' "$SCRIPT" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "run_h200.sh: unknown part '$a' (compat, bench, train, --dry-run)" >&2
      exit 2
      ;;
  esac
done
[ ${#parts[@]} -eq 0 ] && parts=(compat bench train)
want() { # want PART: whether PART was asked for
  local p
  for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done
  return 1
}

PY=${PY:-/opt/torch/.venv/bin/python}
[ -x "$PY" ] || PY=python3
TOTAL=${TOTAL:-560}
BUILD_S=${BUILD_S:-300}
COMPAT_S=${COMPAT_S:-150}
BENCH_S=${BENCH_S:-150}
TRAIN_S=${TRAIN_S:-320}
MIN_PART_S=${MIN_PART_S:-40}
RESERVE_S=20 # packing the results at the end
JOBS=${JOBS:-8}
WORK=${WORK:-/tmp/gpukit-h200}
OUT=${OUT:-$WORK/out}
SITE_DIR=$WORK/site
RES=$WORK/results
THREADS_LIB=$SITE_DIR/gpukit_threads_bench.so
COMPAT_ALLOCATORS=${COMPAT_ALLOCATORS:-native,gpukit,gpukit:segments:growable,gpukit:segments:synchronous}
read -ra TRAIN_EXTRA <<< "${TRAIN_ARGS:-}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

start=$(date +%s)
left() { echo $((TOTAL - RESERVE_S - ($(date +%s) - start))); }
budget() { # budget WANTED: WANTED seconds, or what is left if less
  local l
  l=$(left)
  if [ "$1" -lt "$l" ]; then echo "$1"; else echo "$l"; fi
}
log() { echo "[$(($(date +%s) - start)) s] $*" | tee -a "$RES/run.log"; }

# What the build depends on, so that a reused build can be checked against this checkout.
source_hash() {
  find include bindings/torch/csrc bindings/torch/include bindings/torch/gpukit_torch \
    bindings/torch/setup.py bindings/torch/pyproject.toml "$BENCH/threads_bench.cpp" \
    -type f ! -name '*.pyc' 2>/dev/null | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16
}

if [ $dry_run -eq 1 ]; then
  echo "run_h200.sh plan: parts ${parts[*]}; TOTAL $TOTAL s (${RESERVE_S} s kept for packing)"
  echo "  build: ${SITE:+reuse $SITE if its source hash matches, else }pip install" \
    "--no-build-isolation --no-deps --target $SITE_DIR ./bindings/torch (at most $BUILD_S s)," \
    "then $BENCH/threads_bench.py --build-only --lib $THREADS_LIB; source hash $(source_hash)"
  want compat && echo "  compat: $COMPAT_S s: test_compat.py --jobs $JOBS --allocators $COMPAT_ALLOCATORS"
  if want bench; then
    echo "  bench: $BENCH_S s: near_limit $((BENCH_S * 35 / 100)) s, threads_bench" \
      "$((BENCH_S * 35 / 100)) s, empty_free the rest"
    "$PY" "$BENCH/near_limit.py" --dry-run --deadline $((BENCH_S * 35 / 100)) | sed 's/^/    /'
    "$PY" "$BENCH/threads_bench.py" --dry-run --lib "$THREADS_LIB" \
      --deadline $((BENCH_S * 35 / 100)) | sed 's/^/    /'
    "$PY" "$BENCH/empty_free.py" --dry-run --deadline $((BENCH_S * 30 / 100)) | sed 's/^/    /'
  fi
  if want train; then
    echo "  train: $TRAIN_S s"
    "$PY" "$BENCH/train_table.py" --dry-run --deadline $((TRAIN_S - 15)) "${TRAIN_EXTRA[@]}" |
      sed 's/^/    /'
  fi
  echo "  out: $OUT/summary.md, $OUT/results.tgz, $OUT/site.tgz"
  exit 0
fi

rm -rf "$RES"
mkdir -p "$OUT" "$RES/logs" "$SITE_DIR"
summary=$RES/summary.md
status=0
{
  date -u '+%Y-%m-%d %H:%M:%S UTC'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"
  git -C "$REPO" rev-parse HEAD 2>/dev/null || echo "commit unknown (no .git here)"
  echo "source hash $(source_hash)"
} > "$RES/env.txt" 2>&1
env_line="$(head -1 "$RES/env.txt"); $(sed -n 2p "$RES/env.txt"); $(sed -n 3p "$RES/env.txt")"
{
  echo "# gpukit_torch on the GPU: $(head -1 "$RES/env.txt")"
  echo
  echo "$env_line; checkout $(sed -n 4p "$RES/env.txt") ($(sed -n 5p "$RES/env.txt"))."
  echo "Command: \`bash $BENCH/run_h200.sh ${parts[*]}\`${SITE:+ with SITE=$SITE}${TRAIN_ARGS:+ and TRAIN_ARGS=\"$TRAIN_ARGS\"}; parts in"
  echo "the order compat, bench, train; TOTAL $TOTAL s."
  echo
} > "$summary"
log "parts: ${parts[*]}; $(sed -n 2,3p "$RES/env.txt" | tr '\n' ' ')"

# ---- build (or reuse) ---------------------------------------------------------------------
hash=$(source_hash)
built=""
if [ -n "${SITE:-}" ]; then
  if tar -xzf "$SITE" -C "$SITE_DIR" 2>> "$RES/logs/build.log"; then
    if [ "$(cat "$SITE_DIR/SOURCE_HASH" 2>/dev/null)" = "$hash" ]; then
      built="reused from $SITE (built from the same sources, hash $hash)"
    else
      log "SITE=$SITE was built from other sources ($(cat "$SITE_DIR/SOURCE_HASH" 2>/dev/null || echo unknown) != $hash): building again"
    fi
  else
    log "SITE=$SITE could not be unpacked: building"
  fi
fi
if [ -z "$built" ]; then
  rm -rf "$SITE_DIR" && mkdir -p "$SITE_DIR" # pip --target keeps what a folder already holds
  t0=$(date +%s)
  b=$(budget "$BUILD_S")
  log "building gpukit_torch (pip, at most $b s)"
  MAX_JOBS=${MAX_JOBS:-8} timeout -k 10 "$b" "$PY" -m pip install --no-build-isolation --no-deps \
    --no-cache-dir --target "$SITE_DIR" ./bindings/torch > "$RES/logs/pip.log" 2>&1
  rc=$?
  log "pip install rc=$rc in $(($(date +%s) - t0)) s"
  echo "$hash" > "$SITE_DIR/SOURCE_HASH"
  built="built here: pip install --no-build-isolation --no-deps --target ... ./bindings/torch, rc $rc, $(($(date +%s) - t0)) s"
fi
if [ ! -f "$THREADS_LIB" ]; then # built with the package, so that site.tgz carries it
  "$PY" "$BENCH/threads_bench.py" --build-only --lib "$THREADS_LIB" >> "$RES/logs/build.log" 2>&1 ||
    log "threads_bench's library did not build (logs/build.log); threads_bench will report it"
fi
if PYTHONPATH=$SITE_DIR${PYTHONPATH:+:$PYTHONPATH} "$PY" -c "import torch, gpukit_torch._C" >> "$RES/logs/build.log" 2>&1; then
  log "gpukit_torch: $built"
  echo "gpukit_torch: $built." >> "$summary"
  # Debug sections are of no use there and could push the file past what a call returns.
  find "$SITE_DIR" -name '*.so' -exec strip --strip-debug {} + 2>/dev/null
  tar -czf "$OUT/site.tgz" -C "$SITE_DIR" . &&
    log "site.tgz: $(du -h "$OUT/site.tgz" | cut -f1) (give it back as SITE= next time)"
else
  log "gpukit_torch does not import after the build; see logs/pip.log and logs/build.log"
  {
    echo "**gpukit_torch did not build or import**: nothing ran. Last lines of pip.log:"
    echo '```'
    tail -30 "$RES/logs/pip.log" 2>/dev/null
    tail -10 "$RES/logs/build.log" 2>/dev/null
    echo '```'
  } >> "$summary"
  parts=()
  status=1
fi
export PYTHONPATH=$SITE_DIR${PYTHONPATH:+:$PYTHONPATH}

# run_part NAME SECONDS CMD...: runs CMD under `timeout` (SECONDS plus a grace), logging to
# logs/NAME.log; returns CMD's status (124 when stopped at its budget).
run_part() {
  local name=$1 secs=$2 rc
  shift 2
  log "$name: ${secs} s: $*"
  timeout -k 10 $((secs + 20)) "$@" > "$RES/logs/$name.log" 2>&1
  rc=$?
  log "$name: rc=$rc"
  [ $rc -eq 124 ] && echo "($name was stopped at its budget of $secs s: what it had written is below.)" >> "$summary"
  [ $rc -ne 0 ] && status=1
  return $rc
}

# table TITLE FILE: appends FILE (a table with its command and environment line) to the summary
table() {
  {
    echo
    echo "## $1"
    echo
    if [ -f "$2" ]; then cat "$2"; else echo "(no table: see the logs in results.tgz)"; fi
  } >> "$summary"
}

skip() {
  log "$1: skipped, $(left) s left"
  printf '\n## %s\n\nSkipped: %s s were left of TOTAL %s s.\n' "$1" "$(left)" "$TOTAL" >> "$summary"
}

if want compat; then
  b=$(budget "$COMPAT_S")
  if [ "$b" -ge "$MIN_PART_S" ]; then
    mkdir -p "$RES/compat"
    cmd=("$PY" bindings/torch/tests/test_compat.py --out "$RES/compat" --jobs "$JOBS"
      --allocators "$COMPAT_ALLOCATORS")
    run_part compat "$b" "${cmd[@]}"
    if [ -f "$RES/compat/compat.md" ]; then
      {
        echo "\`python3 bindings/torch/tests/test_compat.py --jobs $JOBS --allocators $COMPAT_ALLOCATORS\`"
        echo
        echo "$env_line"
        echo
        cat "$RES/compat/compat.md"
      } > "$RES/compat/table.md"
    fi
    table "Compatibility" "$RES/compat/table.md"
  else
    skip "Compatibility"
  fi
fi

if want bench; then
  b=$(budget "$BENCH_S")
  if [ "$b" -ge "$MIN_PART_S" ]; then
    mkdir -p "$RES/bench"
    s=$((b * 35 / 100))
    run_part near_limit "$s" "$PY" "$BENCH/near_limit.py" --deadline "$s" --out "$RES/bench"
    table "Near the memory limit" "$RES/bench/near_limit.md"
    s=$(budget $((b * 35 / 100)))
    run_part threads_bench "$s" "$PY" "$BENCH/threads_bench.py" --lib "$THREADS_LIB" \
      --deadline "$s" --out "$RES/bench"
    table "Threads through PyTorch's C++ allocator API" "$RES/bench/threads_bench.md"
    s=$(budget $((b * 30 / 100)))
    if [ "$s" -ge 15 ]; then
      run_part empty_free "$s" "$PY" "$BENCH/empty_free.py" --deadline "$s" --out "$RES/bench"
      table "torch.empty + free from Python" "$RES/bench/empty_free.md"
    else
      skip "torch.empty + free from Python"
    fi
  else
    skip "Benchmarks (near_limit, threads_bench, empty_free)"
  fi
fi

if want train; then
  b=$(budget "$TRAIN_S")
  if [ "$b" -ge "$MIN_PART_S" ]; then
    mkdir -p "$RES/train"
    run_part train_table "$b" "$PY" "$BENCH/train_table.py" --deadline $((b - 15)) \
      --out "$RES/train" "${TRAIN_EXTRA[@]}"
    table "Training" "$RES/train/train_table.md"
  else
    skip "Training"
  fi
fi

log "done in $(($(date +%s) - start)) s, status $status"
cp "$summary" "$OUT/summary.md"
tar -czf "$OUT/results.tgz" -C "$WORK" results
cat "$OUT/summary.md"
exit $status

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# benchmarks/memory/compare_builds.sh: two or more builds of the allocator measured side by side on
# the GPU, alternated round by round in one run, so that drift of the machine hits each alike.
#
#   benchmarks/memory/compare_builds.sh NAME=BINDIR [NAME=BINDIR ...]
#
# Each BINDIR holds allocator_bench and replay_trace (a build's bin/benchmarks, e.g.
# build/h200/bin/benchmarks, built here with `cmake --preset h200` for sm_90 and carried along with
# Google Benchmark's library: ../shared/device/carry-libs.sh DIR, LD_LIBRARY_PATH=DIR). The first
# build is the baseline. Per round, in the order given (and reversed every other round):
#   - allocator_bench pair, threads and churn of gpukit (BENCH_FILTER), each build once;
#   - replay_trace of every trace in benchmarks/traces/ with the fixed segments (gpukit) and the
#     growable ones (gpukit_vmm), each build once.
# Writes into $OUT (default out/compare): raw.jsonl (one line per measurement) and summary.md:
# per benchmark, each build's median over rounds and its ratio to the baseline's, and for each
# build the growable source's time per replayed event over the fixed source's.
# ROUNDS (default 5), BENCH_FILTER, BENCH_MIN_TIME (default 0.1), REPLAY_REPEAT (default 3);
# BENCH=0 leaves allocator_bench out and RUNTIME=sim replays on the simulated GPU (to try the
# script on a machine without one). PIN_CORE=N runs every one-thread measurement (pair, churn
# and the replays) on core N alone (taskset), so that the machine moving the process between
# cores does not decide a few nanoseconds; `threads` then runs unpinned, in a process of its own.
# REPLAY_PAGES="8388608 ..." replays the growable source again at each of those page sizes
# (allocator gpukit_vmm_BYTES), beside its default.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-out/compare}
ROUNDS=${ROUNDS:-5}
FILTER=${BENCH_FILTER:-^(pair|threads|churn)/gpukit/}
MIN_TIME=${BENCH_MIN_TIME:-0.1}
REPEAT=${REPLAY_REPEAT:-3}
BENCH=${BENCH:-1}
RUNTIME=${RUNTIME:-cuda}
PIN_CORE=${PIN_CORE:-}
PAGES=${REPLAY_PAGES:-}
pin=()
[[ -n $PIN_CORE ]] && pin=(taskset -c "$PIN_CORE")
mkdir -p "$OUT"
raw="$OUT/raw.jsonl"
: >"$raw"
if [[ $# -lt 2 ]]; then
  echo "usage: $0 NAME=BINDIR NAME=BINDIR [...]  (the first is the baseline)" >&2
  exit 2
fi
names=()
dirs=()
for arg in "$@"; do
  names+=("${arg%%=*}")
  dirs+=("${arg#*=}")
  for b in replay_trace $([[ ${BENCH:-1} == 1 ]] && echo allocator_bench); do
    [[ -x "${arg#*=}/$b" ]] || { echo "$0: ${arg#*=}/$b is missing" >&2; exit 2; }
  done
done

bench_once() {  # name dir round
  local json="$OUT/bench-$1-$3.json"
  local parts=("$json")
  if [[ -n $PIN_CORE ]]; then  # one thread pinned; `threads` unpinned, its own process
    parts=("$json" "$OUT/bench-$1-$3-threads.json")
    "${pin[@]}" "$2/allocator_bench" --benchmark_filter="^(pair|churn)/gpukit/" \
      --benchmark_min_time="$MIN_TIME" --benchmark_out="$json" --benchmark_out_format=json \
      >/dev/null 2>&1 || echo "allocator_bench $1 round $3 (pinned): exit $?" >&2
    "$2/allocator_bench" --benchmark_filter="^threads/gpukit/" --benchmark_min_time="$MIN_TIME" \
      --benchmark_out="${parts[1]}" --benchmark_out_format=json >/dev/null 2>&1 ||
      echo "allocator_bench $1 round $3 (threads): exit $?" >&2
  else
    "$2/allocator_bench" --benchmark_filter="$FILTER" --benchmark_min_time="$MIN_TIME" \
      --benchmark_out="$json" --benchmark_out_format=json >/dev/null 2>&1 ||
      echo "allocator_bench $1 round $3: exit $?" >&2
  fi
  for json in "${parts[@]}"; do
  python3 - "$json" "$1" "$3" >>"$raw" <<'EOF'
import json, sys
path, build, rnd = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    data = json.load(open(path))
except (OSError, ValueError):
    sys.exit(0)
for b in data.get("benchmarks", []):
    if b.get("run_type") == "aggregate":
        continue
    print(json.dumps({"kind": "bench", "build": build, "round": rnd, "name": b["name"],
                      "ns": b["real_time"] if b.get("time_unit") == "ns" else None,
                      "time": b["real_time"], "unit": b.get("time_unit")}))
EOF
  done
}

replay_once() {  # name dir round
  local t a line page args
  for t in benchmarks/traces/*.trace; do
    for a in gpukit gpukit_vmm $(for page in $PAGES; do echo "gpukit_vmm_$page"; done); do
      args=(--allocator "${a%_[0-9]*}")
      [[ $a == gpukit_vmm_* ]] && args+=(--page-bytes "${a##*_}")
      line=$(timeout 120 "${pin[@]}" "$2/replay_trace" --trace "$t" --runtime "$RUNTIME" \
        "${args[@]}" --repeat "$REPEAT" 2>/dev/null | tail -1)
      [[ -n "$line" ]] || { echo "replay $1 $t $a: no result" >&2; continue; }
      python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(kind="replay", build=sys.argv[2], round=int(sys.argv[3]), trace=sys.argv[4], allocator=sys.argv[5]); print(json.dumps(d))' \
        "$line" "$1" "$3" "$(basename "$t" .trace)" "$a" >>"$raw"
    done
  done
}

for ((r = 0; r < ROUNDS; ++r)); do
  order=("${!names[@]}")
  if ((r % 2 == 1)); then order=($(printf '%s\n' "${order[@]}" | tac)); fi
  echo "=== round $r ($(date -u +%H:%M:%S))"
  [[ $BENCH == 1 ]] && for i in "${order[@]}"; do bench_once "${names[$i]}" "${dirs[$i]}" "$r"; done
  for i in "${order[@]}"; do replay_once "${names[$i]}" "${dirs[$i]}" "$r"; done
done

python3 - "$raw" "${names[@]}" >"$OUT/summary.md" <<'EOF'
import collections, json, statistics, sys
raw, builds = sys.argv[1], sys.argv[2:]
base = builds[0]
rows = [json.loads(l) for l in open(raw) if l.strip()]
med = collections.defaultdict(list)
for r in rows:
    if r["kind"] == "bench":
        med[(r["name"], r["build"])].append(r["time"])
    else:
        med[(f"replay {r['trace']} {r['allocator']} ns/event", r["build"])].append(r["ns_per_event"])
        if "ratio" in r:
            med[(f"replay {r['trace']} {r['allocator']} reserved/live", r["build"])].append(r["ratio"])
names = sorted({k[0] for k in med})
print(f"# {' vs '.join(builds)}: medians over rounds (ratio to {base})\n")
print("| benchmark | " + " | ".join(builds) + " |")
print("|---|" + "---|" * len(builds))
for n in names:
    cells = []
    b0 = statistics.median(med[(n, base)]) if med.get((n, base)) else None
    for b in builds:
        v = med.get((n, b))
        if not v:
            cells.append("-")
            continue
        m = statistics.median(v)
        cells.append(f"{m:.4g}" + ("" if b == base or not b0 else f" ({m / b0:.3f}x)"))
    print(f"| {n} | " + " | ".join(cells) + " |")
print("\n## Growable over fixed segments, time per replayed event\n")
print("Median over rounds of each round's ratio (the two replays of a round ran back to back), "
      "with the lowest and highest round in brackets.\n")
traces = sorted({r["trace"] for r in rows if r["kind"] == "replay"})
growables = sorted({r["allocator"] for r in rows if r["kind"] == "replay"} - {"gpukit"})
by_round = {(r["trace"], r["allocator"], r["build"], r["round"]): r["ns_per_event"]
            for r in rows if r["kind"] == "replay"}
print("| trace | growable | " + " | ".join(builds) + " |")
print("|---|---|" + "---|" * len(builds))
for t in traces:
    for g in growables:
        cells = []
        for b in builds:
            q = [by_round[(t, g, b, n)] / by_round[(t, "gpukit", b, n)]
                 for (tt, gg, bb, n) in by_round if (tt, gg, bb) == (t, g, b)
                 and (t, "gpukit", b, n) in by_round]
            cells.append(f"{statistics.median(q):.3f}x [{min(q):.2f}, {max(q):.2f}]" if q else "-")
        print(f"| {t} | {g} | " + " | ".join(cells) + " |")
EOF
cat "$OUT/summary.md"

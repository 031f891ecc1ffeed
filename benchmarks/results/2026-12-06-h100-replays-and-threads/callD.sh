#!/bin/bash
# 1) replays old vs new2 (fixed, growable default, growable 8 MiB), pinned, alternated, raw kept;
# 2) backend/core threads harness: base vs spin-then-block locks vs region-sharded records vs both
D=build/gpu26
export LD_LIBRARY_PATH=$PWD/$D/libs
mkdir -p /tmp/d/cmp /tmp/d/tb
BENCH=0 ROUNDS=${ROUNDS:-5} PIN_CORE=5 REPLAY_PAGES="8388608" OUT=/tmp/d/cmp \
  timeout ${CMP_S:-240} bash benchmarks/memory/compare_builds.sh old=$D/old new=$D/new2 2>&1 | tail -25
for r in 1 2; do for v in cuda spin region both; do
  timeout 60 $D/tb_$v cuda ${TB_S:-0.5} "" 1 8 16 2>&1 | grep mops | sed "s/^/{\"variant\":\"$v\",\"round\":$r,\"r\":/; s/}\$/}}/" >> /tmp/d/tb/tb.jsonl
done; done
python3 - /tmp/d/tb/tb.jsonl <<'PY' | tee /tmp/d/tb/summary.txt
import json,sys,collections
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    x=json.loads(l); r=x['r']; d[(r['mode'],r['threads'],x['variant'])].append(r['mops'])
for k in sorted(d): print(k, [round(v,2) for v in d[k]])
PY
[ -n "${NO_TAR:-}" ] || tar czf $OUT/d.tgz -C /tmp d

#!/bin/bash
# Replays old vs new2 alternated (issue: the layered allocator unchanged), and the backend_threads
# lock variants; then probes gdb/perf availability. Output tarred into $OUT/d.tgz.
D=build/gpu26
S=$(date +%s)
mkdir -p /tmp/d
CMP_S=${CMP_S:-200} ROUNDS=${ROUNDS:-5} NO_TAR=1 bash $D/callD.sh > /tmp/d/callD.log 2>&1
echo "[$(( $(date +%s) - S )) s] callD done"; tail -30 /tmp/d/callD.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/d/gpu.txt 2>&1
which gdb perf >> /tmp/d/gpu.txt 2>&1
tar czf $OUT/d.tgz -C /tmp d

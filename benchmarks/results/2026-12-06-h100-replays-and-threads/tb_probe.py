# Where 16 threads through PyTorch's C++ allocator API spend their time: runs threads_bench's
# library for SECONDS in a Python thread and samples /proc/self/task/*/{stat,wchan} meanwhile.
# usage: tb_probe.py LIB CONFIG [SECONDS] [THREADS]
import collections, ctypes, math, os, random, sys, threading, time, json
lib_path, config = sys.argv[1], sys.argv[2]
secs = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
nthreads = int(sys.argv[4]) if len(sys.argv) > 4 else 16
if config.startswith("gpukit"):
    import gpukit_torch
    print("install:", gpukit_torch.install(config.split(":", 1)[1] if ":" in config else ""))
import torch
torch.cuda.init(); torch.empty(1, device="cuda")
lib = ctypes.CDLL(os.path.abspath(lib_path))
fn = lib.gpukit_threads_bench
fn.restype = ctypes.c_int
fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.c_int,
               ctypes.c_long, ctypes.c_double, ctypes.POINTER(ctypes.c_double), ctypes.c_char_p, ctypes.c_int]
rng = random.Random(11)
sizes = [int(math.exp(rng.uniform(math.log(512), math.log(2 << 20)))) for _ in range(64)]
cs = (ctypes.c_size_t * 64)(*sizes)
def run(n, s):
    out = (ctypes.c_double * 4)(); err = ctypes.create_string_buffer(1024)
    rc = fn(n, 0, 8, cs, 64, 2000, s, out, err, 1024)
    return rc, list(out), err.value
print("warm", run(nthreads, 0.2))
res = {}
t = threading.Thread(target=lambda: res.update(r=run(nthreads, secs)))
me = threading.get_native_id()
t.start(); time.sleep(0.3)
states = collections.Counter(); wchans = collections.Counter(); samples = 0
end = time.time() + secs - 0.6
while time.time() < end:
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == me: continue
        try:
            st = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()[0]
            wc = open(f"/proc/self/task/{tid}/wchan").read().strip() or "-"
        except OSError:
            continue
        states[st] += 1; wchans[wc] += 1
    samples += 1; time.sleep(0.01)
t.join()
rc, out, e = res["r"]
print(json.dumps({"config": config, "threads": nthreads, "mops": out[0] / out[1] / 1e6, "min": out[2], "max": out[3],
                  "samples": samples, "states": dict(states), "wchan": dict(wchans.most_common(8))}))

# SPDX-License-Identifier: Apache-2.0
"""What the allocator benchmarks (near_limit.py, threads_bench.py, empty_free.py) share: the
allocator configurations, worker processes that stay up and are driven in turn (so that the
configurations alternate inside one run), a deadline, and writing results. Imports no torch.

Allocators (--configs), each in a process of its own (PyTorch picks its allocator once):
    native        PyTorch's caching allocator
    expandable    the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    gpukit        gpukit_torch.install() with the backend's defaults
    gpukit:CONF   gpukit_torch.install(CONF), e.g. gpukit:segments:growable
"""

import json
import os
import select
import statistics
import subprocess
import sys
import time

CONFIGS = ("native", "expandable", "gpukit")
GiB = float(1 << 30)
MiB = float(1 << 20)


def parse_configs(ap, text, allowed=CONFIGS):
    """--configs' comma-separated list, each an allowed name or gpukit:CONF; ap.error otherwise."""
    chosen = [c for c in text.split(",") if c]
    for c in chosen:
        if c not in allowed and not (c.startswith("gpukit:") and len(c) > len("gpukit:")):
            ap.error(f"--configs: unknown allocator {c!r} (known: {', '.join(allowed)}, "
                     "gpukit:CONF)")
    if len(set(chosen)) != len(chosen) or not chosen:
        ap.error(f"--configs {text!r}: name each allocator once, at least one")
    return chosen


def child_env(config):
    """The environment of a worker for `config`: PYTORCH_CUDA_ALLOC_CONF set for expandable and
    removed otherwise (gpukit takes its settings from install(), GPUKIT_ALLOC_CONF unset)."""
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("GPUKIT_ALLOC_CONF", None)
    env.pop("GPUKIT_TORCH_INSTALL", None)
    env["PYTHONUNBUFFERED"] = "1"
    if config == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


def install_allocator(config):
    """In a worker, before CUDA is first used: installs gpukit for gpukit[:CONF]. Returns the
    settings in effect (install()'s answer, or PYTORCH_CUDA_ALLOC_CONF)."""
    if config == "gpukit" or config.startswith("gpukit:"):
        import gpukit_torch  # noqa: PLC0415

        return "gpukit " + gpukit_torch.install(config.split(":", 1)[1] if ":" in config else "")
    return "torch " + (os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "(defaults)")


def gpukit_counters(config, keys=("segments", "num_ooms", "num_alloc_retries")):
    """gpukit's own statistics worth a line in the results, {} for PyTorch's allocator."""
    if not config.startswith("gpukit"):
        return {}
    import gpukit_torch  # noqa: PLC0415

    s = gpukit_torch.gpukit_stats()
    return {k: s[k] for k in keys if k in s}


class Deadline:
    """Seconds left of a budget that started when it was made."""

    def __init__(self, seconds):
        self.seconds = float(seconds)
        self.start = time.monotonic()

    def elapsed(self):
        return time.monotonic() - self.start

    def left(self):
        return self.seconds - self.elapsed()

    def allows(self, seconds):
        """Whether `seconds` more still fit."""
        return self.left() >= seconds


# ---- a worker that stays up: the driver's side ----------------------------------------------

class WorkerError(RuntimeError):
    pass


class Worker:
    """A child process serving requests one at a time (serve() on its side): a JSON line in on
    its stdin, a `RESULT {json}` line out on its stdout. Its other output (stderr, and whatever
    a library prints) goes to log_path."""

    def __init__(self, name, cmd, env, log_path):
        self.name, self.log_path, self._buf = name, log_path, b""
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log)
        self.ready = None

    def _line(self, timeout):
        end = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = end - time.monotonic()
            if left <= 0:
                raise WorkerError(f"{self.name}: no answer within {timeout:.0f} s")
            readable, _, _ = select.select([fd], [], [], left)
            if readable:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    self.proc.wait(timeout=10)
                    raise WorkerError(f"{self.name}: exited with {self.proc.returncode}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode(errors="replace")

    def _expect(self, tag, timeout):
        end = time.monotonic() + timeout
        while True:
            line = self._line(max(0.0, end - time.monotonic()))
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1:])

    def wait_ready(self, timeout):
        """The worker's READY line (what it reports about itself once set up)."""
        self.ready = self._expect("READY", timeout)
        return self.ready

    def send(self, request):
        """Sends one request (a dict); receive() reads its answer."""
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerError(f"{self.name}: cannot send ({e})") from e

    def receive(self, timeout):
        """The answer to the request sent last (a dict; "error" when it failed)."""
        return self._expect("RESULT", timeout)

    def call(self, request, timeout):
        """Sends one request and returns the worker's answer."""
        self.send(request)
        return self.receive(timeout)

    def log_tail(self, lines=10):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read().strip().splitlines()[-lines:]
        except OSError:
            return []

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"quit": true}\n')
                self.proc.stdin.flush()
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def start_workers(script, configs, extra_args, log_dir, deadline, startup_timeout=180,
                  describe=None):
    """Starts one worker per config (all at once: their start-ups overlap) and waits for each to
    be ready, printing a line for each (`describe(ready)`, the worker's ready message, says
    what follows "ready") and the log tail of each that failed. Returns ({config: Worker},
    {config: error dict})."""
    os.makedirs(log_dir, exist_ok=True)
    workers, failed = {}, {}
    for c in configs:
        cmd = [sys.executable, script, "--serve", c] + list(extra_args)
        log = os.path.join(log_dir, f"{os.path.basename(script).split('.')[0]}."
                                    f"{c.replace(':', '_').replace(',', '_')}.log")
        workers[c] = Worker(c, cmd, child_env(c), log)
    for c in list(workers):
        try:
            workers[c].wait_ready(max(5.0, min(startup_timeout, deadline.left())))
        except (WorkerError, ValueError) as e:
            failed[c] = {"config": c, "error": str(e), "log_tail": workers[c].log_tail()}
            workers.pop(c).close()
    for c, w in workers.items():
        detail = describe(w.ready) if describe else w.ready.get("settings")
        print(f"  {c}: ready ({detail})", flush=True)
    for c, f in failed.items():
        print(f"  {c}: FAILED to start: {f['error']}", flush=True)
        for line in f["log_tail"]:
            print(f"      | {line}", flush=True)
    return workers, failed


class Rounds:
    """The rounds of an alternation: iterating yields (r, order), the workers in round r's order,
    which starts with the r-th worker (mod their number) so that the machine's drift favours
    none. A round starts only while workers are left and the longest round so far (with a fifth
    more) still fits the deadline; `skipped()` then says how many did not run and why."""

    def __init__(self, workers, rounds, deadline):
        self.workers, self.rounds, self.deadline = workers, rounds, deadline
        self.done, self.why = 0, ""

    def __iter__(self):
        longest = 0.0
        for r in range(self.rounds):
            if not self.workers:
                self.why = "no worker left"
                return
            if self.done and not self.deadline.allows(longest * 1.2):
                self.why = "the deadline came first"
                return
            started = time.monotonic()
            configs = list(self.workers)
            k = r % len(configs)
            yield r, configs[k:] + configs[:k]
            longest = max(longest, time.monotonic() - started)
            self.done += 1

    def skipped(self):
        """How many rounds did not run and why ("" when all ran)."""
        return f"{self.rounds - self.done} of {self.rounds} rounds skipped: {self.why}" \
            if self.why else ""


def alternate(workers, cases, rounds, deadline, timeout, progress=None):
    """Asks every worker every case, round after round (Rounds: the order turns each round, and
    the deadline decides whether another starts).

    workers: {config: Worker}, in order (one that fails is closed and dropped); cases: a list of
    (label, request). Returns (records, skipped): one record per answer, the answer's dict
    with round, case and config added (and error, log_tail for a worker that failed); skipped
    says how many rounds did not run and why ("" when all ran)."""
    records, schedule = [], Rounds(workers, rounds, deadline)
    for r, order in schedule:
        for label, request in cases:
            for c in order:
                if c not in workers:
                    continue
                try:
                    answer = workers[c].call(request, max(10.0, min(timeout, deadline.left() + 30)))
                except (WorkerError, ValueError) as e:
                    answer = {"error": str(e), "log_tail": workers[c].log_tail()}
                    workers.pop(c).close()
                record = dict(answer, round=r, case=label, config=c)
                records.append(record)
                if progress:
                    progress(record)
    return records, schedule.skipped()


def per_round_ratios(records, case, config, reference, key):
    """For each round where both answered: record[key] of config over reference's."""
    by_round = {}
    for rec in records:
        if rec["case"] == case and "error" not in rec and rec.get(key):
            by_round.setdefault(rec["round"], {})[rec["config"]] = rec[key]
    return [v[config] / v[reference] for v in by_round.values()
            if config in v and reference in v]


def quantile(values, q):
    """The q-quantile (0..1) of values by linear interpolation; None when empty."""
    if not values:
        return None
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def close_all(workers):
    for w in list(workers.values()):
        w.close()
    workers.clear()


# ---- a worker that stays up: its own side ---------------------------------------------------

def protocol_channel():
    """Call first thing in a worker, before torch is imported: keeps the real stdout for the
    protocol and sends everything else written to stdout (Python's or a C library's) to stderr.
    Returns the protocol's file."""
    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


def serve(proto, ready, handle):
    """Reports `ready` (a dict), then answers each request line with handle(request) until EOF
    or {"quit": true}. An exception becomes {"error": ...} and ends nothing."""
    proto.write("READY " + json.dumps(ready) + "\n")
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        request = json.loads(line)
        if request.get("quit"):
            break
        try:
            answer = handle(request)
        except Exception as e:  # noqa: BLE001 (reported to the driver, which goes on)
            import traceback  # noqa: PLC0415

            traceback.print_exc()
            answer = {"error": f"{type(e).__name__}: {e}"}
        proto.write("RESULT " + json.dumps(answer) + "\n")
    return 0


# ---- results --------------------------------------------------------------------------------

def median_or_none(values):
    return statistics.median(values) if values else None


def header_line(info):
    """`date, GPU, driver, torch` for the top of a table."""
    return (f"{info.get('date')}; {info.get('gpu') or 'GPU unknown'}; torch "
            f"{info.get('torch') or '?'} (CUDA {info.get('cuda') or '?'})")


def environment():
    """Date, GPU and driver (nvidia-smi), and the versions of torch (with its CUDA), torchvision
    and transformers, asked of a child so that torch is not imported here."""
    import datetime  # noqa: PLC0415

    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["gpu"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        info["gpu"] = None
    try:  # each package on its own: one missing leaves the others' versions
        out = subprocess.run([sys.executable, "-c", _VERSIONS], capture_output=True, text=True,
                             timeout=120)
        for line in out.stdout.splitlines():
            key, _, value = line.partition(" ")
            if value:
                info[key] = value
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


_VERSIONS = """
for name in ("torch", "torchvision", "transformers"):
    try:
        m = __import__(name)
        print(name, m.__version__)
        if name == "torch":
            print("cuda", m.version.cuda)
    except Exception:
        pass
"""


def write_outputs(out_dir, name, command, info, table, data):
    """out_dir/NAME.md (the command, the environment line and the table) and NAME.json."""
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name + ".md"), "w") as f:
        f.write(f"`{command}`\n\n{header_line(info)}\n\n{table}\n")
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(dict(data, command=command, environment=info), f, indent=1)


def finish(out_dir, name, info, table, deadline, rows, failed, data):
    """Prints the table and the time taken, writes out_dir/NAME.md and NAME.json (write_outputs;
    `data` gains rows and failed) and returns the exit status: 1 when a worker failed to start or
    a row has errors."""
    print()
    print(table)
    print(f"\ntotal {deadline.elapsed():.0f} s")
    write_outputs(out_dir, name, command_line(), info, table, dict(data, rows=rows, failed=failed))
    return 1 if failed or any(r["errors"] for r in rows.values()) else 0


def command_line():
    """This process's command line, as it would be typed (for the results' record)."""
    import shlex  # noqa: PLC0415

    return " ".join(shlex.quote(a) for a in ["python3"] + sys.argv)

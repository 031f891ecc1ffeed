#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# tests/scripts/layout_checks_test.py: the layout checks (scripts/check-includes,
# scripts/check-test-mirror, scripts/check-detail-boundary) fail on what they exist to refuse and
# pass on a tree without it, each run over a small tree made here. CTest: layout.checks_selftest.
import os
import pathlib
import subprocess
import sys
import tempfile

SCRIPTS = pathlib.Path(__file__).resolve().parent.parent.parent / "scripts"
failures = []


def write(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def run(script, root):
    p = subprocess.run([str(SCRIPTS / script), str(root)], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def expect(what, script, files, ok, needle=""):
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        write(root, files)
        code, out = run(script, root)
        if (code == 0) != ok or needle not in out:
            failures.append(f"{what}: {script} exited {code}, expected {'0' if ok else 'non-zero'}"
                            f"{' naming ' + repr(needle) if needle else ''}:\n{out}")


# A tree the include check accepts as it is: its allow-lists name these files and edges.
ALLOWED = {
    "include/gpukit/memory/caching_allocator.hpp": "".join(
        f"#include <gpukit/memory/detail/{n}.inl>\n"
        for n in ("caching_allocator", "graph_capture", "oom_recovery", "pool_segments", "release",
                  "stream_bookkeeping", "thread_cache")
    ),
    **{
        f"include/gpukit/memory/detail/{n}.inl": "#include <gpukit/memory/caching_allocator.hpp>\n"
        for n in ("caching_allocator", "graph_capture", "oom_recovery", "pool_segments", "release",
                  "stream_bookkeeping", "thread_cache")
    },
    "include/gpukit/detail/compiled.hpp": "#include <gpukit/runtime/detail/compiled_runtimes.hpp>\n",
    "include/gpukit/runtime/detail/compiled_runtimes.hpp": "",
}
GOOD = {
    **ALLOWED,
    "include/gpukit/error.hpp": "",
    "include/gpukit/runtime/runtime.hpp": "#include <gpukit/error.hpp>\n",
    "include/gpukit/host/pinned_pool.hpp": "#include <gpukit/runtime/runtime.hpp>\n"
    "#include <gpukit/host/detail/pinned_pool_impl.hpp>\n",
    "include/gpukit/host/detail/pinned_pool_impl.hpp": "#include <gpukit/error.hpp>\n",
}
expect("a layered, acyclic tree", "check-includes", GOOD, ok=True)
expect("a body file that includes its parent", "check-includes",
       {**GOOD, "include/gpukit/host/detail/pinned_pool_impl.hpp":
        "#include <gpukit/host/pinned_pool.hpp>\n"}, ok=False, needle="include cycle of 2 files")
expect("a core header that includes a runtime header", "check-includes",
       {**GOOD, "include/gpukit/error.hpp": "#include <gpukit/runtime/runtime.hpp>\n"},
       ok=False, needle="upward include: include/gpukit/error.hpp:1 (core) -> gpukit/runtime/runtime.hpp")
expect("a runtime header that includes a memory header", "check-includes",
       {**GOOD, "include/gpukit/memory/x.hpp": "",
        "include/gpukit/runtime/runtime.hpp": "#include <gpukit/memory/x.hpp>\n"},
       ok=False, needle="upward include")
expect("a component in no layer", "check-includes",
       {**GOOD, "include/gpukit/newthing/a.hpp": ""}, ok=False, needle="'newthing' is in no layer")
stale = dict(GOOD)
stale["include/gpukit/memory/detail/caching_allocator.inl"] = ""
expect("an allow-listed file in no cycle any more", "check-includes", stale, ok=False,
       needle="gpukit/memory/detail/caching_allocator.inl is in ALLOWED_CYCLE_FILES but in no cycle")

# The test mirror: every public header needs a test of its name or an entry.
with tempfile.TemporaryDirectory() as tmp:
    root = pathlib.Path(tmp)
    write(root, {"include/gpukit/host/pinned_pool.hpp": "", "tests/host/pinned_pool_test.cpp": ""})
    code, out = run("check-test-mirror", root)
    # The real lists name headers this tree lacks: each is reported, and pinned_pool.hpp is not.
    if code == 0 or "pinned_pool" in out or "listed, but no such public header" not in out:
        failures.append(f"check-test-mirror over a tree with its test:\n{out}")
    os.remove(root / "tests/host/pinned_pool_test.cpp")
    code, out = run("check-test-mirror", root)
    if code == 0 or "gpukit/host/pinned_pool.hpp: no tests/host/pinned_pool*_test.*" not in out:
        failures.append(f"check-test-mirror over a header without a test:\n{out}")

# The detail boundary, in a git checkout and outside one.
for use_git in (False, True):
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        write(root, {"tools/ok.cpp": "#include <gpukit/memory/testing.hpp>\n",
                     "bindings/x/own.hpp": "namespace gpukit_x::detail {}\n#include \"detail/y.hpp\"\n",
                     "benchmarks/results/run.log": "gpukit/memory/detail/x.inl:12\n",
                     "src/lib.cpp": "#include <gpukit/runtime/detail/sim_runtime_impl.hpp>\n"})
        if use_git:
            subprocess.run(["git", "init", "-q", str(root)], check=True)
        code, out = run("check-detail-boundary", root)
        if code != 0:
            failures.append(f"check-detail-boundary (git: {use_git}) over a clean tree:\n{out}")
        write(root, {"examples/bad.cpp": "int x = gpukit::detail::hex(0);\n"})
        code, out = run("check-detail-boundary", root)
        if code == 0 or "examples/bad.cpp:1:" not in out:
            failures.append(f"check-detail-boundary (git: {use_git}) over an offender:\n{out}")

if failures:
    print("\n\n".join(failures))
    sys.exit(1)
print("layout checks: every case as expected")

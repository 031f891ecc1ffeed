#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The CPU part of bindings/torch/tests/test_checkpoint.py (pytest -m "not gpu"), as CTest's
gpukit_torch.checkpoint runs it. Exits 77 (CTest: skipped), saying why, where this Python has no
torch or pytest, or cannot build gpukit's planner (no ninja and no gpukit_torch._C); otherwise
pytest's status, and a failure when pytest ran no test at all.

    python3 tests/pytorch/checkpoint_pytest.py [extra pytest arguments]
"""

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "..", "bindings", "torch", "tests", "test_checkpoint.py")
SKIP = 77


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)


def require(modules):
    """Exits 77, saying why, unless this Python has `modules` and can get gpukit's planner."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            skip(f"{sys.executable} has no {module} (pip install torch --index-url "
                 "https://download.pytorch.org/whl/cpu, and pytest, transformers, torchvision; or "
                 "set GPUKIT_TORCH_PYTHON to a Python that has them, such as scripts/torch-venv's, "
                 "and configure again)")
    if importlib.util.find_spec("gpukit_torch") is None or importlib.util.find_spec("gpukit_torch._C") is None:
        from torch.utils.cpp_extension import is_ninja_available  # noqa: PLC0415

        if not is_ninja_available():
            skip("gpukit's planner would be compiled from bindings/torch/csrc/planner.cpp, which "
                 "torch.utils.cpp_extension does with ninja, and ninja is not installed "
                 "(pip install ninja)")


def main():
    require(("torch", "pytest"))
    import pytest  # noqa: PLC0415

    status = pytest.main(["-q", "-rs", "-p", "no:cacheprovider", "-m", "not gpu", TESTS, *sys.argv[1:]])
    if status == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("FAILED: pytest collected no test")
        return 1
    return int(status)


if __name__ == "__main__":
    sys.exit(main())

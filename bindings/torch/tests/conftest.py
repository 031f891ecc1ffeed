# SPDX-License-Identifier: Apache-2.0
"""pytest's configuration for bindings/torch/tests: the `gpu` mark (tests that need CUDA; the CPU
part runs as `pytest -m "not gpu"`, as CTest's gpukit_torch.checkpoint does)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")

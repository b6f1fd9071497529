# SPDX-License-Identifier: Apache-2.0
"""The fixtures of the whole test tree (tests/reliability adds its own kernels on top):
``gpu`` (skips with the reason asyncmr gives without a CUDA device, and puts the process-wide
state back as it found it), ``two_gpus``, ``no_gpu``; and the switch that turns GPU skips into
failures on a GPU host (``ASYNCMR_REQUIRE_GPUS``, set by ci/gpu.sh)."""

import os
import sys

import pytest

# tests/reliability's helpers are imported by tests outside it (test_cache_soundness.py): on the
# path however few test files a run names (its own conftest, which put it there, is loaded only
# when a file of that folder is collected).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reliability"))

import gpu_helpers  # noqa: E402
from gpu_helpers import NOT_APPLICABLE, REQUIRED_GPUS, gpu_count, require_gpus  # noqa: E402

# Fixtures that mark a test as a GPU test for the switch below.
GPU_FIXTURES = {"gpu", "two_gpus"}


def pytest_configure(config):
    for line in (
        "gpu: needs a CUDA device",
        "multigpu: needs two CUDA devices",
        "soak: long stress run; skipped unless ASYNCMR_SOAK=1 (duration: ASYNCMR_STRESS_SECONDS)",
        "cuda_api_error: makes a CUDA call fail on purpose (compute-sanitizer reports those as "
        "API errors; run the sanitizer with --report-api-errors no, or deselect these)",
    ):
        config.addinivalue_line("markers", line)


@pytest.fixture
def gpu():
    """Skips without a CUDA device; yields the device count; restores the process-wide state
    (shared pools' settable attributes and routing, RMM's current resource, CuPy's
    allocators) afterwards."""
    count = require_gpus(1)
    saved = gpu_helpers.save_process_state()
    try:
        yield count
    finally:
        gpu_helpers.restore_process_state(saved)


@pytest.fixture
def two_gpus(gpu):
    return require_gpus(2)


@pytest.fixture
def no_gpu():
    count, _ = gpu_count()
    if count:
        pytest.skip("a CUDA device is present; this test checks the no-GPU behaviour (the GPU "
                    "host checks it in a child without visible devices)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under ASYNCMR_REQUIRE_GPUS, a GPU test that skips for any reason but "not applicable"
    fails: a skip raised by a library (pytest.importorskip, a guard) must not pass silently."""
    outcome = yield
    report = outcome.get_result()
    if not (REQUIRED_GPUS and report.skipped and GPU_FIXTURES & set(item.fixturenames)):
        return
    if "two_gpus" in item.fixturenames and REQUIRED_GPUS < 2:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if NOT_APPLICABLE in reason:
        return
    report.outcome = "failed"
    report.longrepr = (f"GPU test skipped on a host with ASYNCMR_REQUIRE_GPUS={REQUIRED_GPUS}: "
                       f"{reason}")

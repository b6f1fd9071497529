# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the reliability suite, self-contained (no other conftest is relied on).

``gpu`` skips with the reason asyncmr gives when there is no usable CUDA device, and puts the
process-wide pool state (every settable attribute of the default pools, current-pool routing,
RMM's current device resource, CuPy's allocator) back as it found it. The figures the tests
record (cases, cycles, operations, bytes checked) are printed in pytest's terminal summary,
so a GPU run shows them without ``-s``.
"""

import pytest

import reliability_helpers as h


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "soak: long stress run; skipped unless ASYNCMR_SOAK=1 (duration: ASYNCMR_STRESS_SECONDS)")
    config.addinivalue_line("markers", "gpu: needs a CUDA device")
    config.addinivalue_line(
        "markers",
        "cuda_api_error: makes a CUDA call fail on purpose (compute-sanitizer reports those as "
        "API errors; run the sanitizer with --report-api-errors no, or deselect these)")


@pytest.fixture
def gpu():
    """Skips without a CUDA device; restores the process-wide pool state afterwards."""
    count, why = h.gpu_count()
    if count == 0:
        pytest.skip(f"no CUDA device: {why}")
    import rmm

    saved = h.save_process_state()
    previous_mr = rmm.mr.get_current_device_resource()
    previous_allocator = h.cupy_allocator()
    try:
        yield count
    finally:
        h.sync()
        rmm.mr.set_current_device_resource(previous_mr)
        h.set_cupy_allocator(previous_allocator)
        h.restore_process_state(saved)


@pytest.fixture
def cp(gpu):
    """CuPy, for kernels and views of raw pointers (GPU tests need it)."""
    return pytest.importorskip("cupy", reason="the GPU reliability tests launch CuPy kernels")


@pytest.fixture
def kernels(cp):
    """The fill/check/bump kernels, compiled and loaded before any test thread or capture."""
    h.warm_up_kernels()
    return h


@pytest.fixture(scope="session")
def probe_resource():
    """An owned-pool device resource for "the CUDA context still works" checks; owned, so
    using it changes no shared pool."""
    count, _ = h.gpu_count()
    if count == 0:
        return None
    import asyncmr

    return asyncmr.AsyncDeviceMR(pool="new")


@pytest.fixture
def no_gpu():
    count, _ = h.gpu_count()
    if count:
        pytest.skip("a CUDA device is present; the no-GPU errors are checked on it by "
                    "test_no_device_errors_in_a_child_without_visible_devices")


def pytest_terminal_summary(terminalreporter):
    lines = h.figures()
    if lines:
        terminalreporter.section("asyncmr reliability figures")
        for line in lines:
            terminalreporter.write_line(line)

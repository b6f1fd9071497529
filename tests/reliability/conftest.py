# SPDX-License-Identifier: Apache-2.0
"""The reliability suite's own fixtures, on top of tests/conftest.py's ``gpu``, ``two_gpus`` and
``no_gpu``: CuPy and the fill/check kernels, a probe resource, and the figures the tests record
(cases, cycles, operations, bytes checked), printed in pytest's terminal summary so a GPU run
shows them without ``-s``.
"""

import pytest

import reliability_helpers as h


@pytest.fixture
def cp(gpu):
    """CuPy, for kernels and views of raw pointers (GPU tests need it)."""
    return h.require_module("cupy", "the GPU reliability tests launch CuPy kernels")


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


def pytest_terminal_summary(terminalreporter):
    if h.CACHE:
        h.record("front cache", f"every resource behind a front cache of {h.CACHE} bytes "
                 "(ASYNCMR_TEST_CACHE)")
    lines = h.figures()
    if lines:
        terminalreporter.section("asyncmr reliability figures")
        for line in lines:
            terminalreporter.write_line(line)

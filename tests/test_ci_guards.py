# SPDX-License-Identifier: Apache-2.0
"""The CI steps that must not pass silently (issue "correctness", item 9), checked on the CPU:
the switch that turns a GPU test's skip into a failure on a GPU host (conftest.py), the same rule
for the C++ suite's JUnit report (ci/check_skips.py), and ci/gpu.sh stopping when its wheels do
not install."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)

# A test tree with this tree's conftest.py and gpu_helpers.py. Its own ``gpu`` fixture stands in
# for a device that is there, so the hook is what decides: the first test skips as a missing
# library would, the second as a test that does not apply here.
SCRATCH_TESTS = textwrap.dedent("""
    import pytest
    from gpu_helpers import not_applicable

    @pytest.fixture
    def gpu():
        return 1

    def test_a_library_is_missing(gpu):
        pytest.skip("cupy is not installed")

    def test_does_not_apply(gpu):
        not_applicable("only the CUDA 12 build has this path")

    def test_cpu_only():
        pytest.skip("a CPU test may skip anywhere")
""")


def _run_scratch_suite(tmp_path, required):
    for name in ("conftest.py", "gpu_helpers.py"):
        shutil.copy(os.path.join(TESTS, name), tmp_path / name)
    (tmp_path / "test_scratch.py").write_text(SCRATCH_TESTS)
    env = dict(os.environ)
    env.pop("ASYNCMR_REQUIRE_GPUS", None)
    if required:
        env["ASYNCMR_REQUIRE_GPUS"] = str(required)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, check=False, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_on_a_gpu_host_a_gpu_tests_skip_fails(tmp_path):
    rc, out = _run_scratch_suite(tmp_path, required=1)
    assert rc == 1, out
    assert "FAILED test_scratch.py::test_a_library_is_missing" in out, out
    assert "GPU test skipped on a host with ASYNCMR_REQUIRE_GPUS=1: " in out, out
    assert "cupy is not installed" in out, out
    assert "SKIPPED [1] test_scratch.py" in out and "not applicable: only the CUDA 12" in out, out
    assert "1 failed, 2 skipped" in out, out


def test_elsewhere_the_same_skips_stay_skips(tmp_path):
    rc, out = _run_scratch_suite(tmp_path, required=0)
    assert rc == 0, out
    assert "3 skipped" in out, out


def _junit(tmp_path, cases):
    body = "".join(
        f'<testcase name="{name}" classname="{name}" time="0" status="notrun">'
        f'<skipped message="{message}"/><system-out>{message}</system-out></testcase>'
        for name, message in cases)
    path = tmp_path / "junit.xml"
    path.write_text(f'<?xml version="1.0"?><testsuite tests="{len(cases) + 1}">{body}'
                    '<testcase name="Ran" classname="Ran" time="0" status="run"/></testsuite>')
    return str(path)


def _check_skips(report):
    return subprocess.run([sys.executable, os.path.join(REPO, "ci", "check_skips.py"), report],
                          check=False, capture_output=True, text=True, timeout=60)


def test_check_skips_fails_a_cpp_test_that_skipped_for_want_of_something(tmp_path):
    proc = _check_skips(_junit(tmp_path, [
        ("PoolTest.Managed", "[  SKIPPED ] concurrent managed access is not supported"),
        ("CapabilityTest.Cuda12", "[  SKIPPED ] not applicable: a CUDA 13 build")]))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "2 skipped, 1 of them not 'not applicable'" in proc.stdout, proc.stdout
    assert "skipped on a GPU host: PoolTest.Managed" in proc.stdout, proc.stdout
    assert "CapabilityTest.Cuda12" not in proc.stdout, proc.stdout


def test_check_skips_passes_skips_that_do_not_apply(tmp_path):
    proc = _check_skips(_junit(tmp_path, [
        ("CapabilityTest.Cuda12", "[  SKIPPED ] not applicable: a CUDA 13 build")]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 skipped, 0 of them not 'not applicable'" in proc.stdout, proc.stdout


def _scratch_checkout(tmp_path):
    """A tree with ci/gpu.sh and a wheelhouse whose wheels cannot install."""
    tree = tmp_path / "tree"
    (tree / "ci").mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "ci", "gpu.sh"), tree / "ci" / "gpu.sh")
    for group, name in (("core", "rmm_cu13-26.10.0-py3-none-any.whl"),
                        ("build", "rapids_build_backend-0.4.1-py3-none-any.whl")):
        (tree / ".whl" / group).mkdir(parents=True)
        (tree / ".whl" / group / name).write_bytes(b"this is not a zip archive")
    return tree


@pytest.mark.skipif(shutil.which("bash") is None, reason="not applicable: needs bash")
def test_gpu_sh_stops_when_its_wheels_do_not_install(tmp_path):
    tree = _scratch_checkout(tmp_path)
    out = tmp_path / "out"
    env = dict(os.environ, ASYNCMR_GPU_SITES=str(tmp_path / "sites"))
    proc = subprocess.run(["bash", str(tree / "ci" / "gpu.sh"), str(out), "build"],
                          env=env, check=False, capture_output=True, text=True, timeout=300)
    log = (out / "gpu.log").read_text()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    site = tmp_path / "sites" / "site"
    assert f"setup: FAILED: the wheels did not install into {site}" in log, log
    assert "=== build:" not in log, log


@pytest.mark.skipif(shutil.which("bash") is None, reason="not applicable: needs bash")
def test_gpu_sh_refuses_an_unknown_stage(tmp_path):
    proc = subprocess.run(["bash", os.path.join(REPO, "ci", "gpu.sh"), str(tmp_path / "out"),
                           "racecheck"], check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown stage: racecheck" in proc.stderr

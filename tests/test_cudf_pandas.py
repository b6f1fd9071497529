# SPDX-License-Identifier: Apache-2.0
"""``asyncmr.cudf_pandas``: the runner's arguments and errors on any machine; on a GPU host with
cuDF (ci/gpu.sh's cudf stage), a pandas workload run through ``python -m asyncmr cudf-pandas``
gives plain pandas' answers while allocating from an AsyncManagedMR."""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import textwrap

import pytest

from gpu_helpers import describe, not_applicable, require_hidden_devices

import asyncmr
import asyncmr.cudf_pandas as door

HAVE_CUDF = importlib.util.find_spec("cudf") is not None


def test_the_runner_without_a_target_prints_its_usage(capsys):
    assert door.main([]) == 2
    assert "usage: python -m asyncmr cudf-pandas" in capsys.readouterr().err
    assert door.main(["-m"]) == 2
    assert door.main(["--help"]) == 0


@pytest.mark.parametrize("args", [["--cache"], ["--cache", "-1", "s.py"], ["--cache", "1e6", "s.py"],
                                  ["--cache", "64"]])
def test_a_bad_cache_argument_is_refused_before_anything_is_set_up(args, capsys):
    assert door.main(args) == 2
    err = capsys.readouterr().err
    assert "usage: python -m asyncmr cudf-pandas [--cache BYTES]" in err
    if len(args) > 2:
        assert f"--cache takes a number of bytes (0 or more), got {args[1]!r}" in err
    assert door._installed is None  # nothing was installed


@pytest.mark.parametrize("args, wrong", [
    (["--prefetch"], "--prefetch takes device, host or a device ordinal, got ''"),
    (["--prefetch", "gpu", "s.py"], "--prefetch takes device, host or a device ordinal, got 'gpu'"),
    (["--prefetch", "-1", "s.py"], "--prefetch takes device, host or a device ordinal, got '-1'"),
    (["--discard", "s.py"], "--discard needs --prefetch"),
    (["--cache", "64", "--cache", "64", "s.py"], "--cache is given twice"),
    (["--prefetch", "host", "--discard", "--discard", "s.py"], "--discard is given twice"),
    (["--reserve", "8G", "s.py"], "--reserve takes a number of bytes (0 or more), got '8G'"),
    (["--reserve", "1", "--reserve", "2", "s.py"], "--reserve is given twice"),
])
def test_bad_placement_arguments_are_refused_before_anything_is_set_up(args, wrong, capsys):
    assert door.main(args) == 2
    err = capsys.readouterr().err
    assert f"asyncmr cudf-pandas: {wrong}" in err and "[--prefetch device|host|N] [--discard]" in err
    assert door._installed is None


@pytest.mark.parametrize("args, wrong", [
    (["--cache=1048576", "s.py"], "unknown option '--cache=1048576'"),
    (["--prefech", "device", "s.py"], "unknown option '--prefech'"),
    (["--prefetch", "device", "--dicsard", "s.py"], "unknown option '--dicsard'"),
    (["-x", "s.py"], "unknown option '-x'"),
    (["--cache", "64", "-", "s.py"], "unknown option '-'"),
    (["--reserve", "0", "--", "s.py"], "unknown option '--'"),
])
def test_an_unknown_option_before_the_script_is_refused_before_anything_is_set_up(
        args, wrong, capsys):
    assert door.main(args) == 2
    err = capsys.readouterr().err
    assert f"asyncmr cudf-pandas: {wrong}" in err and "usage: python -m asyncmr cudf-pandas" in err
    assert "needs cuDF" not in err  # install() was not called (it says so where cuDF is not)
    assert door._installed is None


@pytest.mark.parametrize("args, wrong", [
    (["--cache", "\u00b2", "s.py"], "--cache takes a number of bytes (0 or more), got '\u00b2'"),
    (["--cache", "\u0663", "s.py"], "--cache takes a number of bytes (0 or more), got '\u0663'"),
    (["--reserve", "\uff18", "s.py"],
     "--reserve takes a number of bytes (0 or more), got '\uff18'"),
    (["--reserve", " 8", "s.py"], "--reserve takes a number of bytes (0 or more), got ' 8'"),
    (["--prefetch", "\u00b9", "s.py"],
     "--prefetch takes device, host or a device ordinal, got '\u00b9'"),
    (["--prefetch", "\u0661", "s.py"],
     "--prefetch takes device, host or a device ordinal, got '\u0661'"),
])
def test_numbers_are_ascii_digits_only(args, wrong, capsys):
    assert door.main(args) == 2
    err = capsys.readouterr().err
    assert f"asyncmr cudf-pandas: {wrong}" in err
    assert "needs cuDF" not in err
    assert door._installed is None


@pytest.mark.parametrize("args, wrong", [
    (["--cache", "9" * 5000, "s.py"], "--cache takes a number of bytes below 2**64, got 5000 digits"),
    (["--reserve", "1" + "0" * 20, "s.py"],
     "--reserve takes a number of bytes below 2**64, got 21 digits"),
    (["--prefetch", "9" * 4301, "s.py"],
     "--prefetch takes device, host or a device ordinal below 2**31, got 4301 digits"),
])
def test_a_number_of_too_many_digits_is_named_as_the_option_it_is(args, wrong, capsys):
    # Python's int() refuses more than 4300 digits, in words about sys.set_int_max_str_digits
    # that name no option: the digits are counted before int() reads them.
    assert door.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"asyncmr cudf-pandas: {wrong}\n"), err
    assert door._installed is None


def test_leading_zeros_do_not_count_as_digits():
    zeros = "0" * 5000
    assert door._options(["--reserve", zeros + "1024", "--cache", zeros, "--prefetch",
                          zeros + "1", "s.py"]) == (
        {"reserve": 1024, "cache": 0, "prefetch": 1}, ["s.py"])


@pytest.mark.parametrize("args", [["--cache", "5", "-h"], ["--prefetch", "host", "--help", "s.py"]])
def test_help_after_the_door_options_prints_the_usage_and_sets_up_nothing(args, capsys):
    assert door.main(args) == 0
    out = capsys.readouterr()
    assert out.out.startswith("usage: python -m asyncmr cudf-pandas")
    assert "needs cuDF" not in out.err
    assert door._installed is None


def test_the_door_options_become_install_keywords():
    assert door._options(["--prefetch", "device", "--discard", "--cache", "0", "s.py", "--x"]) == (
        {"prefetch": "device", "discard": True, "cache": 0}, ["s.py", "--x"])
    assert door._options(["--prefetch", "1", "-m", "mod"]) == ({"prefetch": 1}, ["-m", "mod"])
    assert door._options(["--reserve", "8589934592", "s.py"]) == ({"reserve": 8 << 30}, ["s.py"])
    # What follows the script is the script's, even when it looks like the door's own options.
    assert door._options(["s.py", "--discard"]) == ({}, ["s.py", "--discard"])
    assert door._options(["--cache", "1", "-m", "mod", "--x", "-h"]) == (
        {"cache": 1}, ["-m", "mod", "--x", "-h"])


@pytest.mark.parametrize("kwargs, match", [
    ({"libcudf_prefetch": "no"}, "libcudf_prefetch must be a bool, got str"),
    ({"libcudf_prefetch": 0}, "libcudf_prefetch must be a bool, got int"),
    ({"cache": "x"}, "cache"),
    ({"discard": 1}, "discard must be a bool"),
    ({"prefetch": True}, r"prefetch must be None, .*, got True \(bool\)"),
])
def test_install_checks_its_arguments_before_it_looks_for_cudf(kwargs, match):
    # "no" turned libcudf's prefetching on; every argument is checked before cuDF is imported,
    # so a wrong one is named whether cuDF is there or not.
    with pytest.raises(TypeError, match=match):
        door.install(**kwargs)


def test_install_checks_the_prefetch_value_before_it_looks_for_cudf():
    with pytest.raises(ValueError, match=r"prefetch must be None, .*, got 'gpu'"):
        door.install(prefetch="gpu")
    assert door._installed is None


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"discard": True}, ValueError, "discard needs a prefetch target"),
    ({"pool": 3.5}, TypeError, "pool must be 'default', 'current', 'new', .*got float"),
    ({"pool": None}, TypeError, "pool must be .*got NoneType"),
    ({"pool": "shared"}, ValueError, "pool must be 'default', .*got 'shared'"),
    ({"cache": 5}, ValueError, r"cache must be 0 \(no cache\) or a cap in \[256 B, 1 PiB\]"),
    ({"reserve": 10, "release_threshold": 5}, ValueError,
     r"reserve \(10 bytes\) is above the pool's release threshold \(5 bytes\)"),
    ({"prefetch": -1}, ValueError, r"prefetch must be in \[0, 2\*\*31\), got -1$"),
    ({"prefetch": asyncmr.Location.none()}, ValueError,
     "prefetch must be a device or the host, got none$"),
])
def test_install_refuses_what_the_resource_refuses_before_it_looks_for_cudf(kwargs, exc, match):
    # AsyncManagedMR refuses each of these before any CUDA call; install() must say so wherever
    # it runs, not "needs cuDF" where cuDF is missing (installing it would not help).
    with pytest.raises(exc, match=match):
        door.install(**kwargs)
    assert door._installed is None


@pytest.mark.skipif(HAVE_CUDF, reason="not applicable: cuDF is installed here")
def test_without_cudf_install_says_what_to_install():
    with pytest.raises(ImportError, match="needs cuDF .*cudf-cu13"):
        door.install()


def test_without_cudf_the_runner_says_what_to_install(gpu, capsys, tmp_path):
    # On a GPU host: without one the runner says that first (the next test). The script is
    # there: a missing one is named before cuDF is looked for
    # (test_a_missing_script_is_named_before_anything_is_set_up).
    if HAVE_CUDF:
        not_applicable("cuDF is installed here")
    script = tmp_path / "script.py"
    script.write_text("raise SystemExit('the script ran without cuDF')\n")
    assert door.main([str(script)]) == 4  # a missing package: _cli.EXIT_MISSING
    err = capsys.readouterr().err
    assert "needs cuDF" in err and "the script ran" not in err


def _run_door(*args, env=None):
    return subprocess.run([sys.executable, "-m", "asyncmr", "cudf-pandas", *args],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, **(env or {})})


def _run_door_without_a_gpu(tmp_path, *options):
    """The runner with ``options`` on a script that prints, every device hidden from it
    (CUDA_VISIBLE_DEVICES=""), which compute-sanitizer undoes: not applicable under it."""
    require_hidden_devices()
    script = tmp_path / "script.py"
    script.write_text("print('the script ran')\n")
    return _run_door(*options, str(script), env={"CUDA_VISIBLE_DEVICES": ""})


def _one_line_error(proc, code, says):
    """The runner failed with exit ``code`` and one line on stderr that ``says`` the problem:
    no traceback, and the script never ran (it prints)."""
    assert proc.returncode == code, describe(proc)
    assert proc.stdout == "", describe(proc)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"asyncmr cudf-pandas: {says}"), describe(proc)


@pytest.mark.parametrize("options", [[], ["--prefetch", "device", "--reserve", "1048576"]])
def test_without_a_usable_gpu_the_runner_says_so_in_one_line(tmp_path, options):
    # Runs on GPU hosts too: CUDA_VISIBLE_DEVICES="" hides every device from the child. The
    # device is looked for before cuDF (installing cuDF would not help), and its lack has an
    # exit status of its own (asyncmr._cli.EXIT_STATUSES: 2 a wrong option, 4 a missing
    # library, 1 a failure).
    proc = _run_door_without_a_gpu(tmp_path, *options)
    _one_line_error(proc, 3, "no usable CUDA device: no CUDA ")


@pytest.mark.parametrize("options, says", [
    (["--cache", "5"], r"cache must be 0 \(no cache\) or a cap in \[256 B, 1 PiB\], got 5"),
    (["--reserve", "99999999999999999999"], r"reserve must be in \[0, 2\*\*64\)"),
    (["--prefetch", "3000000000"], r"prefetch must be in \[0, 2\*\*31\), got 3000000000"),
])
def test_options_the_resource_refuses_are_named_before_the_device_is_looked_for(
        tmp_path, options, says):
    # A wrong option is the user's to fix on any machine: it is named, exit 2, before the runner
    # asks the driver for a device (with none here, CUDA_VISIBLE_DEVICES="" hiding them all).
    proc = _run_door_without_a_gpu(tmp_path, *options)
    assert proc.returncode == 2 and proc.stdout == "", describe(proc)
    assert re.fullmatch(rf"asyncmr cudf-pandas: (asyncmr: )?{says}[^\n]*\n", proc.stderr), \
        describe(proc)


def test_a_missing_script_is_named_before_anything_is_set_up(tmp_path):
    # As `python missing.py` says (exit 2), and before the device and cuDF are looked for: where
    # both are there, runpy.run_path met the missing file only after cuDF was installed, and
    # the runner ended in its FileNotFoundError's traceback.
    require_hidden_devices()
    missing = tmp_path / "missing.py"
    proc = _run_door("--cache", "0", str(missing), "--x", env={"CUDA_VISIBLE_DEVICES": ""})
    _one_line_error(proc, 2, f"cannot open file {str(missing)!r}: No such file or directory")


WORKLOAD = r'''
import json
import sys
import numpy as np
import pandas as pd
import rmm

n = 1_000_000
rng = np.random.default_rng(7)
df = pd.DataFrame({"k": rng.integers(0, 1000, n), "v": rng.random(n),
                   "s": rng.choice(["alpha", "beta", "gamma"], n)})
g = df.groupby("k")["v"].agg(["sum", "mean"]).sort_index()
m = df.merge(g, left_on="k", right_index=True).sort_values(["k", "v"]).head(1000)
lens = df["s"].str.upper().str.len().sum()
df.head(100_000).to_parquet(sys.argv[1])
back = pd.read_parquet(sys.argv[1])
mr = rmm.mr.get_current_device_resource()
print(type(mr).__name__, int(mr.attributes.used_mem_high) > 0, mr.prefetch, mr.discard)
print(json.dumps([float(g["sum"].sum()), float(m["v"].sum()), int(lens), len(back)]))
'''


@pytest.mark.parametrize("options, shown", [
    ([], "None False"),
    (["--prefetch", "device", "--discard"], "Location.device(0) True"),
], ids=["plain", "prefetch-discard"])
def test_a_pandas_workload_runs_on_an_asyncmr_pool(gpu, tmp_path, options, shown):
    if not HAVE_CUDF and os.environ.get("ASYNCMR_REQUIRE_CUDF") != "1":
        not_applicable("cuDF is not installed (ci/gpu.sh's cudf stage installs it)")
    if "--discard" in options and not asyncmr.can_discard():
        not_applicable("discard needs the CUDA 13 build (the cudf stage runs that one)")
    script = tmp_path / "workload.py"
    script.write_text(textwrap.dedent(WORKLOAD))
    env = dict(os.environ)
    through_door = subprocess.run(
        [sys.executable, "-m", "asyncmr", "cudf-pandas", *options, str(script),
         str(tmp_path / "a.pq")], capture_output=True, text=True, timeout=600, env=env)
    assert through_door.returncode == 0, describe(through_door)
    plain = subprocess.run([sys.executable, "-c", WORKLOAD.replace(
        "mr = rmm.mr.get_current_device_resource()\nprint(type(mr).__name__, "
        "int(mr.attributes.used_mem_high) > 0, mr.prefetch, mr.discard)\n",
        "print('plain', True)\n"), str(tmp_path / "b.pq")],
        capture_output=True, text=True, timeout=600, env=env)
    assert plain.returncode == 0, describe(plain)
    first, answers = through_door.stdout.strip().splitlines()[-2:]
    assert first == f"AsyncManagedMR True {shown}", through_door.stdout
    got, want = json.loads(answers), json.loads(plain.stdout.strip().splitlines()[-1])
    # Sums of a million floats: the GPU adds in another order.
    assert got[2:] == want[2:] and all(math.isclose(a, b, rel_tol=1e-9)
                                       for a, b in zip(got[:2], want[:2])), (got, want)

# SPDX-License-Identifier: Apache-2.0
"""The benchmark (``benchmarks/``, not part of the package): its refusal of unoptimized
floors, the target policy (recomputed from raw numbers, missing cells never dropped), its exit
status, its entry point, and the in-process floor library on a GPU."""

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
COMMITTED = sorted(RESULTS.rglob("results.json"))
sys.path.insert(0, str(BENCHMARKS))

from asyncmr_bench import floor, harness, targets  # noqa: E402
from asyncmr_bench.__main__ import execute, make_config, parser  # noqa: E402
from asyncmr_bench.common import APR, SECTION_KEYS, floor_of  # noqa: E402
from asyncmr_bench.sections import Section  # noqa: E402

MiB = 1 << 20
# Two runs of sections 1-6 kept as fixtures of the target policy (git has their history).
FULL_RUN = ROOT / "tests" / "data" / "bench-sections-1-6-full.json"  # 13 of 17 targets met
QUICK_RUN = ROOT / "tests" / "data" / "bench-sections-1-6-quick.json"  # 16 of 17


def config(*args):
    p = parser()
    return make_config(p, p.parse_args(list(args)))


def load(path=FULL_RUN) -> dict:
    return json.loads(path.read_text())


def by_name(ts, fragment):
    hits = [t for t in ts if fragment in t["name"]]
    assert len(hits) == 1, [t["name"] for t in ts]
    return hits[0]


def run_module(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "asyncmr", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def _program(path: Path, script: str = "") -> Path:
    """An executable shell script at `path` standing in for a C++ benchmark program (what the
    finders and runners are given; the real programs need a GPU)."""
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


# ---- the floor refuses unoptimized builds ----------------------------------------------------


@pytest.mark.parametrize("optimized", [False, True])
def test_floor_program_built_without_optimization_is_refused(tmp_path, optimized):
    """The floor program says how it was compiled; an -O0 floor must not be compared against."""
    doc = '{"meta":{"optimized":%s},"floor":{},"via_ref":{}}' % str(optimized).lower()
    program = _program(tmp_path / "pool_floor", f"echo '{doc}'\n")
    result = floor.run_floor(config("--floor-bin", str(program)))
    if optimized:
        assert "error" not in result and result["meta"]["optimized"] is True
    else:
        assert "built without optimization" in result["error"]
        assert "CMAKE_BUILD_TYPE=Release" in result["error"]


@pytest.mark.parametrize("optimized", [0, 1])
def test_floor_library_built_without_optimization_is_refused(tmp_path, optimized):
    """The in-process floor library answers asyncmr_floor_optimized(); 0 is refused before
    any timing. (A stand-in library with the same C interface: no CUDA call is made.)"""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc/gcc) to build the stand-in library")
    src = tmp_path / "stand_in.c"
    src.write_text(f"int asyncmr_floor_optimized(void) {{ return {optimized}; }}\n"
                   "int asyncmr_floor_pairs(void) { return 1; }\n"
                   "const char* asyncmr_floor_error_name(int e) { (void)e; return \"x\"; }\n")
    lib = tmp_path / "libasyncmr_floor.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    loaded, why_not = floor.load_floor_library(config("--floor-lib", str(lib)))
    if optimized:
        assert why_not is None and loaded.optimized
    else:
        assert loaded is None
        assert "built without optimization" in why_not["error"]


def test_floor_library_missing_says_how_to_build_it(tmp_path):
    loaded, why_not = floor.load_floor_library(
        config("--floor-lib", str(tmp_path / "libasyncmr_floor.so")))
    assert loaded is None
    assert "ASYNCMR_BUILD_BENCHMARKS=ON" in why_not["skipped"]


def test_floor_library_is_found_next_to_the_floor_program(tmp_path):
    """ci/gpu.sh passes --floor-bin only: the library beside it must be found."""
    program = _program(tmp_path / "pool_floor")
    (tmp_path / "libasyncmr_floor.so").write_bytes(b"")
    path, _ = floor.find_floor_lib(config("--floor-bin", str(program)))
    assert path == tmp_path / "libasyncmr_floor.so"


# ---- targets: recomputed from the raw numbers --------------------------------------------------


@pytest.mark.parametrize("path", COMMITTED + [FULL_RUN, QUICK_RUN], ids=lambda p: p.name
                         if p.parent.name == "data" else str(p.relative_to(RESULTS)))
def test_recomputed_targets_agree_with_the_committed_runs(path):
    """On the committed results, recomputing every target from the raw numbers gives the flags
    those runs stored (each was computed at run time by the code before the move)."""
    doc = load(path)
    stored = {t["name"]: t for t in doc["targets"]}
    recomputed = {t["name"]: t for t in targets.compute_targets(doc)}
    assert stored, "a committed results.json without targets"
    ran = 0
    for name, entry in stored.items():
        if name in targets.RETIRED and name not in recomputed:
            continue  # replaced (targets.RETIRED says by what); the file predates it
        assert recomputed[name]["met"] == entry["met"], name
        # A run of some sections stores the others' targets as not run; they stay so.
        if entry.get("status") == targets.NOT_RUN:
            assert recomputed[name]["status"] == targets.NOT_RUN, name
        else:
            assert recomputed[name]["status"] != targets.NOT_RUN, name
            ran += 1
    assert ran, "a committed results.json whose targets were all not run"


def test_stored_flags_and_ratios_are_not_read():
    doc = load()
    tampered = copy.deepcopy(doc)
    for t in tampered["targets"]:
        t["met"], t["value"] = True, 1.0
    for sec in tampered["sections"].values():
        sec["ratios"] = {}
    assert ([t["met"] for t in targets.compute_targets(tampered)] ==
            [t["met"] for t in targets.compute_targets(doc)])


def test_a_raw_number_changes_the_verdict():
    doc = load()
    name = "AsyncPinnedMR alloc+free from Python <= 1.3x the raw pinned floor"
    assert by_name(targets.compute_targets(doc), name)["met"]
    entry = doc["sections"][SECTION_KEYS[1]]["results"][APR]["4096"]
    entry["median_us"] *= 10
    t = by_name(targets.compute_targets(doc), name)
    assert not t["met"] and t["value"] > 10 and t["cells"]["4 KiB"] == t["value"]


# ---- targets: a missing cell is a miss, never dropped -----------------------------------------


def test_a_missing_size_fails_the_target_and_is_named():
    doc = load()
    del doc["sections"][SECTION_KEYS[1]]["results"][floor_of(APR)]["4096"]
    t = by_name(targets.compute_targets(doc), "raw pinned floor")
    assert t["status"] == targets.NOT_MET and not t["met"]
    assert t["missing"] == ["4 KiB"]
    assert t["value"] is not None  # the worst of the cells that are there, still reported
    assert "4 KiB" in t["note"]


def test_a_missing_pool_of_the_cpp_program_fails_its_target():
    doc = load()
    del doc["sections"][SECTION_KEYS[1]]["cpp"]["via_ref_over_floor"]["pinned_owned_host"]
    t = by_name(targets.compute_targets(doc), "device_async_resource_ref <= 1.05x")
    assert not t["met"]
    assert sorted(t["missing"]) == sorted(
        f"pinned_owned_host@{s}" for s in ("256 B", "4 KiB", "1 MiB", "64 MiB"))


def test_a_missing_kind_of_the_random_workload_fails_both_its_targets():
    doc = load(QUICK_RUN)
    del doc["sections"][SECTION_KEYS[4]]["results"]["pinned"]
    ts = [t for t in targets.compute_targets(doc) if "[pinned]" in t["name"]]
    assert len(ts) == 2 and not any(t["met"] for t in ts)


def test_skipped_failed_and_unfinished_sections_fail_their_targets():
    doc = load()
    doc["params"]["sections"] = list(range(1, 11))
    doc["sections"][SECTION_KEYS[7]] = {"skipped": "this asyncmr has no release_gil"}
    doc["sections"][SECTION_KEYS[9]] = {"error": "RuntimeError: boom", "traceback": "..."}
    del doc["sections"][SECTION_KEYS[5]]
    ts = targets.compute_targets(doc)
    gil = [t for t in ts if t["section"] == 7]
    assert len(gil) == 3
    assert all(t["status"] == targets.NOT_MET for t in gil)
    assert all("skipped: this asyncmr has no release_gil" in t["note"] for t in gil)
    assert "failed: RuntimeError: boom" in by_name(ts, "pinned_empty")["note"]
    assert "did not finish" in by_name(ts, "H2D bandwidth")["note"]
    assert targets.tally(ts) == (11, 21, 14)  # 11, 12, 13 (7 + 4 + 3) were not asked for


def test_targets_of_sections_not_asked_for_are_not_counted():
    doc = load()
    ts = targets.compute_targets(doc)  # a run of sections 1-6
    not_run = [t for t in ts if t["status"] == targets.NOT_RUN]
    assert {t["section"] for t in not_run} == {7, 9, 11, 12, 13}
    assert targets.tally(ts) == (13, 17, 18)


# ---- check_targets.py ----------------------------------------------------------------------


def check_targets(*args):
    return subprocess.run([sys.executable, str(BENCHMARKS / "check_targets.py"), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_check_targets_reads_every_committed_run():
    out = check_targets()
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("targets met: ") == len(COMMITTED) >= 2
    out = check_targets(str(FULL_RUN))
    assert out.returncode == 0 and "targets met: 13 of 17" in out.stdout, out.stdout


def test_check_targets_strict_fails_on_a_miss_and_passes_when_all_are_met(tmp_path):
    assert check_targets("--strict", str(FULL_RUN)).returncode == 1
    doc = load(QUICK_RUN)  # 16 of 17: staging is the miss
    staging = doc["sections"][SECTION_KEYS[5]]["staging"]
    staging["rmm PinnedHostMemoryResource"]["median_s"] *= 10
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    out = check_targets("--strict", str(path))
    assert out.returncode == 0, out.stdout
    assert "targets met: 17 of 17" in out.stdout


def test_check_targets_names_a_missing_cell(tmp_path):
    doc = load()
    del doc["sections"][SECTION_KEYS[1]]["results"][floor_of(APR)]["4096"]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    out = check_targets("--strict", str(path))
    assert out.returncode == 1
    line = next(x for x in out.stdout.splitlines() if "raw pinned floor" in x)
    assert line.startswith("FAIL") and "missing 4 KiB" in line
    assert "stored flag said met" in out.stdout


def test_check_targets_unreadable_file(tmp_path):
    out = check_targets(str(tmp_path / "absent.json"))
    assert out.returncode == 2 and "cannot read" in out.stdout


# ---- the run's exit status -------------------------------------------------------------------


def _section(num, fn):
    return Section(SECTION_KEYS[num], f"section {num}", fn, lambda res: None)


def _boom(cfg, ctx):
    raise RuntimeError("boom")


def _skip(cfg, ctx):
    raise harness.Skip("pylibcudf is not installed")


def test_a_section_that_raises_makes_the_run_fail_and_keeps_the_others(tmp_path):
    cfg = config("--sections", "1,2,10", "--out", str(tmp_path))
    registry = {1: _section(1, lambda cfg, ctx: {"sizes": [], "results": {}}),
                2: _section(2, _boom), 10: _section(10, _skip)}
    doc, status = execute(cfg, None, registry, meta={})
    assert status == 1  # a failure: asyncmr._cli.EXIT_FAILURE
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["failed_sections"] == [2]
    assert "RuntimeError: boom" in written["sections"][SECTION_KEYS[2]]["error"]
    assert "Traceback" in written["sections"][SECTION_KEYS[2]]["traceback"]
    assert written["sections"][SECTION_KEYS[10]]["skipped"] == "pylibcudf is not installed"
    assert "results" in written["sections"][SECTION_KEYS[1]]


def test_a_skipped_section_is_not_a_failure(tmp_path):
    cfg = config("--sections", "10", "--out", str(tmp_path))
    _, status = execute(cfg, None, {10: _section(10, _skip)}, meta={})
    assert status == 0


def _paced_run(cold_ns: float, warm_ns_per_pair: float):
    """A run(n) that reports a cold first call, then warm pairs (the harness times whatever it
    is given: this stands for a pool that grows on its first allocation)."""
    calls = []

    def run(n):
        calls.append(n)
        return cold_ns if len(calls) == 1 else n * warm_ns_per_pair

    return run, calls


@pytest.mark.parametrize("cold_ms", [0.002, 15.0, 200.0])
def test_calibration_counts_warm_pairs_only(cold_ms):
    # 1 us a warm pair and 4 ms rounds: ~4000 pairs, however long the first pair took (a
    # first pair longer than the whole warm-up must not set the count).
    run, calls = _paced_run(cold_ms * 1e6, 1000.0)
    n = harness.calibrate(run, lambda: None, warmup_ms=10.0, round_ms=4.0)
    assert 3500 <= n <= 4500, n
    assert calls[0] == 1 and len(calls) > 1


def test_calibration_of_a_slow_contender_stays_at_the_minimum():
    run, _ = _paced_run(50e6, 40e6)  # 40 ms a pair, 4 ms rounds
    assert harness.calibrate(run, lambda: None, warmup_ms=10.0, round_ms=4.0) == 3


# ---- the entry point ---------------------------------------------------------------------------


def test_bench_help_from_the_checkout():
    out = run_module("bench", "--help", cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "--floor-bin" in out.stdout and "--floor-lib" in out.stdout


def test_bench_outside_a_checkout_says_how_to_run_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ASYNCMR_BENCHMARKS"}
    out = run_module("bench", "--quick", cwd=tmp_path, env=env)
    assert out.returncode == 4  # a missing package: asyncmr._cli.EXIT_MISSING
    assert "not part of the installed asyncmr package" in out.stderr
    assert "python -m asyncmr bench" in out.stderr and "ASYNCMR_BENCHMARKS" in out.stderr
    env["ASYNCMR_BENCHMARKS"] = str(BENCHMARKS)
    assert run_module("bench", "--help", cwd=tmp_path, env=env).returncode == 0


def test_the_package_carries_no_benchmark(tmp_path):
    import asyncmr

    package = Path(asyncmr.__file__).parent
    assert not list(package.glob("*bench*")), "benchmark code in the asyncmr package"


def test_bench_without_a_gpu_fails_cleanly(no_gpu, tmp_path):
    out = run_module("bench", "--quick", "--out", str(tmp_path / "out"), cwd=ROOT)
    assert out.returncode == 3  # no usable GPU: asyncmr._cli.EXIT_NO_GPU
    assert "no usable CUDA GPU, nothing measured" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()


# ---- on a GPU: the in-process floor library ------------------------------------------------------


def floor_library():
    """The built libasyncmr_floor.so, or a skip that says how to build it."""
    path, looked = floor.find_floor_lib(config())
    if path is None:
        pytest.skip("the benchmark's floor library is not built (looked at: " +
                    ", ".join(str(p) for p in looked) + "); " + floor.BUILD_HINT)
    return floor.FloorLibrary(path)


@pytest.mark.parametrize("kind", ["device", "pinned", "managed"])
def test_in_process_floor_allocates_from_the_pool_it_is_given(gpu, kind):
    """The ctypes floor runs the two driver calls on asyncmr's pool and an RMM stream (handles
    from other runtimes): the pool grew, nothing stays allocated, the library is optimized."""
    import asyncmr
    import rmm

    lib = floor_library()
    assert lib.optimized
    mr = {"device": asyncmr.AsyncDeviceMR, "pinned": asyncmr.AsyncPinnedMR,
          "managed": asyncmr.AsyncManagedMR}[kind](pool="new")
    stream = rmm.pylibrmm.stream.Stream()
    handle = int(stream.__cuda_stream__()[1])
    assert lib.pairs(mr.pool_handle, handle, MiB, 100) > 0
    stream.synchronize()
    assert mr.attributes.used_mem_current == 0
    assert mr.attributes.reserved_mem_high >= MiB


def test_in_process_floor_reports_a_failed_call_and_the_pool_keeps_working(gpu):
    import asyncmr
    import rmm

    lib = floor_library()
    mr = asyncmr.AsyncDeviceMR(pool="new")
    stream = rmm.pylibrmm.stream.Stream()
    handle = int(stream.__cuda_stream__()[1])
    failed = "cudaMallocFromPoolAsync failed: cudaErrorMemoryAllocation"
    with pytest.raises(RuntimeError, match=failed):
        lib.pairs(mr.pool_handle, handle, 1 << 60, 1)
    with pytest.raises(ValueError, match="positive"):
        lib.pairs(mr.pool_handle, handle, MiB, 0)
    assert lib.pairs(mr.pool_handle, handle, MiB, 10) > 0
    stream.synchronize()
    assert mr.attributes.used_mem_current == 0


# ---- the new sections' targets, from results shaped as the sections write them ---------------


def _summary(values, unit):
    from asyncmr_bench.common import summarize

    return summarize(values, unit)


def _gil_and_arrays_doc(stall_ms, auto_rate, rmm_rate, auto_us, never_us, h2d, d2h):
    from asyncmr_bench.common import (
        ADR, APR_NEW, ASYNCMR_ARRAY, CUPY_ARRAY, RMM_ASYNC, RMM_PINNED, with_release_gil)

    auto, never = with_release_gil(APR_NEW, "auto"), with_release_gil(APR_NEW, "never")
    runs = [{"alloc_ms": 850.0, "longest_gap_ms": g, "idle_longest_gap_ms": 0.6, "ticks": 9}
            for g in stall_ms]
    stall = {name: {"longest_gap": _summary([r["longest_gap_ms"] for r in runs], "ms"),
                    "alloc": _summary([850.0], "ms"), "idle_longest_gap_ms": 0.6, "runs": runs}
             for name in (auto, never)}
    stall[RMM_PINNED] = {"error": "RuntimeError: not measured here", "runs": []}
    threads = {with_release_gil(ADR, "auto"): {"1": _summary([auto_rate / 8], "pairs_per_s"),
                                                 "8": _summary([auto_rate], "pairs_per_s")},
               RMM_ASYNC: {"1": _summary([rmm_rate], "pairs_per_s"),
                           "8": _summary([rmm_rate], "pairs_per_s")}}
    pair = {kind: {"resource": kind, "pairs_per_round": 100,
                   "auto": _summary(auto_us, "us"), "never": _summary(never_us, "us"),
                   "rounds_us": {"auto": auto_us, "never": never_us}}
            for kind in ("device", "pinned", "managed")}
    arrays = {ASYNCMR_ARRAY: {"H2D": _summary([h2d], "GBps"), "D2H": _summary([d2h], "GBps")},
              CUPY_ARRAY: {"H2D": _summary([50.0], "GBps"), "D2H": _summary([50.0], "GBps")}}
    return {"params": {"sections": [7, 9]}, "sections": {
        SECTION_KEYS[7]: {"stall": {"bytes": 2 << 30, "results": stall},
                          "threads": {"thread_counts": [1, 8], "size": 4096, "results": threads},
                          "pair_cost": {"size": 4096, "results": pair}},
        SECTION_KEYS[9]: {"bytes": 256 * MiB, "results": arrays, "data_checked": {}}}}


def test_gil_and_pinned_array_targets_from_raw_numbers(capsys):
    from asyncmr_bench.sections import REGISTRY

    doc = _gil_and_arrays_doc(stall_ms=[1.0, 2.0, 30.0], auto_rate=5e6, rmm_rate=0.5e6,
                              auto_us=[1.0, 1.2, 1.0], never_us=[1.0, 1.0, 1.0],
                              h2d=49.0, d2h=40.0)
    ts = [t for t in targets.compute_targets(doc) if t["status"] != targets.NOT_RUN]
    stall, threads, pair, arrays = ts
    assert stall["value"] == 2.0 and stall["met"]  # the median growth, not the worst one
    assert threads["value"] == pytest.approx(10.0) and threads["met"]
    # The median of per-round ratios (1.0, 1.2, 1.0), not the ratio of medians.
    assert pair["cells"] == {"device": 1.0, "pinned": 1.0, "managed": 1.0} and pair["met"]
    assert arrays["cells"] == {"H2D": pytest.approx(0.98), "D2H": pytest.approx(0.8)}
    assert arrays["value"] == pytest.approx(0.8) and not arrays["met"]
    for num in (7, 9):  # the section's own tables print what it wrote
        REGISTRY[num].show(doc["sections"][SECTION_KEYS[num]])
    printed = capsys.readouterr().out
    assert "longest ticker gap" in printed and "H2D" in printed


def test_gil_targets_miss_when_a_pool_kind_is_missing():
    doc = _gil_and_arrays_doc(stall_ms=[1.0], auto_rate=5e6, rmm_rate=0.5e6, auto_us=[1.0],
                              never_us=[1.0], h2d=50.0, d2h=50.0)
    del doc["sections"][SECTION_KEYS[7]]["pair_cost"]["results"]["managed"]
    pair = by_name(targets.compute_targets(doc), "auto' / 'never'")
    assert not pair["met"] and pair["missing"] == ["managed"]


# ---- section 11, the front cache: targets, the C++ program, its absence ------------------------


def _front_cache_doc(cached_us, cupy_us, hit_ns, one_rate, many_rate, cpp=None,
                     device_us=None, torch_us=None, py_one=None, py_many=None,
                     recording_ns=(50.0, 40.0, 25.0)):
    """A results.json holding section 11 only, shaped as the section and cache_bench write it.
    recording_ns: what recording adds to an uncached pair, a cached pair, and a cached hit timed
    apart from its put (the put gets the rest of the cached pair's)."""
    from asyncmr_bench.common import (
        ADR_CACHED, APR_CACHED, APR_NEW, CUPY_PINNED, TORCH_CACHING,
    )

    def python_entry(rounds):
        return {**_summary(rounds, "us"), "pairs_per_round": 100, "rounds_us": list(rounds)}

    sizes = [4096, 65536]
    device_us = device_us or [0.3] * len(cached_us)
    torch_us = torch_us or [2.0] * len(cached_us)
    results = {APR_CACHED: {str(s): python_entry(cached_us) for s in sizes},
               APR_NEW: {str(s): python_entry([1.5] * len(cached_us)) for s in sizes},
               CUPY_PINNED: {str(s): python_entry(cupy_us) for s in sizes},
               ADR_CACHED: {str(s): python_entry(device_us) for s in sizes},
               TORCH_CACHING: {str(s): python_entry(torch_us) for s in sizes}}
    py_one = py_one or [1e6] * len(cached_us)
    py_many = py_many or [3.5e6] * len(cached_us)
    py_threads = {"threads": 8, "bytes": 4096, "pairs_per_thread": 100,
                  "rounds_pairs_per_s": {"1": py_one, "8": py_many},
                  "scaling_per_round": [99.0]}  # stored: never read by the targets

    def ns(rounds):
        return _summary(rounds, "ns")

    if cpp is None:
        pinned = {str(s): {"floor": ns([1000.0]), "uncached": ns([1100.0]), "cached": ns(hit_ns),
                           "cached_over_floor": {"median": 0.1, "p10": 0.1, "p90": 0.1},
                           "rounds_ns": {"floor": [1000.0] * len(hit_ns),
                                         "uncached": [1100.0] * len(hit_ns), "cached": hit_ns,
                                         "uncached_recording": [1100.0 + recording_ns[0]]
                                         * len(hit_ns),
                                         "cached_recording": [h + recording_ns[1]
                                                              for h in hit_ns],
                                         "uncached_stamped_written": [1130.0] * len(hit_ns),
                                         "hits": [30.0] * len(hit_ns),
                                         "hits_recording": [30.0 + recording_ns[2]]
                                         * len(hit_ns),
                                         "puts": [90.0] * len(hit_ns),
                                         "puts_recording": [90.0 + recording_ns[1]
                                                            - recording_ns[2]] * len(hit_ns)}}
                  for s in sizes}
        cpp = {
            "meta": {"gpu": "NVIDIA H200", "optimized": True, "hardware_concurrency": 16,
                     "clocksource": "tsc", "history_stamp": "tsc"},
            "params": {"rounds": len(hit_ns), "pairs": 100, "sizes": sizes},
            "pairs": {"pinned": pinned},
            "cache": {"pinned": {"cap": 64 * MiB, "hits": 1000, "misses": 2}},
            "calls": {"cuStreamIsCapturing": ns([20.0]), "cuStreamGetId": ns([15.0]),
                      "cuEventRecord": ns([10.0]), "front_cache take+put": ns([30.0]),
                      "history clock read": ns([17.0]), "history ring record": ns([13.0]),
                      "steady_clock read (the other stamp)": ns([27.0])},
            "calls_per_hit_pair": {"cuStreamIsCapturing": 2, "cuStreamGetId": 2,
                                   "cuEventRecord": 1, "front_cache take+put": 1},
            "calls_per_recorded_pair": {"history clock read": 2, "history ring record": 2},
            "recording_candidates": ["steady_clock read (the other stamp)"],
            "threads": {"kind": "pinned", "bytes": 4096, "threads": 8, "results": {"cached": {
                "per_thread": 1000,
                "1": _summary(one_rate, "pairs_per_s"), "8": _summary(many_rate, "pairs_per_s"),
                "scaling": {"median": 99.0},  # stored: never read by the targets
                "rounds_pairs_per_s": {"1": one_rate, "8": many_rate}}},
                "calls": {"cuStreamGetId": {
                    "per_thread": 1000, "1": _summary([20e6], "calls_per_s"),
                    "8": _summary([100e6], "calls_per_s"), "scaling": {"median": 5.0},
                    "rounds_calls_per_s": {"1": [20e6], "8": [100e6]}}},
                "control_scaling": 7.5},
            "errors": {},
        }
    return {"params": {"sections": [11]}, "sections": {SECTION_KEYS[11]: {
        "sizes": sizes, "cache_bytes": 64 * MiB, "rounds": len(cached_us),
        "python": {"results": results, "threads": py_threads, "cache_info": {
            "after_run": {"cap": 64 * MiB, "bytes": 69632, "blocks": 2, "hits": 500, "misses": 2,
                          "charged_high": 2 * MiB},
            "hits_positive": True, "bytes_within_cap": True,
            "after_release_cache": {"bytes": 0, "pool_used_mem_current": 0}}},
        "cpp": cpp}}}


def _front_cache_targets(doc):
    """(pinned vs CuPy, device vs PyTorch, C++ hit, C++ threads, Python threads, recording's
    cost to an uncached pair, to a cached hit)."""
    ts = [t for t in targets.compute_targets(doc) if t["section"] == 11]
    assert len(ts) == 7 and all(t["status"] != targets.NOT_RUN for t in ts)
    return ts


def test_front_cache_targets_met_from_raw_rounds(capsys):
    from asyncmr_bench.sections import REGISTRY

    # Per-round ratios 0.5/0.6, 0.9/0.6, 0.5/0.4: 0.833, 1.5, 1.25 -> median 1.25 (a miss),
    # though the ratio of the medians, 0.5/0.6, would pass: the rounds decide.
    doc = _front_cache_doc(cached_us=[0.5, 0.9, 0.5], cupy_us=[0.6, 0.6, 0.4],
                           hit_ns=[100.0, 120.0, 400.0], one_rate=[10e6, 10e6, 10e6],
                           many_rate=[50e6, 30e6, 45e6])
    python, device, hit, threads, py_threads, rec_uncached, rec_cached = _front_cache_targets(doc)
    assert rec_uncached["value"] == pytest.approx(50.0) and rec_uncached["met"]
    assert rec_cached["value"] == pytest.approx(25.0) and rec_cached["met"]  # the hit's
    assert python["cells"] == {"4 KiB": pytest.approx(1.25), "64 KiB": pytest.approx(1.25)}
    assert not python["met"] and python["target"] == "<= 0.45"
    assert device["value"] == pytest.approx(0.15) and device["met"]
    assert hit["cells"] == {"pinned@4 KiB": 120.0, "pinned@64 KiB": 120.0} and hit["met"]
    assert threads["value"] == pytest.approx(4.5) and threads["met"]  # not the stored 99
    assert py_threads["value"] == pytest.approx(3.5) and py_threads["met"]  # not the stored 99
    REGISTRY[11].show(doc["sections"][SECTION_KEYS[11]])
    printed = capsys.readouterr().out
    assert "cupy PinnedMemoryPool" in printed and "cuStreamGetId" in printed
    assert "account for 110.0 ns of the 120.0 ns" in printed  # 2*20 + 2*15 + 10 + 30
    # The recording's own calls are in their table, not counted in the hit pair's.
    assert "recording adds 40.0 ns to a pinned 4 KiB cached pair" in printed
    assert ("30.0 ns a hit, 90.0 ns a put; recording adds 25.0 ns to the hit and 15.0 ns to the "
            "put") in printed
    assert "the stamps and ring writes beside an uncached pair add 30.0 ns" in printed
    assert "ring writes alone are 60.0 ns of it" in printed  # 2*17 + 2*13
    assert "clocksource tsc, stamped with tsc" in printed
    assert re.search(r"^steady_clock read \(the other stamp\) +27\.0.* not made$", printed,
                     re.M), printed
    assert "cuStreamGetId (calls alone)" in printed


def test_front_cache_targets_missed_from_raw_rounds():
    doc = _front_cache_doc(cached_us=[0.2, 0.3, 0.2], cupy_us=[0.6, 0.6, 0.6],
                           hit_ns=[140.0, 151.0, 160.0], one_rate=[10e6, 10e6],
                           many_rate=[30e6, 41e6], device_us=[0.6, 0.7, 0.6],
                           torch_us=[2.0, 2.0, 2.0], py_one=[1e6, 1e6], py_many=[2.5e6, 3.2e6],
                           recording_ns=(150.0, 90.0, 61.0))
    python, device, hit, threads, py_threads, rec_uncached, rec_cached = _front_cache_targets(doc)
    assert not rec_uncached["met"] and rec_uncached["value"] == pytest.approx(150.0)
    assert not rec_cached["met"] and rec_cached["value"] == pytest.approx(61.0)
    assert python["met"] and python["value"] == pytest.approx(0.2 / 0.6)
    assert not device["met"] and device["value"] == pytest.approx(0.3)
    assert not hit["met"] and hit["value"] == 151.0
    assert not threads["met"] and threads["value"] == pytest.approx(3.55)
    assert not py_threads["met"] and py_threads["value"] == pytest.approx(2.85)


def test_front_cache_missing_cells_fail_and_say_why():
    from asyncmr_bench.common import APR_CACHED

    doc = _front_cache_doc(cached_us=[0.4], cupy_us=[0.6], hit_ns=[100.0], one_rate=[1e6],
                           many_rate=[8e6],
                           cpp={"skipped": "no cache_bench program (looked at: x)"})
    sec = doc["sections"][SECTION_KEYS[11]]
    sec["python"]["results"][APR_CACHED]["65536"] = {"error": "MemoryError: out of memory"}
    python, _, hit, threads, _, rec_uncached, rec_cached = _front_cache_targets(doc)
    assert not python["met"] and python["missing"] == ["64 KiB"]
    assert python["value"] == pytest.approx(0.4 / 0.6)  # the cell that is there, still reported
    for t in (hit, threads, rec_uncached, rec_cached):
        assert t["status"] == targets.NOT_MET and not t["met"] and t["value"] is None
        assert "C++ cache_bench skipped: no cache_bench program" in t["note"]
    doc["sections"][SECTION_KEYS[11]] = {"skipped": "CuPy is not installed"}
    assert all("section 11 skipped" in t["note"] for t in _front_cache_targets(doc))


def test_cache_bench_absent_is_a_skip_that_says_how_to_build_it(tmp_path):
    from asyncmr_bench.sections import front_cache

    cfg = config("--cache-bin", str(tmp_path / "cache_bench"))
    result = floor.run_cache_bench(cfg, front_cache.SIZES, 64 * MiB)
    assert "ASYNCMR_BUILD_BENCHMARKS=ON" in result["skipped"]
    assert "--cache-bin" in result["skipped"] and str(tmp_path) in result["skipped"]
    assert floor.run_cache_bench(config("--no-floor"), front_cache.SIZES, 64 * MiB) == {
        "skipped": "--no-floor (no C++ benchmark program runs)"}


def test_cache_bench_is_found_next_to_the_floor_program(tmp_path):
    """ci/gpu.sh passes --floor-bin only: cache_bench beside it must be found."""
    for name in ("pool_floor", "cache_bench"):
        _program(tmp_path / name)
    path, _ = floor.find_cache_bin(config("--floor-bin", str(tmp_path / "pool_floor")))
    assert path == tmp_path / "cache_bench"


@pytest.mark.parametrize("optimized", [False, True])
def test_cache_bench_built_without_optimization_is_refused(tmp_path, optimized):
    doc = '{"meta":{"optimized":%s},"pairs":{},"threads":{}}' % str(optimized).lower()
    program = _program(tmp_path / "cache_bench", f"echo '{doc}'\n")
    result = floor.run_cache_bench(config("--cache-bin", str(program), "--quick"),
                                   [4096], 64 * MiB)
    if optimized:
        assert "error" not in result and result["command"][-1] == "--quick"
    else:
        assert "built without optimization" in result["error"]


def test_cache_bench_failure_is_an_error_with_its_output(tmp_path):
    program = _program(tmp_path / "cache_bench", "echo '{\"error\":\"no CUDA driver\"}'\n"
                       "echo 'cache_bench: no CUDA driver' >&2\nexit 1\n")
    result = floor.run_cache_bench(config("--cache-bin", str(program)), [4096], 64 * MiB)
    assert result["error"].startswith("cache_bench exited 1: cache_bench: no CUDA driver")
    assert result["output"] == {"error": "no CUDA driver"}


def test_section_11_is_registered_and_selectable():
    from asyncmr_bench.sections import REGISTRY

    assert SECTION_KEYS[11] == "11_front_cache" and REGISTRY[11].key == "11_front_cache"
    cfg = config("--sections", "11", "--quick")
    assert cfg.sections == [11] and cfg.cache_rounds == 11
    assert config("--sections", "11").cache_rounds == 21


# ---- on a GPU: the cache_bench program ---------------------------------------------------------


def test_cache_bench_quick_prints_every_part(gpu):
    """cache_bench --quick on the GPU: one JSON document with the three ways per pool kind and
    size (every cached pair after the first a hit), the calls a hit makes, the threads, the
    meta; nothing under errors."""
    path, looked = floor.find_cache_bin(config())
    if path is None:
        pytest.skip("the benchmark's cache_bench program is not built (looked at: " +
                    ", ".join(str(p) for p in looked) + "); " + floor.BUILD_HINT)
    out = subprocess.run([str(path), "--quick"], capture_output=True, text=True, timeout=240,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["errors"] == {}
    meta, params = doc["meta"], doc["params"]
    assert meta["optimized"] is True and meta["gpu"] and meta["variant"].startswith("cu")
    assert meta["driver"] > 0 and meta["runtime"] > 0 and meta["hardware_concurrency"] > 0
    sizes = params["sizes"]
    assert sizes == [4096, 65536] and params["cache_bytes"] == 64 * MiB
    for kind in ("pinned", "device", "managed"):
        for size in sizes:
            entry = doc["pairs"][kind][str(size)]
            for way in ("floor", "uncached", "cached", "cached_legacy"):
                assert entry[way]["median_ns"] > 0
                assert len(entry["rounds_ns"][way]) == params["rounds"]
            assert entry["cached_over_floor"]["median"] > 0
            for way in ("hits", "puts", "hits_recording", "puts_recording",
                        "uncached_stamped_written"):
                rounds = entry["rounds_ns"][way]
                assert len(rounds) == params["rounds"] and min(rounds) > 0, way
        stats = doc["cache"][kind]
        # Every allocation a hit but the first of each size on each of the two streams (the
        # created one and the legacy one) and the fill of the split rounds (split_batch blocks
        # held at once, all but the first block missing the cache).
        assert stats["misses"] <= len(sizes) * (params["split_batch"] + 1)
        assert stats["hits"] >= params["rounds"] * params["pairs"] * len(sizes)
        assert stats["cached_bytes"] <= stats["cap"] == 64 * MiB
    for call in ("cuStreamIsCapturing", "cuStreamGetId", "cuEventRecord", "front_cache take+put"):
        assert doc["calls"][call]["median_ns"] > 0
        assert doc["calls_per_hit_pair"][call] in (1, 2)
    # Timed beside them, not made by a hit: the idle-stream question that could skip the marker.
    assert doc["calls"]["cuStreamQuery"]["median_ns"] > 0
    assert doc["calls_per_hit_pair"]["cuStreamQuery"] == 0
    for call in ("history clock read", "history ring record"):
        assert doc["calls"][call]["median_ns"] > 0 and len(doc["calls"][call]["rounds_ns"]) == \
            params["rounds"]
        assert doc["calls_per_recorded_pair"][call] == 2
    th = doc["threads"]
    n = str(th["threads"])
    assert th["kind"] == "pinned" and th["bytes"] == 4096 and n == "8"
    for group, names, unit in (("results", ("cached", "uncached"), "pairs_per_s"),
                               ("calls", ("cuStreamIsCapturing", "cuStreamGetId", "cuEventRecord",
                                          "cuStreamQuery"), "calls_per_s")):
        for name in names:
            e = th[group][name]
            assert e["1"][f"median_{unit}"] > 0 and e[n][f"median_{unit}"] > 0
            rounds = e[f"rounds_{unit}"]
            assert len(rounds["1"]) == len(rounds[n]) == th["rounds"]
            assert e["scaling"]["median"] > 0 and e["per_thread"] >= 1000
    assert th["control_scaling"] > 0


# ---- README figures ---------------------------------------------------------------------------


def test_every_readme_figure_is_rendered_from_the_committed_results():
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "render_readme.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_tree_keeps_only_runs_that_hold_the_newest_figures_of_a_section():
    # Per (build, GPU), each section's figures come from its newest run; a run no section's
    # figures come from any more is git's to keep, not the tree's.
    from asyncmr_bench import committed

    assert COMMITTED == sorted(RESULTS.glob("*/*/results.json")), "results/<build>/<run>/ only"
    assert {r.build for r in committed.runs()} <= {"cu12", "cu13"}
    assert committed.superseded() == [], [str(r.path) for r in committed.superseded()]
    newest = committed.newest("cu13", 1)
    assert newest is not None and newest.measured(1) and "UTC" in newest.describe()


def test_a_figure_typed_into_the_readme_fails_the_check(tmp_path):
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    readme.write_text(text.replace("## Install", "A pair costs 0.42 us.\n\n## Install", 1))
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "render_readme.py"), "--check",
                           "--readme", str(readme)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "'0.42 us'" in proc.stdout, proc.stdout
    # And a block edited by hand differs from the render.
    readme.write_text(text.replace("from Python, us |", "from Python, us (edited) |", 1))
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "render_readme.py"), "--check",
                           "--readme", str(readme)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "differs from the committed results" in proc.stdout


def test_every_section_of_a_full_run_has_a_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="the plots are drawn with matplotlib "
                        "(the [bench] extra); the rest of the benchmark runs without it")
    from asyncmr_bench.plots import write_plots

    doc = load(QUICK_RUN)
    made = write_plots(doc, tmp_path)
    assert "error" not in made, made
    assert sorted(made) == sorted(doc["sections"]), made
    for key, name in made.items():
        assert not name.startswith("error"), (key, name)
        assert (tmp_path / name).stat().st_size > 10_000, name


# ---- two builds side by side (ci/gpu.sh's compare stage) ------------------------------------------


def _pairs_doc(us_by_resource):
    return {"sections": {"1_pair_cost": {"results": {
        name: {"4096": {"median_us": us}} for name, us in us_by_resource.items()}}}}


def test_compare_builds_gives_after_over_before_per_cell(tmp_path, capsys):
    import compare_builds

    files = {}
    for name, doc in {"b1": _pairs_doc({"AsyncPinnedMR": 2.0, "AsyncDeviceMR": 1.0}),
                      "b2": _pairs_doc({"AsyncPinnedMR": 2.2, "AsyncDeviceMR": 1.2}),
                      "a1": _pairs_doc({"AsyncPinnedMR": 1.0}),
                      "a2": _pairs_doc({"AsyncPinnedMR": 1.2})}.items():
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(doc))
    out = tmp_path / "compare.json"
    rc = compare_builds.main(["--before", str(files["b1"]), str(files["b2"]),
                              "--after", str(files["a1"]), str(files["a2"]), "--out", str(out)])
    assert rc == 0
    rows = {r["resource"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["AsyncPinnedMR"]["before_us"] == pytest.approx(2.1)
    assert rows["AsyncPinnedMR"]["after_over_before"] == pytest.approx(1.1 / 2.1)
    assert rows["AsyncDeviceMR"]["after_us"] is None, "a cell one build lacks is shown, not invented"
    assert "| 1 | AsyncPinnedMR | 4096 | 2.100 | 1.100 | 0.52x |" in capsys.readouterr().out


def test_compare_builds_cancels_a_drift_every_resource_shares(tmp_path, capsys):
    # The second before-run is 40% faster for everything, RMM's resource as much as ours (a
    # machine's drift): raw, the after build looks 25% slower; against the reference, unchanged.
    import compare_builds

    ref = compare_builds.DEFAULT_REFERENCE
    docs = {"b1": {"AsyncPinnedMR": 2.0, ref: 1.0}, "b2": {"AsyncPinnedMR": 1.2, ref: 0.6},
            "a1": {"AsyncPinnedMR": 2.0, ref: 1.0}, "a2": {"AsyncPinnedMR": 2.0, ref: 1.0}}
    files = {}
    for name, cells in docs.items():
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(_pairs_doc(cells)))
    out = tmp_path / "compare.json"
    assert compare_builds.main(["--before", str(files["b1"]), str(files["b2"]), "--after",
                                str(files["a1"]), str(files["a2"]), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = {r["resource"]: r for r in doc["rows"]}
    ours = rows["AsyncPinnedMR"]
    assert ours["after_over_before"] == pytest.approx(1.25)
    assert ours["before_against_reference"] == pytest.approx([2.0, 2.0])
    assert ours["after_over_before_against_reference"] == pytest.approx(1.0)
    assert rows[ref]["after_over_before_against_reference"] is None, "the reference against itself"
    assert doc["reference"] == ref
    text = capsys.readouterr().out
    assert f"against: {ref}" in text and "| 1.25x | 1.000x |" in text


def test_compare_builds_leaves_a_run_without_the_reference_out(tmp_path):
    import compare_builds

    ref = compare_builds.DEFAULT_REFERENCE
    b1, b2, a1 = (tmp_path / f"{n}.json" for n in ("b1", "b2", "a1"))
    b1.write_text(json.dumps(_pairs_doc({"AsyncDeviceMR": 1.0, ref: 2.0})))
    b2.write_text(json.dumps(_pairs_doc({"AsyncDeviceMR": 9.0})))  # no reference cell
    a1.write_text(json.dumps(_pairs_doc({"AsyncDeviceMR": 1.1, ref: 2.0})))
    row = compare_builds.compare([str(b1), str(b2)], [str(a1)])[0]
    assert row["before_against_reference"] == pytest.approx([0.5])
    assert row["after_over_before_against_reference"] == pytest.approx(1.1)


def test_compare_builds_names_an_unreadable_file(tmp_path, capsys):
    import compare_builds

    assert compare_builds.main(["--before", str(tmp_path / "missing.json"), "--after",
                                str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


# ---- section 12: managed placement -----------------------------------------------------------


def _placement_doc(faults, prefetched, none, option, stack, loop, batch, ours, discarding=None):
    """discarding: the rounds of prefetch='device', discard=True, or None for a build without
    discard (CUDA 12), where the section leaves that way out."""
    def e(rounds):
        return {"median_ms": sorted(rounds)[len(rounds) // 2], "rounds_ms": rounds}

    reused = {"AsyncManagedMR()": e(none), "AsyncManagedMR(prefetch='device')": e(option),
              "rmm PrefetchResourceAdaptor stack": e(stack)}
    if discarding is not None:
        reused["AsyncManagedMR(prefetch='device', discard=True)"] = e(discarding)
    return {"params": {"sections": [12]}, "sections": {SECTION_KEYS[12]: {
        "host_written": {"faults": e(faults), "asyncmr.prefetch": e(prefetched)},
        "reused": reused,
        "small_ranges": {"loop of cudaMemPrefetchAsync": e(loop),
                         "cudaMemPrefetchBatchAsync": batch if isinstance(batch, dict)
                         else e(batch),
                         "asyncmr.prefetch": e(ours)},
        "overwrite": {}}}}


def test_placement_targets_from_raw_rounds():
    doc = _placement_doc(faults=[120.0, 100.0, 130.0], prefetched=[25.0, 20.0, 40.0],
                         none=[36.0, 30.0, 40.0], option=[6.0, 5.0, 8.0],
                         stack=[6.0, 5.0, 8.0], loop=[3.3, 3.0, 3.6], batch=[19.6, 2.0, 20.0],
                         ours=[3.4, 2.1, 3.5], discarding=[0.3, 0.3, 5.0])
    a, b_none, b_stack, c = [t for t in targets.compute_targets(doc) if t["section"] == 12]
    assert a["value"] == pytest.approx(4.8) and a["met"]  # 120/25, 100/20, 130/40 -> 4.8
    # none against the discarding way, not the plain prefetch: 120, 100, 8 -> 100
    assert b_none["value"] == pytest.approx(100.0) and b_none["met"]
    # the worse of the two ways against the stack: plain 1, 1, 1; discarding 0.05, 0.06, 0.625
    assert b_stack["cells"]["b"] == pytest.approx(1.0)
    assert b_stack["cells"]["b, discard=True"] == pytest.approx(0.06)
    assert b_stack["value"] == pytest.approx(1.0) and b_stack["met"]
    assert c["value"] == pytest.approx(3.4 / 3.3) and c["met"]  # against min(loop, batch)


def test_placement_target_without_the_batch_call_uses_the_loop():
    doc = _placement_doc(faults=[10.0], prefetched=[5.0], none=[1.0], option=[1.0], stack=[1.0],
                         loop=[3.0], batch={"error": "RuntimeError: no batch call"}, ours=[4.0])
    a, b_none, _, c = [t for t in targets.compute_targets(doc) if t["section"] == 12]
    assert not a["met"] and a["value"] == pytest.approx(2.0)
    assert not b_none["met"]
    assert not c["met"] and c["value"] == pytest.approx(4.0 / 3.0)


def test_placement_target_on_a_build_without_discard_says_why_it_is_missing():
    doc = _placement_doc(faults=[10.0], prefetched=[1.0], none=[30.0], option=[5.0],
                         stack=[5.0], loop=[3.0], batch=[3.0], ours=[3.0])
    _, b_none, b_stack, _ = [t for t in targets.compute_targets(doc) if t["section"] == 12]
    assert not b_none["met"] and b_none["missing"] == ["b"]
    assert "this build has no discard" in b_none["note"]
    assert b_stack["met"] and list(b_stack["cells"]) == ["b"]  # the plain way alone, 1.0


# ---- section 13: the managed stacks --------------------------------------------------------

def _stacks_doc(door_warm, pool_warm, door_first, pool_first, ours_fit, pool_fit):
    def way(first, warm):
        return {"first": {"median_s": first[0]}, "warm": {"median_s": warm[0]},
                "rounds_first_s": first, "rounds_warm_s": warm, "equal_to_pandas": True}

    def fits(rounds):
        return {"fits": {e: {"median_s": rounds[0], "rounds_s": rounds}
                         for e in ("KMeans", "LogisticRegression", "RandomForestClassifier",
                                   "Ridge")}, "equal_to_managed": True}

    return {"params": {"sections": [13]}, "sections": {SECTION_KEYS[13]: {
        "cudf_pandas": {"rows": 2_000_000, "iterations": 4, "plain_pandas": {"seconds": 9.0},
                        "results": {"python -m asyncmr cudf-pandas": way(door_first, door_warm),
                                    "cudf.pandas managed_pool": way(pool_first, pool_warm)}},
        "cuml": {"rows": 100_000, "cols": 20, "iterations": 3,
                 "results": {"AsyncManagedMR()": fits(ours_fit),
                             "rmm PoolMemoryResource(ManagedMemoryResource())": fits(pool_fit)}}}}}


def test_managed_stacks_targets_read_the_per_round_ratios(capsys):
    from asyncmr_bench.sections import REGISTRY

    # Warm ratios 0.7, 0.9, 0.8 -> 0.8 (met); first 1.2, 0.9, 1.1 -> 1.1 (missed); fits 0.5.
    doc = _stacks_doc(door_warm=[0.7, 0.9, 0.8], pool_warm=[1.0, 1.0, 1.0],
                      door_first=[1.2, 0.9, 1.1], pool_first=[1.0, 1.0, 1.0],
                      ours_fit=[0.5, 0.5, 0.5], pool_fit=[1.0, 1.0, 1.0])
    warm, first, fits = [t for t in targets.compute_targets(doc) if t["section"] == 13]
    assert warm["value"] == pytest.approx(0.8) and warm["met"]
    assert first["value"] == pytest.approx(1.1) and not first["met"]
    assert fits["value"] == pytest.approx(0.5) and fits["met"] and len(fits["cells"]) == 4
    REGISTRY[13].show(doc["sections"][SECTION_KEYS[13]])
    printed = capsys.readouterr().out
    assert "a. cudf.pandas, 2.0 M rows" in printed and "b. cuML fits, 100000 x 20" in printed


def test_managed_stacks_show_the_placed_ways_beside_the_door(capsys):
    """The ``--prefetch device --discard`` door and ``AsyncManagedMR(prefetch='device',
    discard=True)`` are reported as ratios beside the plain ones, and leave the targets alone."""
    from asyncmr_bench.sections import REGISTRY
    from asyncmr_bench.sections.managed_stacks import DOOR_PLACED, ML_PLACED

    doc = _stacks_doc(door_warm=[0.9, 0.9], pool_warm=[1.0, 1.0], door_first=[1.0, 1.0],
                      pool_first=[1.0, 1.0], ours_fit=[1.0, 1.0], pool_fit=[1.0, 1.0])
    sec = doc["sections"][SECTION_KEYS[13]]
    placed = dict(sec["cudf_pandas"]["results"]["python -m asyncmr cudf-pandas"],
                  rounds_warm_s=[0.6, 0.8], rounds_first_s=[0.5, 0.5])
    sec["cudf_pandas"]["results"][DOOR_PLACED] = placed
    sec["cuml"]["results"][ML_PLACED] = {"fits": {
        e: {"median_s": 0.4, "rounds_s": [0.4, 0.4]}
        for e in ("KMeans", "LogisticRegression", "RandomForestClassifier", "Ridge")}}
    warm = [t for t in targets.compute_targets(doc) if t["section"] == 13][0]
    assert warm["value"] == pytest.approx(0.9)  # the door's own ratio, not the placed way's
    REGISTRY[13].show(sec)
    printed = capsys.readouterr().out
    assert re.search(re.escape(f"{DOOR_PLACED} / cudf.pandas managed_pool, warm") + r"\D*0\.7",
                     printed), printed
    assert re.search(re.escape(f"KMeans: {ML_PLACED} / rmm PoolMemoryResource("
                               "ManagedMemoryResource())") + r"\D*0\.4", printed), printed


def test_managed_stacks_skipped_parts_say_why_in_their_targets():
    doc = {"params": {"sections": [13]}, "sections": {SECTION_KEYS[13]: {
        "cudf_pandas": {"skipped": "cuDF is not installed"},
        "cuml": {"skipped": "cuML is not installed"}}}}
    ts = [t for t in targets.compute_targets(doc) if t["section"] == 13]
    assert [t["status"] for t in ts] == [targets.NOT_MET] * 3
    assert "a. cuDF is not installed" in ts[0]["note"] and "b. cuML is not installed" in ts[2]["note"]


def test_managed_stacks_compare_answers_value_by_value():
    from asyncmr_bench.sections.managed_stacks import ML_TOLERANCES, differences

    ref = {"group_sum": [1.0, 2.0], "group_count": [3, 4], "parquet_equal": True}
    assert differences(dict(ref), ref, {}) == []
    assert differences({**ref, "group_sum": [1.0, 2.0 + 1e-12]}, ref, {}) == []
    assert differences({**ref, "group_sum": [1.0, 2.001]}, ref, {}) == ["group_sum"]
    assert differences({**ref, "group_count": [3, 5]}, ref, {}) == ["group_count"]
    assert differences({**ref, "parquet_equal": False}, ref, {}) == ["parquet_equal"]
    assert differences({"group_sum": [1.0]}, ref, {}) == ["group_sum", "group_count",
                                                           "parquet_equal"]
    ml = {"RandomForestClassifier": 0.95, "KMeans": 100.0}
    assert differences({"RandomForestClassifier": 0.955, "KMeans": 100.005}, ml,
                       ML_TOLERANCES) == []
    assert differences({"RandomForestClassifier": 0.97, "KMeans": 100.0}, ml,
                       ML_TOLERANCES) == ["RandomForestClassifier"]


def test_section_13_rounds_are_a_positive_option():
    assert config("--stack-repeats", "6").stack_repeats == 6
    assert config().stack_repeats == 3 and config("--quick").stack_repeats == 2
    with pytest.raises(SystemExit):
        config("--stack-repeats", "0")


def test_a_recorded_history_becomes_replay_steps_as_the_history_reads_it():
    """Section 13 c's trace: a size allocates, -(k + 1) frees the k-th allocation. A block
    allocated again at a live address ends the one there (its late free is skipped), and
    frees of blocks from before the recording, 0-byte allocations and pool events drop out."""
    from asyncmr_bench.sections.stack_allocs import trace_ops, traces_from

    events = [["grow", 0, 1 << 21], ["alloc", 0xA0, 256], ["free", 0x50, 64],
              ["alloc", 0xB0, 4096], ["free", 0xA0, 256], ["alloc", 0xA0, 512],
              ["cache_hit", 0xC0, 128], ["alloc", 0xB0, 1024], ["free", 0xB0, 4096],
              ["alloc", 0xD0, 0], ["cache_put", 0xC0, 128], ["free", 0xB0, 1024],
              ["trim", 0, 1 << 21], ["alloc", 0xE0, 8]]
    ops = trace_ops(events)
    assert ops == [256, 4096, -1, 512, 128, -2, 1024, -4, -5, 8]
    got = traces_from({"w": {"first": {"events": events, "dropped": 0}}})
    assert got == {"w": {"first": {"ops": ops, "allocs": 6, "dropped": 0}}}


def test_managed_stacks_show_what_an_allocator_can_take_off_each_run(capsys):
    """Part c prints each way's replay beside its run, and the lowest ratio to the pool
    adaptor's run an allocator costing nothing could give."""
    from asyncmr_bench.sections import REGISTRY

    doc = _stacks_doc(door_warm=[0.9, 0.9], pool_warm=[0.8, 0.8], door_first=[1.0, 1.0],
                      pool_first=[1.0, 1.0], ours_fit=[0.02, 0.02], pool_fit=[0.02, 0.02])
    sec = doc["sections"][SECTION_KEYS[13]]

    def replays(warm_s, names):
        return {n: {"first": {"median_s": 2 * warm_s}, "warm": {"median_s": warm_s}}
                for n in names}

    trace = {"first": {"allocs": 30, "dropped": 0}, "warm": {"allocs": 20, "dropped": 0}}
    estimators = ("KMeans", "LogisticRegression", "RandomForestClassifier", "Ridge")
    dropping = {"first": {"allocs": 30, "dropped": 7}, "warm": trace["warm"]}
    sec["allocator_share"] = {
        "cudf_pandas": {"traces": {"workload": trace}, "replays": {
            "python -m asyncmr cudf-pandas": replays(0.004, ["workload"]),
            "cudf.pandas managed_pool": replays(0.02, ["workload"])}},
        "cuml": {
            "traces": {e: dropping if e == "Ridge" else trace for e in estimators},
            "replays": {
                "AsyncManagedMR()": replays(0.0001, estimators),
                "rmm PoolMemoryResource(ManagedMemoryResource())": {"error": "exit 1: broken"}}}}
    REGISTRY[13].show(sec)
    printed = capsys.readouterr().out
    assert "c. cudf_pandas's allocations replayed alone" in printed
    assert re.search(r"cudf.pandas managed_pool\W+workload\W+30/20\W+40\.00\W+20\.00\W+2\.5%",
                     printed), printed
    assert ("workload: cudf.pandas managed_pool's allocations take 20.00 ms of its 800.0 ms "
            "warm run; an allocator costing nothing would put python -m asyncmr cudf-pandas at "
            "0.975x it at best") in printed
    assert re.search(r"AsyncManagedMR\(\)\W+KMeans\W+30/20\W+0\.20\W+0\.10\W+0\.5%", printed)
    assert "exit 1: broken" in printed and "KMeans: rmm PoolMemoryResource" not in printed
    assert "Ridge, first run: the recording dropped 7 events" in printed
    assert "workload, first run: the recording dropped" not in printed


def test_the_stacks_plot_draws_each_ways_replayed_allocations():
    """Section 13 c's panels: a warm run's replay per way in ms (cuML's fits summed); a way
    whose replays failed is left out."""
    from asyncmr_bench.plots import _share_panels

    def replay(*warm_s):
        return {**{f"run{i}": {"warm": {"median_s": s}} for i, s in enumerate(warm_s)},
                "resource": "X"}

    panels = _share_panels({
        "cudf_pandas": {"replays": {"door": replay(0.002), "pool": replay(0.008)}},
        "cuml": {"replays": {"ours": replay(0.001, 0.002), "bad": {"error": "exit 1"}}}})
    (pandas_title, pandas), (cuml_title, cuml) = panels
    assert pandas == pytest.approx({"door": 2.0, "pool": 8.0}) and "cudf.pandas" in pandas_title
    assert cuml == pytest.approx({"ours": 3.0}) and "cuML" in cuml_title
    assert _share_panels({}) == [] and _share_panels({"cuml": {"error": "tracing: x"}}) == []


def test_a_traced_run_replays_on_each_resource(gpu, tmp_path):
    """Section 13 c end to end without cuDF: a script with the trace hook allocates through
    RMM's current resource (an AsyncManagedMR); its history becomes traces, replayed on
    asyncmr, RMM's pool adaptor over managed memory and RMM's async resource."""
    from asyncmr_bench.sections import stack_allocs
    from asyncmr_bench.sections.managed_stacks import _rotating, _run

    script = tmp_path / "traced.py"
    script.write_text("import json, sys\nimport rmm\nimport asyncmr\n" + stack_allocs.TRACE_HOOK
                      + "rmm.mr.set_current_device_resource(asyncmr.AsyncManagedMR())\n"
                      "def work(n):\n"
                      "    keep = [rmm.DeviceBuffer(size=(k + 1) * 4096) for k in range(n)]\n"
                      "    del keep[::2]\n"
                      "    return len(keep)\n"
                      "traced('pairs', 'first', lambda: work(6))\n"
                      "traced('pairs', 'warm', lambda: work(4))\n"
                      "save_traces()\n"
                      "json.dump({}, open(sys.argv[1], 'w'))\n")
    setups = {"ours": "asyncmr", "pool": "rmm:managed_pool", "async": "rmm:async"}
    got = stack_allocs.measure(([sys.executable, str(script)], [], {}), setups, 1,
                               str(tmp_path / "share"), _run, _rotating)
    assert "error" not in got, got
    assert got["traces"] == {"pairs": {"first": {"allocs": 6, "dropped": 0},
                                       "warm": {"allocs": 4, "dropped": 0}}}
    for way in setups:
        r = got["replays"][way]
        assert "error" not in r, r
        pairs = r["pairs"]
        assert pairs["first"]["median_s"] > 0 and pairs["warm"]["n"] == stack_allocs.WARM_REPLAYS
    assert got["replays"]["pool"]["resource"] == "PoolMemoryResource"


def test_the_pandas_workload_runs_under_plain_pandas(tmp_path):
    """Not a GPU test: the workload script every way runs, under plain pandas, as section 13
    runs it for the reference answers. Skips where pandas or pyarrow is missing (the GPU host
    has both)."""
    pytest.importorskip("pandas", reason="pandas is not installed here; the GPU host has it")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed here; the GPU host has it")
    from asyncmr_bench.sections.managed_stacks import PANDAS_SCRIPT

    script = tmp_path / "workload.py"
    script.write_text(PANDAS_SCRIPT)
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(script), str(out), str(tmp_path), "20000", "2"],
                   check=True, timeout=120)
    got = json.loads(out.read_text())
    assert len(got["times_s"]) == 2
    r = got["result"]
    assert r["parquet_equal"] is True and r["merge_rows"] == 20000
    assert sum(r["group_count"]) == 20000 and len(r["sorted_head"]) == 500


def test_the_rotating_runner_gives_each_way_a_fresh_process_per_round(tmp_path):
    """Section 13's runner, with the plain pandas workload as two ways and a failing third."""
    pytest.importorskip("pandas", reason="pandas is not installed here; the GPU host has it")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed here; the GPU host has it")
    from asyncmr_bench.sections.managed_stacks import PANDAS_SCRIPT, _rotating

    script = tmp_path / "workload.py"
    script.write_text(PANDAS_SCRIPT)
    way = ([sys.executable, str(script)], ["5000", "2"], {})
    failing = ([sys.executable, "-c", "import sys; print('broken'); sys.exit(3)"], [], {})
    got = _rotating({"one": way, "two": way, "bad": failing}, 2, str(tmp_path))
    assert [len(got["one"]), len(got["two"])] == [2, 2]
    assert all(len(a["times_s"]) == 2 and a["result"]["parquet_equal"] for a in got["one"])
    assert got["bad"] == {"error": "exit 3: broken"}

# SPDX-License-Identifier: Apache-2.0
"""Section 13: the managed stacks people run, on asyncmr and on what they use today.

a. **cudf.pandas**: one pandas workload (groupby-aggregate, merge, sort, string ops, a Parquet
   round trip on ``stack_rows`` rows), each way in a fresh process: ``python -m asyncmr
   cudf-pandas`` (the door: an ``AsyncManagedMR`` and libcudf's prefetching; again with
   ``--cache`` 64 MiB, a front cache, and with ``--prefetch device --discard``, each allocation
   placed on the GPU with its old contents dropped (CUDA 13 build), both reported beside it)
   and ``python -m
   cudf.pandas`` with ``CUDF_PANDAS_RMM_MODE`` "managed", "managed_pool" (its default) and
   "async". A process runs the workload ``stack_iters`` times: the first is the *first run*
   (what a user's script meets: imports, JIT, the pool's growth), the median of the others the
   *warm* time. Every way's answers are compared value by value with plain pandas' (the same
   script without cudf.pandas, run once).
b. **cuML**: KMeans, LogisticRegression, RandomForestClassifier and Ridge fitted on a
   ``ml_rows`` x 20 float32 dataset, each way in a fresh process with its resource as RMM's
   current one (CuPy through RMM): ``AsyncManagedMR()`` (and with a 64 MiB front cache, and
   with ``prefetch='device', discard=True`` on the CUDA 13 build, reported beside it), RMM's
   ``ManagedMemoryResource``,
   ``PoolMemoryResource(ManagedMemoryResource())`` and ``CudaAsyncMemoryResource``. Each fit
   runs ``ml_iters`` times; the median of all but the first is its time. The fits are compared
   with those on ``ManagedMemoryResource`` within each estimator's tolerance.
Rounds (``stack_repeats``) run the ways in rotating order. Targets (targets.py), medians of
per-round ratios: the door's warm time <= 0.85x "managed_pool"'s and its first run <= 1.0x;
each cuML fit on asyncmr <= 0.9x its time on ``PoolMemoryResource(ManagedMemoryResource())``.
Skipped, with the reason, where cuDF (a) or cuML (b) is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile

from ..common import (
    SECTION_TITLES, err_text, median_ratio, percentile, print_ratio_values, print_table,
    summarize,
)
from ..harness import Skip
from . import stack_allocs
from .stack_allocs import TRACE_HOOK

PLAIN = "plain pandas (CPU)"
DOOR = "python -m asyncmr cudf-pandas"
CACHE = 64 << 20  # the cached ways' front cache
DOOR_CACHED = "python -m asyncmr cudf-pandas --cache 64 MiB"
DOOR_PLACED = "python -m asyncmr cudf-pandas --prefetch device --discard"
MODES = ("managed", "managed_pool", "async")
ML_CACHED = "AsyncManagedMR(cache=64 MiB)"
ML_PLACED = "AsyncManagedMR(prefetch='device', discard=True)"
ML_ASYNC = "rmm CudaAsyncMemoryResource"
ML_WAYS = {"AsyncManagedMR()": "asyncmr", ML_CACHED: "asyncmr_cached", ML_PLACED: "asyncmr_placed",
           "rmm ManagedMemoryResource": "managed",
           "rmm PoolMemoryResource(ManagedMemoryResource())": "managed_pool",
           ML_ASYNC: "async"}
ML_REFERENCE = "rmm ManagedMemoryResource"
ML_POOL = "rmm PoolMemoryResource(ManagedMemoryResource())"
ESTIMATORS = ("KMeans", "LogisticRegression", "RandomForestClassifier", "Ridge")
TIMEOUT_S = 600
SHARE_ROUNDS = 2  # part c: rotating rounds of replay processes per way


def mode_name(mode: str) -> str:
    return f"cudf.pandas {mode}"


# The workload, run by every way as a script: argv = out.json, scratch dir, rows, iterations.
PANDAS_SCRIPT = r'''
import json
import sys
import time

import numpy as np
import pandas as pd
#TRACE_HOOK
out, scratch, rows, iters = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(20261202)
columns = {"k": rng.integers(0, 1000, rows), "v": rng.random(rows),
           "s": rng.choice(["alpha", "beta", "gamma", "delta"], rows)}


def once(i):
    df = pd.DataFrame(columns)
    g = df.groupby("k")["v"].agg(["sum", "mean", "count"]).sort_index()
    m = df.merge(g, left_on="k", right_index=True)
    ordered = m.sort_values(["k", "v"], kind="stable")
    lens = df["s"].str.upper().str.len()
    path = f"{scratch}/round{i}.parquet"
    df.to_parquet(path)
    back = pd.read_parquet(path)
    return {"group_sum": g["sum"].tolist(), "group_mean": g["mean"].tolist(),
            "group_count": [int(c) for c in g["count"].tolist()], "merge_rows": int(len(m)),
            "merge_v_sum": float(m["v"].sum()), "sorted_head": ordered["v"].head(500).tolist(),
            "sorted_tail": ordered["v"].tail(500).tolist(), "str_len_sum": int(lens.sum()),
            "parquet_equal": bool(back.equals(df))}


times = []
result = None
for i in range(iters):
    t0 = time.perf_counter()
    result = traced("workload", "first" if i == 0 else "warm", lambda: once(i))
    times.append(time.perf_counter() - t0)
save_traces()
resource = None
try:
    import rmm

    mr = rmm.mr.get_current_device_resource()
    resource = type(mr).__name__
except Exception:  # plain pandas: no RMM needed
    pass
with open(out, "w") as f:
    json.dump({"times_s": times, "result": result, "resource": resource}, f)
'''.replace("#TRACE_HOOK\n", TRACE_HOOK)

# argv = out.json, scratch dir (unused), way (ML_WAYS' values), rows, iterations.
CUML_SCRIPT = r'''
import json
import sys
import time

import cupy
import numpy as np
import rmm
from rmm.allocators.cupy import rmm_cupy_allocator
#TRACE_HOOK
out, way, rows, iters = sys.argv[1], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
if way == "asyncmr":
    from asyncmr import AsyncManagedMR
    mr = AsyncManagedMR()
elif way == "asyncmr_cached":
    from asyncmr import AsyncManagedMR
    mr = AsyncManagedMR(cache=64 << 20)
elif way == "asyncmr_placed":
    from asyncmr import AsyncManagedMR
    mr = AsyncManagedMR(prefetch="device", discard=True)
elif way == "managed":
    mr = rmm.mr.ManagedMemoryResource()
elif way == "managed_pool":
    mr = rmm.mr.PoolMemoryResource(rmm.mr.ManagedMemoryResource())
else:
    mr = rmm.mr.CudaAsyncMemoryResource()
rmm.mr.set_current_device_resource(mr)
cupy.cuda.set_allocator(rmm_cupy_allocator)
from cuml.cluster import KMeans
from cuml.ensemble import RandomForestClassifier
from cuml.linear_model import LogisticRegression, Ridge

rng = np.random.default_rng(20261202)
x_host = rng.standard_normal((rows, 20), dtype=np.float32)
w = rng.standard_normal(20).astype(np.float32)
y_reg_host = x_host @ w + 0.01 * rng.standard_normal(rows).astype(np.float32)
x, y_reg = cupy.asarray(x_host), cupy.asarray(y_reg_host)
y_cls = (y_reg > 0).astype(cupy.int32)
fits = {
    "KMeans": lambda: KMeans(n_clusters=8, random_state=1, n_init=1, max_iter=100).fit(x),
    "LogisticRegression": lambda: LogisticRegression(max_iter=300).fit(x, y_cls),
    "RandomForestClassifier": lambda: RandomForestClassifier(
        n_estimators=50, max_depth=10, random_state=1, n_streams=1).fit(x, y_cls),
    "Ridge": lambda: Ridge(alpha=1.0).fit(x, y_reg),
}
times, models = {}, {}
for name, fit in fits.items():
    times[name] = []
    for k in range(iters):
        t0 = time.perf_counter()
        models[name] = traced(name, "first" if k == 0 else "warm", fit)
        cupy.cuda.runtime.deviceSynchronize()
        times[name].append(time.perf_counter() - t0)
result = {
    "KMeans": float(models["KMeans"].inertia_),
    "LogisticRegression": cupy.asnumpy(cupy.asarray(models["LogisticRegression"].coef_)).ravel().tolist(),
    "RandomForestClassifier": float((models["RandomForestClassifier"].predict(x) == y_cls).mean()),
    "Ridge": cupy.asnumpy(cupy.asarray(models["Ridge"].coef_)).ravel().tolist(),
}
peak = None
attributes = getattr(mr, "attributes", None)
if attributes is not None:
    peak = int(attributes.used_mem_high)
with open(out, "w") as f:
    json.dump({"times_s": times, "result": result, "resource": type(mr).__name__,
               "pool_used_high": peak}, f)
save_traces()
'''.replace("#TRACE_HOOK\n", TRACE_HOOK)


def _run(before: list, after: list, env_extra: dict, scratch: str) -> dict:
    """Runs ``before + [scratch/out.json, scratch] + after`` in a fresh process (the scripts
    take their answer's path and a scratch folder first); that JSON, or {"error": ...}."""
    os.makedirs(scratch, exist_ok=True)
    out = os.path.join(scratch, "out.json")
    if os.path.exists(out):
        os.remove(out)
    env = {**os.environ, **env_extra}
    try:
        p = subprocess.run(before + [out, scratch] + after, capture_output=True, text=True,
                           env=env, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {TIMEOUT_S} s"}
    if p.returncode != 0 or not os.path.exists(out):
        tail = (p.stderr or p.stdout or "").strip().splitlines()[-3:]
        return {"error": f"exit {p.returncode}: {' | '.join(tail)}"}
    with open(out) as f:
        return json.load(f)


def _close(a, b, rel: float, abs_: float = 0.0) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rel, abs_) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)
    return a == b


def differences(result: dict, reference: dict, tolerances: dict) -> list:
    """The keys where ``result`` differs from ``reference`` (floats within ``tolerances``:
    {key: (rel, abs)}, default exact to 1e-9 relative)."""
    return [k for k in reference
            if k not in result or not _close(result[k], reference[k],
                                             *tolerances.get(k, (1e-9, 0.0)))]


# cuML fits on two resources agree within each estimator's tolerance (the forest's accuracy
# within a point, the others as tests/test_cuml.py asks).
ML_TOLERANCES = {"KMeans": (1e-4, 0.0), "LogisticRegression": (1e-3, 1e-4),
                 "RandomForestClassifier": (0.0, 0.01), "Ridge": (1e-4, 1e-5)}


def _rotating(ways: dict, repeats: int, scratch: str) -> dict:
    """Runs each way ``repeats`` times, in rotating order; ``ways``: {name: (argv before the
    out.json path and the scratch folder, argv after them, extra env)}. Returns {name: [its
    answers, one per round] or {"error": ...}}: a way that fails once is not run again."""
    answers: dict = {w: [] for w in ways}
    names = list(ways)
    for r in range(repeats):
        for i in range(len(names)):
            w = names[(r + i) % len(names)]
            if isinstance(answers[w], dict):
                continue
            before, after, env = ways[w]
            got = _run(before, after, env,
                       os.path.join(scratch, "".join(c if c.isalnum() else "_" for c in w)))
            answers[w] = {"error": got["error"]} if "error" in got else answers[w] + [got]
    return answers


def _first_and_warm(times: list) -> tuple:
    """(the first run, the median of the others)."""
    return times[0], percentile(times[1:] or times, 0.5)


def _script(scratch: str, name: str, text: str) -> str:
    path = os.path.join(scratch, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def _pandas(cfg, scratch: str) -> dict:
    script = _script(scratch, "workload.py", PANDAS_SCRIPT)
    args = [str(cfg.stack_rows), str(cfg.stack_iters)]
    py = sys.executable
    plain = _run([py, script], [str(cfg.stack_rows), "1"], {}, os.path.join(scratch, "plain"))
    ways = {DOOR: ([py, "-m", "asyncmr", "cudf-pandas", script], args, {}),
            DOOR_CACHED: ([py, "-m", "asyncmr", "cudf-pandas", "--cache", str(CACHE), script],
                          args, {})}
    if _can_discard():
        ways[DOOR_PLACED] = ([py, "-m", "asyncmr", "cudf-pandas", "--prefetch", "device",
                              "--discard", script], args, {})
    for m in MODES:
        ways[mode_name(m)] = ([py, "-m", "cudf.pandas", script], args, {"CUDF_PANDAS_RMM_MODE": m})
    results = {}
    for w, answers in _rotating(ways, cfg.stack_repeats, scratch).items():
        if isinstance(answers, dict):
            results[w] = answers
            continue
        firsts, warms = zip(*(_first_and_warm(a["times_s"]) for a in answers))
        got = answers[-1]
        diff = differences(got["result"], plain["result"], {}) if "result" in plain else None
        results[w] = {"first": summarize(firsts, "s"), "warm": summarize(warms, "s"),
                      "rounds_first_s": list(firsts), "rounds_warm_s": list(warms),
                      "resource": got.get("resource"),
                      "equal_to_pandas": diff == [] if diff is not None else None,
                      "differs_in": diff}
    return {"rows": cfg.stack_rows, "iterations": cfg.stack_iters,
            "plain_pandas": ({"error": plain["error"]} if "error" in plain else
                             {"seconds": plain["times_s"][0]}),
            "results": results}


def _cuml(cfg, scratch: str) -> dict:
    script = _script(scratch, "fits.py", CUML_SCRIPT)
    after = [str(cfg.ml_rows), str(cfg.ml_iters)]
    ways = {w: ([sys.executable, script], [way] + after, {}) for w, way in ML_WAYS.items()
            if w != ML_PLACED or _can_discard()}
    rounds = _rotating(ways, cfg.stack_repeats, scratch)
    reference = rounds.get(ML_REFERENCE)
    reference = reference[-1]["result"] if isinstance(reference, list) else None
    results = {}
    for w, answers in rounds.items():
        if isinstance(answers, dict):
            results[w] = answers
            continue
        fits = {est: [_first_and_warm(a["times_s"][est])[1] for a in answers]
                for est in ESTIMATORS}
        got = answers[-1]
        diff = differences(got["result"], reference, ML_TOLERANCES) if reference else None
        results[w] = {"fits": {est: {**summarize(v, "s"), "rounds_s": v} for est, v in fits.items()},
                      "resource": got.get("resource"),
                      "pool_used_high": got.get("pool_used_high"),
                      "equal_to_managed": diff == [] if diff is not None else None,
                      "differs_in": diff}
    return {"rows": cfg.ml_rows, "cols": 20, "iterations": cfg.ml_iters, "results": results}


def _shares(cfg, scratch: str, have_cudf: bool, have_cuml: bool) -> dict:
    """Part c: the allocations of the workload (through the door) and of each fit (on
    AsyncManagedMR()) replayed alone on each way's resource (stack_allocs)."""
    py = sys.executable
    parts: dict = {}
    if have_cudf:
        script = _script(scratch, "workload.py", PANDAS_SCRIPT)
        parts["cudf_pandas"] = (
            ([py, "-m", "asyncmr", "cudf-pandas", script],
             [str(cfg.stack_rows), str(stack_allocs.TRACE_ITERS)], {}),
            {DOOR: "door", **{mode_name(m): f"cudf.pandas:{m}" for m in MODES}})
    if have_cuml:
        script = _script(scratch, "fits.py", CUML_SCRIPT)
        parts["cuml"] = (
            ([py, script], ["asyncmr", str(cfg.ml_rows), str(stack_allocs.TRACE_ITERS)], {}),
            {"AsyncManagedMR()": "asyncmr", ML_POOL: "rmm:managed_pool", ML_ASYNC: "rmm:async"})
    out = {}
    for part, (trace_way, setups) in parts.items():
        try:
            out[part] = stack_allocs.measure(trace_way, setups, SHARE_ROUNDS,
                                             os.path.join(scratch, f"share-{part}"), _run,
                                             _rotating)
        except Exception as e:  # noqa: BLE001 - recorded; the other part still runs
            out[part] = {"error": err_text(e)}
    return out


def run(cfg, ctx) -> dict:
    have_cudf = importlib.util.find_spec("cudf") is not None
    have_cuml = importlib.util.find_spec("cuml") is not None
    if not have_cudf and not have_cuml:
        raise Skip("neither cuDF (a, cudf.pandas) nor cuML (b) is installed")
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="asyncmr-stacks-") as scratch:
        if have_cudf:
            try:
                out["cudf_pandas"] = _pandas(cfg, scratch)
            except Exception as e:  # noqa: BLE001 - recorded; b still runs
                out["cudf_pandas"] = {"error": err_text(e)}
        else:
            out["cudf_pandas"] = {"skipped": "cuDF is not installed"}
        if have_cuml:
            try:
                out["cuml"] = _cuml(cfg, scratch)
            except Exception as e:  # noqa: BLE001
                out["cuml"] = {"error": err_text(e)}
        else:
            out["cuml"] = {"skipped": "cuML is not installed"}
        out["allocator_share"] = _shares(cfg, scratch, have_cudf, have_cuml)
    out["notes"] = [
        "each way in a fresh process (cudf.pandas and RMM's current resource are set once per "
        "process); ways in rotating order per round",
        "cudf.pandas: first = the workload's first run in its process, warm = the median of the "
        "others; answers compared value by value with plain pandas' (floats to 1e-9 relative)",
        "cuML: a fit's time is the median of its runs after the first; fits compared with "
        "ManagedMemoryResource's within each estimator's tolerance",
        "allocator_share: the allocations and frees of the workload's first and second run "
        "(through the door) and of each fit's (on AsyncManagedMR()), recorded, then replayed "
        f"alone on each way's resource in a fresh process ({SHARE_ROUNDS} rotating rounds, "
        f"{stack_allocs.WARM_REPLAYS} warm replays each) on the default stream, each replay "
        "ended by a synchronization: the allocator's own cost in the run, Python's call included",
    ]
    return out


def _can_discard() -> bool:
    """Whether this build takes ``discard=True`` (the CUDA 13 one): the placed ways run there."""
    import asyncmr
    return asyncmr.can_discard()


def _rounds(results: dict, way: str, key: str):
    return (results.get(way) or {}).get(key)


def show(res: dict) -> None:
    title = SECTION_TITLES[13]
    pd_ = res.get("cudf_pandas") or {}
    if "results" in pd_:
        rows = []
        for w, e in pd_["results"].items():
            if "error" in e:
                rows.append([w, "-", "-", "-", e["error"][:60]])
                continue
            rows.append([w, f"{e['first']['median_s']:.3f}", f"{e['warm']['median_s']:.3f}",
                         str(e.get("equal_to_pandas")), str(e.get("resource"))])
        print_table(f"{title} -- a. cudf.pandas, {pd_['rows'] / 1e6:.1f} M rows (s, median)",
                    ["way", "first run", "warm", "equal to pandas", "resource"], rows)
        plain = pd_.get("plain_pandas") or {}
        if "seconds" in plain:
            print(f"  plain pandas on the CPU, one run: {plain['seconds']:.3f} s")
        r = pd_["results"]
        pool = mode_name("managed_pool")
        print_ratio_values({  # medians of per-round ratios
            f"{door} / {pool}, {label}": median_ratio(_rounds(r, door, key), _rounds(r, pool, key))
            for door in (DOOR, DOOR_CACHED, DOOR_PLACED) if door in r
            for label, key in (("warm", "rounds_warm_s"), ("first run", "rounds_first_s"))})
        _show_share(res, "cudf_pandas", {w: {"workload": e["warm"]["median_s"]}
                                         for w, e in r.items() if "warm" in e},
                    mode_name("managed_pool"), DOOR)
    else:
        print(f"  a. cudf.pandas: {pd_.get('skipped') or pd_.get('error')}")
    ml = res.get("cuml") or {}
    if "results" in ml:
        rows = []
        for w, e in ml["results"].items():
            if "error" in e:
                rows.append([w] + ["-"] * len(ESTIMATORS) + [e["error"][:60]])
                continue
            rows.append([w] + [f"{e['fits'][est]['median_s']:.4f}" for est in ESTIMATORS]
                        + [str(e.get("equal_to_managed"))])
        print_table(f"{title} -- b. cuML fits, {ml['rows']} x {ml['cols']} float32 (s, median)",
                    ["way", *ESTIMATORS, "fits equal"], rows)
        pool = (ml["results"].get(ML_POOL) or {}).get("fits") or {}
        ratios = {}
        for way in ("AsyncManagedMR()", ML_CACHED, ML_PLACED):
            if way not in ml["results"]:
                continue
            ours = (ml["results"].get(way) or {}).get("fits") or {}
            for est in ESTIMATORS:  # medians of per-round ratios
                ratios[f"{est}: {way} / {ML_POOL}"] = median_ratio(
                    _rounds(ours, est, "rounds_s"), _rounds(pool, est, "rounds_s"))
        print_ratio_values(ratios)
        _show_share(res, "cuml", {w: {est: e["fits"][est]["median_s"] for est in ESTIMATORS}
                                  for w, e in ml["results"].items() if "fits" in e},
                    ML_POOL, "AsyncManagedMR()")
    else:
        print(f"  b. cuML: {ml.get('skipped') or ml.get('error')}")


def _show_share(res: dict, part: str, runs: dict, pool: str, ours: str) -> None:
    """Part c for ``part``: the replays, then for each run the lowest ratio to ``pool``'s time
    that ``ours`` could reach with an allocator costing nothing, all else equal."""
    share = (res.get("allocator_share") or {}).get(part)
    if share is None:
        return
    title = f"{SECTION_TITLES[13]} -- c. {part}'s allocations replayed alone"
    stack_allocs.show(title, share, runs)
    if "error" in share:
        return
    for name, run_s in (runs.get(pool) or {}).items():
        replay = stack_allocs.warm_of(share["replays"], pool, name)
        if replay is not None and run_s:
            print(f"  {name}: {pool}'s allocations take {replay * 1e3:.2f} ms of its "
                  f"{run_s * 1e3:.1f} ms warm run; an allocator costing nothing would put "
                  f"{ours} at {stack_allocs.floor(replay, run_s):.3f}x it at best")

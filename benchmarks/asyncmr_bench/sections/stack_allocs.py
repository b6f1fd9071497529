# SPDX-License-Identifier: Apache-2.0
"""Section 13 c: how much of a stack's time its allocator can be.

The workload (cudf.pandas) and each cuML fit run once more through the door / on
``AsyncManagedMR()`` with the resource recording its history; every allocation and free of the
first run and of a warm one becomes a *trace* (sizes and order). Each way's resource, set up
exactly as the way sets it up (``asyncmr.cudf_pandas.install()``, ``cudf.pandas.install()``
under each ``CUDF_PANDAS_RMM_MODE``, RMM's resources for cuML), then replays the traces alone in
a fresh process, on the default stream (where cuDF and cuML allocate unless told otherwise):
the first trace on the fresh resource, the warm one ``WARM_REPLAYS`` times, each replay ended by
a synchronization. A replay's time is the allocator's own cost in the run, with Python's call
per allocation on top, apart from what the memory's placement does to the work around it (page
faults, migrations: the same memory for every managed way); against the way's own run time
(part a / b) it says how much of the run an allocator can take away.
"""

from __future__ import annotations

import json
import os
import sys

from ..common import print_table, summarize

WARM_REPLAYS = 5
TRACE_ITERS = 2  # the traced process runs the workload (each fit) twice: first, then warm
MAX_EVENTS = 1 << 21

# Pasted into the workload and fit scripts: with ASYNCMR_STACKS_TRACE set (the traced process
# only), traced() records the current resource's history around a call.
TRACE_HOOK = r'''
_TRACE_PATH = __import__("os").environ.get("ASYNCMR_STACKS_TRACE")
_traces = {}


def traced(name, phase, fn):
    if not _TRACE_PATH:
        return fn()
    import rmm
    with rmm.mr.get_current_device_resource().record_history(max_events=%d) as recording:
        got = fn()
    history = recording.history()
    _traces.setdefault(name, {})[phase] = {
        "events": [[e["action"], e["address"], e["bytes"]] for e in history.events],
        "dropped": history.dropped}
    return got


def save_traces():
    if _TRACE_PATH:
        with open(_TRACE_PATH, "w") as f:
            json.dump(_traces, f)


''' % MAX_EVENTS


def trace_ops(events) -> list:
    """A recorded history's ``[action, address, bytes]`` events as replay steps: ``n > 0``
    allocates n bytes (the trace's next allocation), ``-(k + 1)`` frees its k-th allocation.
    As the history reads them (docs/HISTORY.md): an allocation at an address still live ends
    the block there, whose free, noted late, follows; frees of blocks allocated before the
    recording, and allocations of 0 bytes (no memory), are left out."""
    live: dict = {}  # address -> allocation number
    late: dict = {}  # address -> frees still to come of blocks ended by a newer allocation
    ops: list = []
    count = 0
    for action, address, size in events:
        if action in ("alloc", "cache_hit"):
            if size <= 0:
                continue
            if address in live:
                ops.append(-(live.pop(address) + 1))
                late[address] = late.get(address, 0) + 1
            live[address] = count
            ops.append(size)
            count += 1
        elif action in ("free", "cache_put"):
            if late.get(address):
                late[address] -= 1
            elif address in live:
                ops.append(-(live.pop(address) + 1))
    return ops


def traces_from(recorded: dict) -> dict:
    """{name: {phase: {"events", "dropped"}}} (what save_traces wrote) -> {name: {phase:
    {"ops", "allocs", "dropped"}}}."""
    out: dict = {}
    for name, phases in recorded.items():
        for phase, rec in phases.items():
            ops = trace_ops(rec["events"])
            out.setdefault(name, {})[phase] = {"ops": ops, "allocs": sum(op > 0 for op in ops),
                                               "dropped": int(rec["dropped"])}
    return out


# argv = out.json, scratch dir, traces.json, setup, warm replays. The setup makes the resource
# as a way does: "door", "cudf.pandas:MODE", "asyncmr", "rmm:managed_pool", "rmm:async".
REPLAY_SCRIPT = r'''
import json
import os
import sys
import time

out, traces_path, setup, warm = sys.argv[1], sys.argv[3], sys.argv[4], int(sys.argv[5])
with open(traces_path) as f:
    traces = json.load(f)
import rmm
from rmm.pylibrmm.stream import DEFAULT_STREAM

if setup == "door":
    import asyncmr.cudf_pandas
    asyncmr.cudf_pandas.install()
elif setup.startswith("cudf.pandas:"):
    os.environ["CUDF_PANDAS_RMM_MODE"] = setup.split(":", 1)[1]
    import cudf.pandas
    cudf.pandas.install()
elif setup == "asyncmr":
    from asyncmr import AsyncManagedMR
    rmm.mr.set_current_device_resource(AsyncManagedMR())
elif setup == "rmm:managed_pool":
    rmm.mr.set_current_device_resource(rmm.mr.PoolMemoryResource(rmm.mr.ManagedMemoryResource()))
else:
    rmm.mr.set_current_device_resource(rmm.mr.CudaAsyncMemoryResource())
mr = rmm.mr.get_current_device_resource()
stream = DEFAULT_STREAM  # where cuDF and cuML allocate unless told otherwise


def replay(ops):
    held = {}
    count = 0
    t0 = time.perf_counter()
    for op in ops:
        if op > 0:
            held[count] = (mr.allocate(op, stream), op)
            count += 1
        else:
            ptr, size = held.pop(-op - 1)
            mr.deallocate(ptr, size, stream)
    stream.synchronize()
    elapsed = time.perf_counter() - t0
    for ptr, size in held.values():  # blocks the run kept past its end: freed, not timed
        mr.deallocate(ptr, size, stream)
    stream.synchronize()
    return elapsed


got = {}
for name, phases in traces.items():
    first = replay(phases["first"]["ops"])
    got[name] = {"first_s": first, "warm_s": [replay(phases["warm"]["ops"]) for _ in range(warm)]}
with open(out, "w") as f:
    json.dump({"replays": got, "resource": type(mr).__name__}, f)
'''


def measure(trace_way: tuple, setups: dict, rounds: int, scratch: str, run, rotating) -> dict:
    """Records the traces through ``trace_way`` ((argv before out.json and the scratch folder,
    argv after, env), as section 13's ways) and replays them under each of ``setups`` ({way:
    REPLAY_SCRIPT setup}) for ``rounds`` rotating rounds; ``run`` and ``rotating`` are section
    13's runners. Returns {"traces": {name: {phase: {"allocs", "dropped"}}}, "replays": {way:
    {name: {"first": ..., "warm": ...}}, or {"error"}}} or {"error": ...}."""
    os.makedirs(scratch, exist_ok=True)
    recorded_path = os.path.join(scratch, "recorded.json")
    before, after, env = trace_way
    got = run(before, after, {**env, "ASYNCMR_STACKS_TRACE": recorded_path},
              os.path.join(scratch, "traced"))
    if "error" in got:
        return {"error": f"tracing: {got['error']}"}
    with open(recorded_path) as f:
        traces = traces_from(json.load(f))
    traces_path = os.path.join(scratch, "traces.json")
    with open(traces_path, "w") as f:
        json.dump({n: {p: {"ops": t["ops"]} for p, t in ph.items()} for n, ph in traces.items()},
                  f)
    script = os.path.join(scratch, "replay.py")
    with open(script, "w") as f:
        f.write(REPLAY_SCRIPT)
    ways = {w: ([sys.executable, script], [traces_path, setup, str(WARM_REPLAYS)], {})
            for w, setup in setups.items()}
    replays = {}
    for w, answers in rotating(ways, rounds, scratch).items():
        if isinstance(answers, dict):
            replays[w] = answers
            continue
        replays[w] = {name: {
            "first": summarize([a["replays"][name]["first_s"] for a in answers], "s"),
            "warm": summarize([s for a in answers for s in a["replays"][name]["warm_s"]], "s")}
            for name in traces}
        replays[w]["resource"] = answers[-1].get("resource")
    return {"traces": {n: {p: {k: t[k] for k in ("allocs", "dropped")} for p, t in ph.items()}
                       for n, ph in traces.items()},
            "replays": replays}


def floor(replay_warm_s: float, run_warm_s: float) -> float:
    """The lowest ratio to a way's warm run that an allocator costing nothing could reach, if
    all else were equal: the run less its allocations' replay, over the run."""
    return 1.0 - replay_warm_s / run_warm_s


def show(title: str, share: dict, runs: dict) -> None:
    """Prints part c: ``share`` is measure()'s result, ``runs`` {way: {name: the way's own
    median run time, s}} from parts a / b."""
    if "error" in share:
        print(f"  {title}: {share['error']}")
        return
    rows = []
    for way, per in share["replays"].items():
        if "error" in per:
            rows.append([way, "-", "-", "-", "-", per["error"][:60]])
            continue
        for name, r in per.items():
            if name == "resource":
                continue
            trace = share["traces"][name]
            run_s = (runs.get(way) or {}).get(name)
            warm = r["warm"]["median_s"]
            rows.append([way, name, f"{trace['first']['allocs']}/{trace['warm']['allocs']}",
                         f"{r['first']['median_s'] * 1e3:.2f}", f"{warm * 1e3:.2f}",
                         f"{warm / run_s:.1%}" if run_s else "-"])
    print_table(title, ["way", "run", "allocs first/warm", "first replay ms", "warm replay ms",
                        "of the warm run"], rows)
    for name, phases in share["traces"].items():
        for phase, t in phases.items():
            if t["dropped"]:
                print(f"  {name}, {phase} run: the recording dropped {t['dropped']} events; "
                      "its replay holds only the allocations after them")


def warm_of(replays: dict, way: str, name: str):
    """The median warm replay of ``name`` under ``way``, s, or None."""
    r = (replays.get(way) or {}).get(name)
    return r["warm"]["median_s"] if isinstance(r, dict) and "warm" in r else None


__all__ = ["REPLAY_SCRIPT", "TRACE_HOOK", "WARM_REPLAYS", "floor", "measure", "show", "trace_ops",
           "traces_from", "warm_of"]

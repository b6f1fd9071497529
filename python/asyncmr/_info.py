# SPDX-License-Identifier: Apache-2.0
"""``python -m asyncmr info [--json]``: what each device and this build support, and the live
state of the default and current pools.

Device facts come from the CUDA runtime through ``cuda.bindings``; what is supported comes
from asyncmr itself: ``MemPool.default``/``current`` for every kind and location, and
``MemPool.create`` followed by ``close()`` for ``pool="new"`` (pools are created only to
answer that, and destroyed at once). Reading a pool's attributes changes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys

KINDS = ("device", "pinned", "managed")
CHOICES = ("default", "current", "new")
STATE = ("release_threshold", "reserved_mem_current", "reserved_mem_high", "used_mem_current",
         "used_mem_high")

# (JSON key, cudaDeviceAttr name); an attribute this cuda-bindings lacks is reported as None.
_DEVICE_ATTRIBUTES = (
    ("concurrent_managed_access", "cudaDevAttrConcurrentManagedAccess"),
    ("pageable_memory_access", "cudaDevAttrPageableMemoryAccess"),
    ("numa_id", "cudaDevAttrNumaId"),
    ("host_numa_id", "cudaDevAttrHostNumaId"),
    ("memory_pools_supported", "cudaDevAttrMemoryPoolsSupported"),
    ("host_memory_pools_supported", "cudaDevAttrHostMemoryPoolsSupported"),
    ("host_numa_memory_pools_supported", "cudaDevAttrHostNumaMemoryPoolsSupported"),
    ("memory_pool_supported_handle_types", "cudaDevAttrMemoryPoolSupportedHandleTypes"),
)
_FLAGS = {"concurrent_managed_access", "pageable_memory_access", "memory_pools_supported",
          "host_memory_pools_supported", "host_numa_memory_pools_supported"}


def _version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def _device_facts(ordinal: int) -> dict:
    from cuda.bindings import runtime

    def attribute(name):
        attr = getattr(runtime.cudaDeviceAttr, name, None)
        if attr is None:
            return None
        err, value = runtime.cudaDeviceGetAttribute(attr, ordinal)
        return int(value) if int(err) == 0 else None

    err, props = runtime.cudaGetDeviceProperties(ordinal)
    name = props.name.split(b"\0", 1)[0].decode() if int(err) == 0 else None
    major = attribute("cudaDevAttrComputeCapabilityMajor")
    minor = attribute("cudaDevAttrComputeCapabilityMinor")
    facts = {"ordinal": ordinal, "name": name, "compute_capability": f"{major}.{minor}"}
    for key, attr in _DEVICE_ATTRIBUTES:
        value = attribute(attr)
        facts[key] = bool(value) if key in _FLAGS and value is not None else value
    # The pool facts as asyncmr's own support decision reads them (by number where this
    # cuda-bindings does not name the attribute), so the report and the decision agree.
    from asyncmr._core import device_facts

    mine = device_facts(ordinal)
    for key, own in (("memory_pools_supported", "memory_pools"),
                     ("concurrent_managed_access", "concurrent_managed_access"),
                     ("host_memory_pools_supported", "host_memory_pools"),
                     ("host_numa_memory_pools_supported", "host_numa_memory_pools")):
        facts[key] = bool(mine[own])
    return facts


def _loc_name(loc) -> str:
    return loc.kind if loc.id is None else f"{loc.kind}({loc.id})"


def _locations(devices: list[dict]):
    from asyncmr import Location

    numa = sorted({d["host_numa_id"] for d in devices
                   if isinstance(d["host_numa_id"], int) and d["host_numa_id"] >= 0}) or [0]
    return ([Location.device(d["ordinal"]) for d in devices] + [Location.host()]
            + [Location.host_numa(n) for n in numa] + [Location.none()])


def _probe(loc, kind, choice):
    """(pool or None, path or None, reason or None) for one kind, location and pool choice:
    asyncmr's capability decision (and the path it takes to the pool), then the driver's own
    answer to obtaining (or creating and closing) that pool."""
    import asyncmr
    from asyncmr import MemPool

    try:
        path, reason = asyncmr.pool_support(loc, kind, choice)
        if path is None:
            return None, None, f"UnsupportedError: {reason}"
        if choice == "new":
            MemPool.create(loc, kind).close()
            return None, path, None
        return getattr(MemPool, choice)(loc, kind), path, None
    except (asyncmr.AsyncMRError, ValueError, MemoryError) as e:
        return None, None, f"{type(e).__name__}: {e}"


def _pool_state(pool) -> dict:
    attrs = pool.attributes
    return {key: getattr(attrs, key) for key in STATE}


def collect() -> dict:
    """Everything ``info`` reports, as plain data (what ``--json`` prints). Raises
    :class:`asyncmr.NoDeviceError` without a usable CUDA device."""
    import asyncmr

    count = asyncmr.device_count()
    try:
        from cuda.bindings import __version__ as bindings_version
    except ImportError:  # pragma: no cover - very old cuda-bindings
        bindings_version = None
    devices = [_device_facts(i) for i in range(count)]
    support, pools = [], []
    for kind in KINDS:
        for loc in _locations(devices):
            found = {}
            for choice in CHOICES:
                pool, path, reason = _probe(loc, kind, choice)
                found[choice] = pool
                support.append({"kind": kind, "location": _loc_name(loc), "pool": choice,
                                "supported": reason is None, "path": path, "reason": reason})
            default = found["default"]
            for choice in ("default", "current"):
                pool = found[choice]
                if pool is None:
                    continue
                pools.append({"kind": kind, "location": _loc_name(loc), "pool": choice,
                              "handle": pool.handle,
                              "is_default": default is not None and pool.handle == default.handle,
                              **_pool_state(pool)})
    return {
        "asyncmr": asyncmr.__version__,
        "usable": True,
        "driver_version": _version(asyncmr.driver_version()),
        "runtime_version": _version(asyncmr.runtime_version()),
        "cuda_bindings": bindings_version,
        "device_count": count,
        "devices": devices,
        "support": support,
        "pools": pools,
        "note": "pool='new' was probed by creating a pool and closing it at once",
    }


def _table(header, rows) -> list[str]:
    rows = [tuple("-" if c is None else str(c) for c in r) for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return lines


def _bytes(n: int) -> str:
    return "max" if n == 2**64 - 1 else f"{n:,}"


def _yes(flag):
    return None if flag is None else ("yes" if flag else "no")


def render(info: dict) -> str:
    """The readable report."""
    out = [f"asyncmr {info['asyncmr']}: driver {info['driver_version']}, runtime "
           f"{info['runtime_version']} (this build), cuda-bindings {info['cuda_bindings']}, "
           f"{info['device_count']} device(s)", "", "Devices"]
    out += _table(
        ("#", "name", "cc", "concurrent managed", "pageable access", "NUMA", "host NUMA",
         "pools", "host pools", "host NUMA pools"),
        [(d["ordinal"], d["name"], d["compute_capability"], _yes(d["concurrent_managed_access"]),
          _yes(d["pageable_memory_access"]), d["numa_id"], d["host_numa_id"],
          _yes(d["memory_pools_supported"]), _yes(d["host_memory_pools_supported"]),
          _yes(d["host_numa_memory_pools_supported"])) for d in info["devices"]])
    reasons: list[str] = []

    def cell(entry):
        if entry["supported"]:
            return "yes"
        if entry["reason"] not in reasons:
            reasons.append(entry["reason"])
        return f"no [{reasons.index(entry['reason']) + 1}]"

    by_key = {(e["kind"], e["location"], e["pool"]): e for e in info["support"]}
    keys = list(dict.fromkeys((e["kind"], e["location"]) for e in info["support"]))
    out += ["", "Supported by this build on this driver (pool choice)"]
    out += _table(("kind", "location", *CHOICES),
                  [(k, loc, *(cell(by_key[(k, loc, c)]) for c in CHOICES)) for k, loc in keys])
    out += [f"  [{i}] {r}" for i, r in enumerate(reasons, 1)]
    out += [f"  ({info['note']})", "", "Default and current pools, live (bytes)"]
    out += _table(
        ("kind", "location", "pool", "handle", "release threshold", "reserved", "reserved high",
         "used", "used high"),
        [(p["kind"], p["location"],
          p["pool"] if p["pool"] == "default" or not p["is_default"] else "current (= default)",
          f"{p['handle']:#x}", _bytes(p["release_threshold"]), f"{p['reserved_mem_current']:,}",
          f"{p['reserved_mem_high']:,}", f"{p['used_mem_current']:,}", f"{p['used_mem_high']:,}")
         for p in info["pools"]])
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    """``python -m asyncmr info``."""
    from asyncmr._cli import exit_statuses_epilog

    p = argparse.ArgumentParser(
        prog="python -m asyncmr info",
        description="Prints, per device, its name, compute capability, managed and pageable "
                    "memory access, NUMA nodes and pool support; for this build on this "
                    "driver, which pool kinds (device, pinned, managed), locations and pool "
                    "choices (default, current, new) work, the path asyncmr takes to each and, "
                    "for each that does not, the reason; and the live state of the default and "
                    "current pools. Pools are only read, except that pool='new' is tried by "
                    "creating a pool and closing it at once.",
        epilog=exit_statuses_epilog())
    p.add_argument("--json", action="store_true",
                   help="print the same as a JSON document, for machines (without a usable "
                        "device too: then \"usable\" is false and \"error\" says why)")
    return p


def main(argv: list[str] | None = None) -> int:
    import asyncmr
    from asyncmr._cli import EXIT_NO_GPU, EXIT_OK, reason

    args = parser().parse_args(argv)
    try:
        info = collect()
    except asyncmr.NoDeviceError as e:
        if args.json:
            # A script reading stdout gets a document either way, saying why there is no more.
            # The usable document's keys (the driver's version null when there is no driver).
            driver = asyncmr.driver_version()
            print(json.dumps({"asyncmr": asyncmr.__version__, "usable": False, "error": str(e),
                              "driver_version": _version(driver) if driver else None,
                              "runtime_version": _version(asyncmr.runtime_version()),
                              "device_count": 0, "devices": []}, indent=2))
        print(f"asyncmr info: no usable CUDA device: {reason(e)}", file=sys.stderr)
        return EXIT_NO_GPU
    print(json.dumps(info, indent=2) if args.json else render(info))
    return EXIT_OK

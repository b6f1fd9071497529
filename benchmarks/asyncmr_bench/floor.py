# SPDX-License-Identifier: Apache-2.0
"""The raw floor: two driver calls (``cudaMallocFromPoolAsync`` + ``cudaFreeAsync``) and
nothing else, from the benchmark's own C++ targets (``benchmarks/cpp``):

- ``pool_floor``, a program: the floor and the same pools through
  ``rmm::device_async_resource_ref``, in alternating rounds, as one JSON object;
- ``libasyncmr_floor.so``, a library loaded here with ctypes: the floor in this process, timed
  by section 1 in the same interleaved rounds as the Python resources;
- ``cache_bench``, a program (section 11): the front cache's hit pair through the reference
  against the uncached resource and the floor, the CUDA calls a hit makes, and threads.

All refuse to be compared against when built without optimization.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
from pathlib import Path

from .common import err_text

BUILD_DIR = Path("build/cpp/benchmarks/cpp")
FLOOR_BIN = "pool_floor"
FLOOR_LIB = "libasyncmr_floor.so"
CACHE_BIN = "cache_bench"
# benchmarks/asyncmr_bench/floor.py -> the checkout's root is two levels up.
CHECKOUT = Path(__file__).resolve().parents[2]

NOT_OPTIMIZED = ("was built without optimization; configure it with -DCMAKE_BUILD_TYPE=Release "
                 "(the default when none is given) and rebuild")
BUILD_HINT = ("build it with: cmake -S . -B build/cpp -DASYNCMR_BUILD_PYTHON=OFF "
              "-DASYNCMR_BUILD_BENCHMARKS=ON ... && cmake --build build/cpp")


def _default_places(name: str) -> list:
    return [Path.cwd() / BUILD_DIR / name, CHECKOUT / BUILD_DIR / name]


def _find(explicit, env_var: str, fallback, *, program: bool = True):
    """(the first usable path or None, the places looked at): ``explicit`` (a command-line
    option), else ``$env_var``, else the places ``fallback()`` gives. A program must be
    executable; a library must only exist."""
    if explicit:
        candidates = [Path(explicit)]
    elif os.environ.get(env_var):
        candidates = [Path(os.environ[env_var])]
    else:
        candidates = fallback()
    for c in candidates:
        if c.is_file() and (not program or os.access(c, os.X_OK)):
            return c, candidates
    return None, candidates


def _beside_floor(cfg, name: str) -> list:
    """``name`` next to the pool_floor program (as given, and as found), so --floor-bin alone
    finds every C++ target; then the default build folder under the working directory and the
    checkout."""
    places = []
    if cfg.floor_bin:
        places.append(Path(cfg.floor_bin).parent / name)
    floor_bin, _ = find_floor_bin(cfg)
    if floor_bin is not None and floor_bin.parent / name not in places:
        places.append(floor_bin.parent / name)
    return places + [p for p in _default_places(name) if p not in places]


def find_floor_bin(cfg):
    """(the pool_floor program or None, the places looked at): --floor-bin,
    $ASYNCMR_FLOOR_BIN, else the default build folders."""
    return _find(cfg.floor_bin, "ASYNCMR_FLOOR_BIN", lambda: _default_places(FLOOR_BIN))


def find_floor_lib(cfg):
    """(libasyncmr_floor.so or None, the places looked at): --floor-lib, $ASYNCMR_FLOOR_LIB,
    else next to the pool_floor program, else the default build folders."""
    return _find(getattr(cfg, "floor_lib", None), "ASYNCMR_FLOOR_LIB",
                 lambda: _beside_floor(cfg, FLOOR_LIB), program=False)


def find_cache_bin(cfg):
    """(the cache_bench program or None, the places looked at): --cache-bin,
    $ASYNCMR_CACHE_BIN, else next to the pool_floor program, else the default build
    folders."""
    return _find(getattr(cfg, "cache_bin", None), "ASYNCMR_CACHE_BIN",
                 lambda: _beside_floor(cfg, CACHE_BIN))


def _last_json(stdout: str):
    for line in reversed(stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


def _run_program(path, cmd: list, name: str, required: str) -> dict:
    """Runs a C++ benchmark program and returns its JSON document, or {"error": why}: it did
    not run, exited non-zero, printed no document with ``required``, or was built without
    optimization (an -O0 program times the compiler, not the library: nothing is drawn from
    it)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": err_text(e), "command": cmd}
    parsed = _last_json(proc.stdout)
    if proc.returncode != 0 or not isinstance(parsed, dict) or required not in parsed:
        return {"error": f"{name} exited {proc.returncode}: " +
                (proc.stderr.strip()[-2000:] or proc.stdout.strip()[-2000:]),
                "command": cmd, "output": parsed}
    parsed["command"] = cmd
    if parsed.get("meta", {}).get("optimized") is not True:
        return {"error": f"{path} {NOT_OPTIMIZED}", "command": cmd, "output": parsed}
    return parsed


def run_cache_bench(cfg, sizes, cache_bytes: int) -> dict:
    """Runs the C++ cache_bench program (section 11) and returns its JSON, or
    ``{"skipped"|"error": why}``."""
    if cfg.no_floor:
        return {"skipped": "--no-floor (no C++ benchmark program runs)"}
    path, looked = find_cache_bin(cfg)
    if path is None:
        return {"skipped": f"no {CACHE_BIN} program (looked at: " +
                ", ".join(str(p) for p in looked) + f"); {BUILD_HINT}, or pass --cache-bin PATH"}
    cmd = [str(path), "--sizes", ",".join(str(s) for s in sizes), "--cache", str(cache_bytes)]
    if cfg.quick:
        cmd.append("--quick")
    return _run_program(path, cmd, CACHE_BIN, "pairs")


def run_floor(cfg) -> dict:
    """Runs the C++ floor program and returns its JSON (or why there is none)."""
    if cfg.no_floor:
        return {"skipped": "--no-floor"}
    path, looked = find_floor_bin(cfg)
    if path is None:
        return {"skipped": "no pool_floor program (looked at: " +
                ", ".join(str(p) for p in looked) + f"); {BUILD_HINT}, or pass --floor-bin PATH"}
    cmd = [str(path), "--sizes", ",".join(str(s) for s in cfg.sizes)]
    if cfg.quick:
        cmd.append("--quick")
    return _run_program(path, cmd, "pool_floor", "floor")


class FloorLibrary:
    """``libasyncmr_floor.so`` through ctypes.

    Its loop runs with the GIL released (ctypes releases it around every foreign call) and
    times itself with the steady clock, so Python adds nothing to the number.
    """

    def __init__(self, path, device: int = 0):
        self.path = Path(path)
        self.device = device
        lib = ctypes.CDLL(str(self.path))
        lib.asyncmr_floor_pairs.argtypes = [
            ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64,
            ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_char_p)]
        lib.asyncmr_floor_pairs.restype = ctypes.c_int
        lib.asyncmr_floor_optimized.argtypes = []
        lib.asyncmr_floor_optimized.restype = ctypes.c_int
        lib.asyncmr_floor_error_name.argtypes = [ctypes.c_int]
        lib.asyncmr_floor_error_name.restype = ctypes.c_char_p
        self._lib = lib

    @property
    def optimized(self) -> bool:
        return bool(self._lib.asyncmr_floor_optimized())

    def pairs(self, pool_handle: int, stream_handle: int, nbytes: int, pairs: int) -> int:
        """Nanoseconds of ``pairs`` alloc+free pairs of ``nbytes`` bytes on the pool and stream
        (both as integer handles); RuntimeError naming the failed call and CUDA error."""
        if not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
        if not isinstance(pairs, int) or pairs <= 0:
            raise ValueError(f"pairs must be a positive int, got {pairs!r}")
        if not pool_handle:
            raise ValueError("pool handle is 0")
        elapsed = ctypes.c_int64(0)
        call = ctypes.c_char_p()
        err = self._lib.asyncmr_floor_pairs(self.device, pool_handle, stream_handle or None,
                                            nbytes, pairs, ctypes.byref(elapsed),
                                            ctypes.byref(call))
        if err != 0:
            name = self._lib.asyncmr_floor_error_name(err) or b"?"
            what = call.value.decode() if call.value else "asyncmr_floor_pairs"
            raise RuntimeError(f"{what} failed: {name.decode()} ({err}) [{self.path.name}]")
        return elapsed.value


def load_floor_library(cfg):
    """(FloorLibrary, None) or (None, {"skipped"|"error": why}) for the in-process floor."""
    if cfg.no_floor:
        return None, {"skipped": "--no-floor"}
    path, looked = find_floor_lib(cfg)
    if path is None:
        return None, {"skipped": f"no {FLOOR_LIB} (looked at: " +
                      ", ".join(str(p) for p in looked) + f"); {BUILD_HINT}, or pass "
                      "--floor-lib PATH"}
    try:
        lib = FloorLibrary(path)
    except OSError as e:
        return None, {"error": f"cannot load {path}: {err_text(e)}"}
    if not lib.optimized:
        return None, {"error": f"{path} {NOT_OPTIMIZED}", "library": str(path)}
    return lib, None

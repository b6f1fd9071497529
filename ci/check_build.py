#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails when a finished CMake/Ninja build used a CUDA toolkit instead of the PyPI wheels.

    ci/check_build.py BUILD_DIR --cuda 12|13 [--nvcc-from-wheel]

Reads what the compiler and linker actually touched: every header each object depends on
(``ninja -t deps``), every command (``ninja -t commands``) and the CMake cache. Fails if any
of them resolves into /usr/local/cuda or a directory in ASYNCMR_HIDDEN_TOOLKITS
(ci/no_toolkit.sh); and unless cuda_runtime_api.h, crt/host_defines.h and libcudart_static.a
resolve into the CUDA runtime wheels of that major (13: nvidia/cu13; 12: nvidia/cuda_runtime
with crt/ from nvidia/cuda_nvcc). With --nvcc-from-wheel, an nvcc in the commands must be
the nvidia-cuda-nvcc wheel's. So it catches a build that found a toolkit through a path CMake
was not told to ignore, and one that picked the other CUDA major's wheel.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys

WHEEL = {
    "13": {"runtime": "/nvidia/cu13/include/", "crt": "/nvidia/cu13/include/crt/",
           "lib": "/nvidia/cu13/lib/"},
    "12": {"runtime": "/nvidia/cuda_runtime/include/", "crt": "/nvidia/cuda_nvcc/include/crt/",
           "lib": "/nvidia/cuda_runtime/lib/"},
}
# The ignore list itself names the toolkit; it is not a use of it.
IGNORED_CACHE_KEYS = ("CMAKE_IGNORE_PATH", "CMAKE_IGNORE_PREFIX_PATH",
                      "CMAKE_SYSTEM_IGNORE_PATH", "CMAKE_SYSTEM_IGNORE_PREFIX_PATH",
                      # FindCUDAToolkit looks for compute-sanitizer's library wherever a toolkit
                      # is installed (a GPU host has one); nothing links it, which the command
                      # check below would show.
                      "CUDA_sanitizer_LIBRARY")


def ninja(build_dir, *tool):
    return subprocess.run(["ninja", "-C", build_dir, "-t", *tool], check=True,
                          capture_output=True, text=True).stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build_dir")
    ap.add_argument("--cuda", required=True, choices=sorted(WHEEL))
    ap.add_argument("--nvcc-from-wheel", action="store_true")
    args = ap.parse_args()

    forbidden = ["/usr/local/cuda"] + os.environ.get("ASYNCMR_HIDDEN_TOOLKITS", "").split()
    deps = {line.strip() for line in ninja(args.build_dir, "deps").splitlines()
            if line.startswith("    ")}
    commands = ninja(args.build_dir, "commands").splitlines()
    with open(os.path.join(args.build_dir, "CMakeCache.txt")) as f:
        cache = [line.rstrip("\n") for line in f
                 if not line.startswith(("#", "//")) and not line.startswith(IGNORED_CACHE_KEYS)]

    problems = []

    def real(path):  # commands run in the build directory
        return os.path.realpath(os.path.join(args.build_dir, path))

    def bad(path):
        return any(p and (path.startswith(p) or real(path).startswith(p)) for p in forbidden)

    problems += [f"header from a toolkit: {d} -> {real(d)}" for d in deps if bad(d)]
    for cmd in commands:
        for token in shlex.split(cmd):
            for piece in re.split(r"[=;,:]", token):
                if piece.startswith("/") and bad(piece):
                    problems.append(f"command uses a toolkit path {piece}: {cmd[:200]}")
    problems += [f"CMake cache names a toolkit: {line}" for line in cache
                 if any(p and p in line for p in forbidden)]

    want = WHEEL[args.cuda]

    def resolved(suffix):
        return sorted({real(d) for d in deps if d.endswith(suffix)})

    runtime_h, crt_h = resolved("/cuda_runtime_api.h"), resolved("/crt/host_defines.h")
    cudart = sorted({real(p) for cmd in commands for p in shlex.split(cmd)
                     if p.endswith("libcudart_static.a")})
    for what, found, where in (("cuda_runtime_api.h", runtime_h, want["runtime"]),
                               ("crt/host_defines.h", crt_h, want["crt"]),
                               ("libcudart_static.a", cudart, want["lib"])):
        if not found:
            problems.append(f"no {what} in the build at all")
        problems += [f"{what} not from the CUDA {args.cuda} wheel ({where}): {p}"
                     for p in found if where not in p]
    nvcc = sorted({real(p) for cmd in commands for p in shlex.split(cmd)
                   if p.endswith("/nvcc")})
    if args.nvcc_from_wheel:
        if not nvcc:
            problems.append("no nvcc command in the build")
        problems += [f"nvcc not from the nvidia-cuda-nvcc wheel: {p}" for p in nvcc
                     if "/nvidia/cu13/bin/" not in p]

    if problems:
        print(f"check_build: {args.build_dir}: {len(problems)} problem(s)")
        for p in problems[:40]:
            print("  " + p)
        return 1
    print(f"check_build: {args.build_dir}: CUDA {args.cuda} from the wheels "
          f"({runtime_h[0]}, {cudart[0]}){', nvcc ' + nvcc[0] if nvcc else ''}; "
          f"{len(deps)} headers and {len(commands)} commands, none from "
          f"{' or '.join(p for p in forbidden if p)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

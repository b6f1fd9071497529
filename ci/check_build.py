#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails when a finished CMake/Ninja build used a CUDA toolkit instead of the PyPI wheels, or
when libasyncmr.so or the installed package is not linked as one shared library.

    ci/check_build.py BUILD_DIR --cuda 12|13 [--nvcc-from-wheel] [--package DIR]

Reads what the compiler and linker actually touched: every header each object depends on
(``ninja -t deps``), every command (``ninja -t commands``) and the CMake cache. Fails if any
of them resolves into /usr/local/cuda or a directory in ASYNCMR_HIDDEN_TOOLKITS
(ci/no_toolkit.sh); and unless cuda_runtime_api.h, crt/host_defines.h and libcudart_static.a
resolve into the CUDA runtime wheels of that major (13: nvidia/cu13; 12: nvidia/cuda_runtime
with crt/ from nvidia/cuda_nvcc). With --nvcc-from-wheel, an nvcc in the commands must be
the nvidia-cuda-nvcc wheel's. So it catches a build that found a toolkit through a path CMake
was not told to ignore, and one that picked the other CUDA major's wheel.

The libasyncmr.so the build made (when it made one) must hold the static runtime and keep it to
itself: linked with libcudart_static.a, nothing of the runtime undefined, exported or needed
(libcudart.so, libcuda.so), and every symbol it exports names asyncmr. With --package, the same
holds for the installed package's library (DIR: site-packages/asyncmr), which must be its one
libasyncmr.so, at DIR/lib/; and every extension module of the package, wherever it is in the
package, needs it once, finds it there through a RUNPATH relative to itself ($ORIGIN/lib at the
top, $ORIGIN/../lib in asyncmr/_core/; as `ldd` resolves it), calls into it (asyncmr symbols
undefined) and exports none of its own: a process then holds one copy of asyncmr's registries.
Uses readelf, nm and ldd (binutils and glibc).
"""

import argparse
import importlib.machinery
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


LIBRARY = "libasyncmr.so"
# What the static CUDA runtime defines: none of it may be left undefined, or exported.
CUDART = re.compile(r"^(cuda|__cuda|__cudart)")


def output_of(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def needed_and_runpath(path):
    """(DT_NEEDED names, DT_RUNPATH or DT_RPATH entries) of the ELF file at `path`."""
    needed, runpath = [], []
    for line in output_of("readelf", "-d", "-W", path).splitlines():
        m = re.search(r"\((NEEDED|RUNPATH|RPATH)\).*\[(.*)\]", line)
        if m and m.group(1) == "NEEDED":
            needed.append(m.group(2))
        elif m:
            runpath += m.group(2).split(":")
    return needed, runpath


def dynamic_symbols(path, which):
    """The demangled names of the dynamic symbols of `path`, `which`: "defined"/"undefined"."""
    out = output_of("nm", "-D", "-C", f"--{which}-only", path)
    return [m.group(1) for line in out.splitlines()
            if (m := re.match(r"^\s*(?:[0-9a-fA-F]+\s+)?[A-Za-z]\s+(.+)$", line))]


def library_problems(path):
    """What is wrong with the libasyncmr.so at `path`: a runtime not its own, or exports beyond
    asyncmr's."""
    problems = []
    needed, _ = needed_and_runpath(path)
    problems += [f"{path} needs {n}: the CUDA runtime must be linked in statically"
                 for n in needed if n.startswith(("libcudart", "libcuda."))]
    undefined = [s for s in dynamic_symbols(path, "undefined") if CUDART.match(s)]
    problems += [f"{path} leaves CUDA runtime symbols undefined: {', '.join(undefined[:5])}"
                 ] if undefined else []
    foreign = [s for s in dynamic_symbols(path, "defined") if "asyncmr::" not in s]
    problems += [f"{path} exports symbols that are not asyncmr's (the static runtime's, or a "
                 f"dependency's): {', '.join(foreign[:5])}"] if foreign else []
    return problems


def package_problems(package):
    """What is wrong with the installed package at `package` (site-packages/asyncmr); prints
    what each extension module resolves libasyncmr.so to."""
    package = os.path.realpath(package)
    library = os.path.join(package, "lib", LIBRARY)
    problems = []
    libraries = sorted(os.path.join(d, f) for d, _, files in os.walk(package) for f in files
                       if f.startswith("libasyncmr.") and f.endswith((".so", ".a")))
    if libraries != [library]:
        problems.append(f"the package must hold one {LIBRARY}, at {library}; it holds "
                        f"{libraries or 'none'}")
    if os.path.isfile(library):
        problems += library_problems(library)
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    extensions = sorted(os.path.join(d, f) for d, _, files in os.walk(package) for f in files
                        if f.endswith(suffixes) and not f.startswith("lib"))
    if not extensions:
        problems.append(f"no extension modules in {package}")
    for ext in extensions:
        name = os.path.relpath(ext, package)
        needed, runpath = needed_and_runpath(ext)
        if needed.count(LIBRARY) != 1:
            problems.append(f"{name} needs {LIBRARY} {needed.count(LIBRARY)} times, not once")
        expected = "$ORIGIN/" + os.path.relpath(os.path.dirname(library), os.path.dirname(ext))
        if runpath != [expected]:
            problems.append(f"{name}: RUNPATH {runpath}, not ['{expected}'] (nothing of the "
                            f"build machine may leak into an installed file)")
        # "libasyncmr.so => /path/libasyncmr.so (0x...)" or "libasyncmr.so => not found"
        resolved = [line.split("=>", 1)[1].split(" (")[0].strip()
                    for line in output_of("ldd", ext).splitlines()
                    if line.split()[:2] == [LIBRARY, "=>"]]
        print(f"  ldd {name}: {LIBRARY} => {', '.join(resolved) or 'not needed'}")
        if [os.path.realpath(r) for r in resolved] != [library]:
            problems.append(f"{name}: ldd resolves {LIBRARY} to {resolved}, not {library}")
        if not any("asyncmr::" in s for s in dynamic_symbols(ext, "undefined")):
            problems.append(f"{name} calls nothing of {LIBRARY}: it carries a copy of its own")
        exported = [s for s in dynamic_symbols(ext, "defined") if "asyncmr::" in s]
        if exported:
            problems.append(f"{name} exports asyncmr symbols of its own: {', '.join(exported[:5])}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build_dir")
    ap.add_argument("--cuda", required=True, choices=sorted(WHEEL))
    ap.add_argument("--nvcc-from-wheel", action="store_true")
    ap.add_argument("--package", help="the installed asyncmr package directory to check too")
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

    built = os.path.join(args.build_dir, LIBRARY)
    if os.path.isfile(built):
        problems += library_problems(built)
        links = [cmd for cmd in commands if re.search(rf"-o {re.escape(LIBRARY)}(\s|$)", cmd)]
        if not any(want["lib"] in real(p) for cmd in links for p in shlex.split(cmd)
                   if p.endswith("libcudart_static.a")):
            problems.append(f"{LIBRARY} is not linked with the wheel's libcudart_static.a")
    if args.package:
        problems += package_problems(args.package)

    if problems:
        print(f"check_build: {args.build_dir}: {len(problems)} problem(s)")
        for p in problems[:40]:
            print("  " + p)
        return 1
    print(f"check_build: {args.build_dir}: CUDA {args.cuda} from the wheels "
          f"({runtime_h[0]}, {cudart[0]}){', nvcc ' + nvcc[0] if nvcc else ''}; "
          f"{len(deps)} headers and {len(commands)} commands, none from "
          f"{' or '.join(p for p in forbidden if p)}"
          f"{'; ' + LIBRARY + ' holds the runtime' if os.path.isfile(built) else ''}"
          f"{'; the package links one ' + LIBRARY if args.package else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

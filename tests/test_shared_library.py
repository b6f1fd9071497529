# SPDX-License-Identifier: Apache-2.0
"""The installed package links one shared C++ library: every extension module needs
libasyncmr.so and finds the package's own copy through its RUNPATH, a process that imported them
maps that one file, and the state the asyncmr._core modules act on is that library's. So the
registries of pools and front caches exist once per process, whichever extension a call comes
through."""

import contextlib
import ctypes
import importlib.machinery
import os
import struct
import sys

import asyncmr

PACKAGE = os.path.dirname(os.path.realpath(asyncmr.__file__))
LIBRARY = os.path.join(PACKAGE, "lib", "libasyncmr.so")
NAME = "libasyncmr.so"


def _dynamic_entries(path):
    """(DT_NEEDED names, DT_RUNPATH and DT_RPATH entries) of the 64-bit little-endian ELF file
    at ``path``, from its section headers."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:6] == b"\x7fELF\x02\x01", f"{path}: not a 64-bit little-endian ELF file"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, addralign, entsize
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    dynamic = next(s for s in sections if s[1] == 6)  # SHT_DYNAMIC
    strings = sections[dynamic[6]][4]  # the offset of the string table it links

    def string(offset):
        start = strings + offset
        return data[start:data.index(b"\0", start)].decode()

    needed, runpath = [], []
    for i in range(dynamic[5] // 16):
        tag, value = struct.unpack_from("<qQ", data, dynamic[4] + 16 * i)
        if tag == 0:  # DT_NULL
            break
        if tag == 1:  # DT_NEEDED
            needed.append(string(value))
        elif tag in (15, 29):  # DT_RPATH, DT_RUNPATH
            runpath += string(value).split(":")
    return needed, runpath


def _extension_modules():
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return sorted(os.path.join(d, f) for d, _, files in os.walk(PACKAGE) for f in files
                  if f.endswith(suffixes) and not f.startswith("lib"))


def test_the_package_holds_one_libasyncmr_and_every_extension_finds_it():
    libraries = sorted(os.path.join(d, f) for d, _, files in os.walk(PACKAGE) for f in files
                       if f.startswith("libasyncmr."))
    assert libraries == [LIBRARY]
    extensions = _extension_modules()
    # Every compiled part asyncmr._core imports is among them (checked below), in its
    # subdirectory: a RUNPATH right for the package's top level would not find the library.
    parts = {os.path.realpath(m.__file__) for name, m in sys.modules.items()
             if name.startswith("asyncmr._core.")}
    assert parts and parts <= set(extensions), (parts, extensions)
    for ext in extensions:
        needed, runpath = _dynamic_entries(ext)
        assert needed.count(NAME) == 1, (ext, needed)
        # The loader's search: the first RUNPATH entry that holds the library.
        found = [os.path.join(p.replace("$ORIGIN", os.path.dirname(ext)), NAME) for p in runpath]
        found = [f for f in found if os.path.exists(f)]
        assert found and os.path.realpath(found[0]) == LIBRARY, (ext, runpath)
    needed, _ = _dynamic_entries(LIBRARY)
    assert not [n for n in needed if n.startswith(("libcudart", "libcuda."))], (
        f"{NAME} must hold its CUDA runtime, statically: it needs {needed}")


def test_a_process_maps_one_libasyncmr_whatever_it_imports():
    import asyncmr._core  # noqa: F401

    with contextlib.suppress(ImportError):
        import asyncmr.cudf  # noqa: F401  (asyncmr._cudf, where this build has it)
    with open("/proc/self/maps") as f:
        mapped = {line.split()[-1] for line in f if line.rstrip().endswith("/" + NAME)}
    assert {os.path.realpath(m) for m in mapped} == {LIBRARY}, mapped


def test_the_state_core_acts_on_is_the_shared_librarys(gpu):
    # The driver version asyncmr acts as if it had is process-wide state of the library. Set
    # through the library itself (its exported C++ function), asyncmr._core reports it: its
    # modules carry no state of their own. (dlopen of the path returns the library already loaded.)
    library = ctypes.CDLL(LIBRARY)
    set_driver_version = library["_ZN7asyncmr7testing18set_driver_versionEi"]  # (int)
    set_driver_version.argtypes, set_driver_version.restype = [ctypes.c_int], None
    real = asyncmr.driver_version()
    fake = 12090 if real != 12090 else 12080
    set_driver_version(fake)
    try:
        assert asyncmr.driver_version() == fake
    finally:
        set_driver_version(0)
    assert asyncmr.driver_version() == real

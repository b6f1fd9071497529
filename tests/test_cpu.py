# SPDX-License-Identifier: Apache-2.0
"""What a machine without a GPU can check: import, class hierarchy, validation, messages."""

import enum
import os
import re
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import rmm

import asyncmr
from asyncmr import AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR, Location, MemPool

RESOURCES = [AsyncManagedMR, AsyncPinnedMR, AsyncDeviceMR]


@pytest.mark.parametrize("cls", RESOURCES)
def test_resources_are_rmm_resources(cls):
    assert issubclass(cls, rmm.mr.DeviceMemoryResource)


def test_errors_are_runtime_errors():
    for exc in (asyncmr.NoDeviceError, asyncmr.UnsupportedError, asyncmr.PoolClosedError,
                asyncmr.CUDAError):
        assert issubclass(exc, asyncmr.AsyncMRError)
        assert issubclass(exc, RuntimeError)


def test_runtime_version_is_the_build_toolkit():
    assert asyncmr.runtime_version() >= 12060


def test_mempool_cannot_be_built_directly():
    with pytest.raises(TypeError, match="MemPool.default"):
        MemPool()
    # Nor by skipping __init__: every use names the problem (not SystemError).
    bare = MemPool.__new__(MemPool)
    for use in (lambda: bare.handle, lambda: bare.closed, bare.close):
        with pytest.raises(TypeError, match="MemPool.__new__ made an empty MemPool"):
            use()


def test_the_resources_shared_base_cannot_be_built_empty():
    # An instance with no C++ resource behind it crashed the interpreter at its first use
    # (trim_to, cache_info, allocate: a null dereference; RMM's DeviceBuffer: an abort).
    from asyncmr._core import _PoolResource

    class Mine(_PoolResource):
        pass

    for make in (_PoolResource, lambda: _PoolResource.__new__(_PoolResource), Mine,
                 lambda: Mine.__new__(Mine)):
        with pytest.raises(TypeError, match="AsyncManagedMR, AsyncPinnedMR or AsyncDeviceMR"):
            make()


@pytest.mark.parametrize("cls", RESOURCES)
def test_a_subclass_of_a_resource_is_built_as_the_resource(no_gpu, cls):
    class Mine(cls):
        pass

    with pytest.raises(asyncmr.NoDeviceError):  # the resource's own path, not the guard's
        Mine()


def test_attribute_table_matches_the_driver_enum():
    names = [row.name for row in asyncmr.attribute_table]
    assert len(names) == len(set(names)) == 14
    assert [row.cuda_value for row in asyncmr.attribute_table] == list(range(1, 15))
    assert {row.access for row in asyncmr.attribute_table} == {
        "read_only", "read_write", "reset_only"}
    settable = {r.name for r in asyncmr.attribute_table if r.access == "read_write"}
    assert settable == {"release_threshold", "reuse_follow_event_dependencies",
                        "reuse_allow_opportunistic", "reuse_allow_internal_dependencies"}
    assert {r.name for r in asyncmr.attribute_table if r.access == "reset_only"} == {
        "used_mem_high", "reserved_mem_high"}
    assert all(r.min_driver == 13020 for r in asyncmr.attribute_table if r.cuda_value > 8)


def test_every_table_row_is_a_property():
    for row in asyncmr.attribute_table:
        assert isinstance(getattr(asyncmr.PoolAttributes, row.name), property)


_RESET = (r"^pool attribute '\w+' must be the int 0 \(a high-water mark can only be reset\), "
          r"got ")


@pytest.mark.parametrize("name, value, exc, match", [
    ("reuse_allow_opportunistic", 1.0, TypeError, "must be a bool, got float"),
    ("reuse_follow_event_dependencies", 0.0, TypeError, "must be a bool, got float"),
    ("reuse_allow_internal_dependencies", "yes", TypeError, "must be a bool, got str"),
    ("release_threshold", 1.5, TypeError, "release_threshold must be an int number of bytes"),
    # A watermark is reset by the int 0: a value of another type, 0 as it may be, is a TypeError.
    ("used_mem_high", 0.0, TypeError, _RESET + "float$"),
    ("reserved_mem_high", False, TypeError, _RESET + "bool$"),
    ("used_mem_high", "0", TypeError, _RESET + "str$"),
    ("reserved_mem_high", None, TypeError, _RESET + "NoneType$"),
    ("used_mem_high", b"0", TypeError, _RESET + "bytes$"),
])
def test_a_pool_attribute_of_the_wrong_type_is_refused_before_the_pool_is_touched(
        name, value, exc, match):
    # The checks run before the pool is asked anything: here there is none to ask.
    attributes = asyncmr.PoolAttributes(None)
    with pytest.raises(exc, match=match):
        setattr(attributes, name, value)


def test_location_constructors():
    assert Location.device(1) == ("device", 1)
    assert Location.host() == ("host", None)
    assert Location.host_numa(0) == ("host_numa", 0)
    assert Location.host_numa_current().kind == "host_numa_current"
    assert Location.none().kind == "none"
    assert repr(Location.device(2)) == "Location.device(2)"
    assert Location.host().is_host and not Location.device(0).is_host


@pytest.mark.parametrize("loc", [Location("host", 3), Location("host", 0),
                                 Location("host_numa_current", 1), Location("none", 0)])
def test_a_location_with_an_id_its_kind_takes_none_is_refused(loc):
    # Location("host", 3) is not NUMA node 3: where a Location is used, an id its kind does not
    # take is refused with ValueError naming it, before the device is looked for (it was
    # dropped: a plain host pool, a prefetch to any host node).
    match = rf"a {loc.kind} location takes no id, got {loc.id}"
    calls = [lambda: asyncmr.pool_support(loc, "managed"),
             lambda: MemPool.default(loc, "managed"),
             lambda: MemPool.create(loc, "managed"),
             lambda: AsyncManagedMR(location=loc)]
    if loc.is_host:
        calls += [lambda: asyncmr.prefetch((4096, 16), to=loc),
                  lambda: AsyncManagedMR(prefetch=loc)]
    for call in calls:
        with pytest.raises(ValueError, match=match):
            call()


@pytest.mark.parametrize("kind", [asyncmr.LocationKind.device, asyncmr.LocationKind.host, 1,
                                  b"device", None])
def test_a_location_whose_kind_is_not_a_str_is_refused_with_type_error(kind):
    # Location(LocationKind.device, 0) is not equal to Location.device(0) (a NamedTuple of an
    # enum member, not of its name), so it is not taken as one: it was "ValueError: unknown
    # location kind <LocationKind.device: 1>", a wrong type named as a wrong value.
    loc = Location(kind, 0)
    for call in (lambda: asyncmr.pool_support(loc, "managed"),
                 lambda: MemPool.create(loc, "managed"),
                 lambda: AsyncManagedMR(location=loc)):
        with pytest.raises(TypeError, match=r"a location's kind must be a str \(one of "):
            call()


@pytest.mark.parametrize("loc", [Location.device(1), Location.host(), Location.host_numa(2),
                                 Location.host_numa_current(), Location.none(),
                                 Location("host", 3), Location("none", 0), Location("device"),
                                 Location("device", True), Location("moon", 1),
                                 Location("host_numa", asyncmr.LocationKind.host)])
def test_a_location_repr_names_what_it_holds(loc):
    # The repr evaluates to an equal Location: one the class methods make shows as their call,
    # any other as its fields (Location("host", 3) was shown as Location.host(), which it is not
    # equal to).
    again = eval(repr(loc), {"Location": Location, "LocationKind": asyncmr.LocationKind})
    assert again == loc and type(again.id) is type(loc.id)


def test_a_location_the_class_methods_do_not_make_is_shown_by_its_fields():
    assert repr(Location("host", 3)) == "Location(kind='host', id=3)"
    assert repr(Location("device")) == "Location(kind='device', id=None)"
    assert repr(Location.host_numa(2)) == "Location.host_numa(2)"


class _Theirs:
    class Location(NamedTuple):
        """Another library's location type, of the same name and fields as asyncmr's."""
        kind: str
        id: int | None = None


@pytest.mark.parametrize("call, exc, match", [
    (lambda: Location.device(-1), ValueError, "device ordinal must be in"),
    (lambda: Location.device("0"), TypeError, "device ordinal must be an int"),
    (lambda: Location.host_numa(-2), ValueError, "NUMA node must be in"),
    (lambda: AsyncManagedMR(pool="bogus"), ValueError, "pool must be 'default'"),
    (lambda: AsyncManagedMR(pool=1.5), TypeError, "pool must be"),
    (lambda: AsyncManagedMR(pool=0), ValueError, "pool handle must be a non-zero"),
    (lambda: AsyncManagedMR(pool=-5), ValueError, "pool handle"),
    (lambda: AsyncManagedMR(device=-1), ValueError, "device must be in"),
    (lambda: AsyncManagedMR(device=True), TypeError, "device must be an int"),
    (lambda: AsyncManagedMR(location="host"), TypeError, "location must be an asyncmr.Location"),
    (lambda: AsyncManagedMR(location=Location("moon", 1)), ValueError, "unknown location kind"),
    (lambda: AsyncManagedMR(release_threshold=-1), ValueError, "release_threshold must be in"),
    (lambda: AsyncManagedMR(release_threshold=2**64), ValueError, "release_threshold"),
    (lambda: AsyncManagedMR(release_threshold="1GB"), TypeError, "release_threshold must be an int"),
    (lambda: AsyncPinnedMR(numa_node=-1), ValueError, "numa_node: NUMA node must be in"),
    (lambda: AsyncPinnedMR(accessible_from="some"), ValueError, "accessible_from must be 'all'"),
    (lambda: AsyncPinnedMR(accessible_from=[0, -1]), ValueError, "accessible_from device"),
    (lambda: AsyncPinnedMR(accessible_from=3.0), TypeError, "accessible_from must be"),
    (lambda: AsyncPinnedMR(pool=None), TypeError, "pool must be"),
    (lambda: AsyncDeviceMR(release_threshold=True), TypeError, "release_threshold"),
    (lambda: AsyncDeviceMR(1, 2), TypeError, "positional"),
    (lambda: MemPool.default(Location.host(), "shared"), ValueError, "unknown allocation_type"),
    (lambda: MemPool.default("host", "pinned"), TypeError, "location must be"),
    (lambda: MemPool.create(Location.host(), "pinned", max_size=-1), ValueError, "max_size"),
    # cudaMemPoolCreate refuses any max_size for managed memory (docs/DRIVER_FACTS.md): said
    # before the driver is looked for, whatever the location.
    (lambda: MemPool.create(Location.device(0), "managed", max_size=64 << 20), ValueError,
     "managed pools cannot be bounded: .*leave max_size at 0"),
    (lambda: MemPool.create(Location.host(), asyncmr.AllocationType.managed,
                            max_size=np.uint64(1)), ValueError, "managed pools cannot be bounded"),
    (lambda: MemPool.create(Location.device(0), "managed", max_size="1"), TypeError,
     "max_size must be an int number of bytes, got str"),
    (lambda: MemPool.create(Location.host(), "pinned", export_handle_types=-1), ValueError,
     "export_handle_types must be in"),
    (lambda: MemPool.create(Location.host(), "pinned", export_handle_types="posix"), ValueError,
     "unknown export handle type 'posix'"),
    (lambda: MemPool.create(Location.host(), "pinned", export_handle_types=1.0), TypeError,
     "export_handle_types must be"),
    # Bytes are not names, and a dict's values would be dropped: both refused, not iterated.
    (lambda: MemPool.create(Location.host(), "pinned", export_handle_types=b"posix_fd"),
     TypeError, "export_handle_types must be .*, got bytes"),
    (lambda: MemPool.create(Location.host(), "pinned", export_handle_types={"posix_fd": 1}),
     TypeError, "export_handle_types must be .*, got dict"),
    (lambda: MemPool.create(Location.host(), "pinned", export_handle_types=["posix_fd", 1.5]),
     TypeError, "export handle types in a list are names or asyncmr.ExportHandle, got float"),
    (lambda: AsyncPinnedMR(cache=-1), ValueError, "cache must be in"),
    (lambda: AsyncDeviceMR(cache="1MiB"), TypeError, "cache must be an int"),
    (lambda: AsyncManagedMR(cache=100), ValueError, "cache must be 0 .no cache. or a cap in"),
    # A negative descriptor is C++'s to refuse, a value no C int holds Python's.
    (lambda: MemPool.import_fd(-1, Location.device(0), "device"), ValueError,
     "a pool file descriptor is >= 0, got -1"),
    (lambda: MemPool.import_fd(2**31, Location.device(0), "device"), ValueError,
     r"fd must be in \[-2\*\*31, 2\*\*31\), got 2147483648"),
    (lambda: MemPool.import_fd("3", Location.device(0), "device"), TypeError, "fd must be an int"),
    # A null pointer is C++'s to refuse, a value no pointer holds Python's.
    (lambda: asyncmr.export_pointer(0), ValueError, "cannot export a null pointer"),
    (lambda: asyncmr.export_pointer(-1), ValueError, "ptr must be a 64-bit address, got -1"),
    (lambda: asyncmr.export_pointer(2**64), ValueError, "ptr must be a 64-bit address"),
    (lambda: asyncmr.export_pointer("0x1000"), TypeError, "ptr must be a non-zero int address"),
    (lambda: MemPool.create(Location.host(), "pinned", export_handle_types=0x7FFFFFFF),
     ValueError, r"export_handle_types 0x7fffffff has bits no export handle type has "
                 r"\(0x7ffffff6\); the types are posix_fd = 1, fabric = 8"),
    (lambda: MemPool.from_handle(0), ValueError, "non-zero"),
    (lambda: MemPool.from_handle("0x1"), TypeError, "pool handle must be an int"),
    # An enum member is a name, never a handle, even where it is an int.
    (lambda: MemPool.from_handle(asyncmr.PoolSource.new_pool), TypeError,
     r"pool handle must be an int address, got asyncmr\.PoolSource"),
    (lambda: AsyncDeviceMR(pool=asyncmr.ExportHandle.fabric), TypeError,
     r"pool must be .*, got asyncmr\.ExportHandle"),
    (lambda: MemPool.from_handle(0x7F0000001000, owned="no"), TypeError,
     "owned must be a bool, got str"),
    (lambda: MemPool.from_handle(0x7F0000001000, owned=1), TypeError,
     "owned must be a bool, got int"),
    # A combination CUDA is known to refuse is named before the driver is looked for.
    (lambda: MemPool.from_handle(0x7F0000001000, location=Location.host(),
                                 allocation_type="device"),
     ValueError, "device memory at host is not possible"),
    # An explicit threshold below the reservation needs no pool to be judged.
    (lambda: AsyncDeviceMR(pool="new", release_threshold=1 << 20, reserve=64 << 20), ValueError,
     r"reserve \(67108864 bytes\) is above the pool's release threshold \(1048576 bytes\)"),
    (lambda: AsyncManagedMR(release_threshold=0, reserve=1), ValueError,
     r"reserve \(1 bytes\) is above the pool's release threshold \(0 bytes\)"),
    # Every argument is checked before an int pool is adopted (a driver query) ...
    (lambda: AsyncDeviceMR("x", pool=0x7F0000001000), TypeError, "device must be an int"),
    (lambda: AsyncPinnedMR(pool=0x7F0000001000, numa_node=-1), ValueError,
     "numa_node: NUMA node must be in"),
    (lambda: AsyncManagedMR(pool=0x7F0000001000, location="host"), TypeError,
     "location must be an asyncmr.Location"),
    # ... and before prefetch="device" asks which device is current.
    (lambda: AsyncManagedMR(prefetch="device", accessible_from="bogus"), ValueError,
     "accessible_from must be 'all'"),
    # The options only C++ judges are judged before either, too.
    (lambda: AsyncDeviceMR(pool=0x7F0000001000, cache=1), ValueError,
     r"cache must be 0 \(no cache\) or a cap in"),
    (lambda: AsyncDeviceMR(pool=0x7F0000001000, release_threshold=0, reserve=10), ValueError,
     r"reserve \(10 bytes\) is above the pool's release threshold \(0 bytes\)"),
    (lambda: AsyncPinnedMR(pool=0x7F0000001000, numa_node=1 << 20), ValueError,
     "numa_node: the host has no NUMA node 1048576"),
    (lambda: AsyncManagedMR(pool=0x7F0000001000, discard=True), ValueError,
     "discard needs a prefetch target"),
    (lambda: AsyncManagedMR(cache=1, prefetch="device"), ValueError,
     r"cache must be 0 \(no cache\) or a cap in"),
    # A target that is no str is not compared with "device" (a NumPy array's == is elementwise).
    (lambda: AsyncManagedMR(prefetch=np.array([1, 2])), TypeError,
     r'prefetch must be None, "device", a device ordinal, "host" or an asyncmr.Location, '
     r"got array\(\[1, 2\]\) \(numpy\.ndarray\)"),
    (lambda: asyncmr.prefetch((4096, 16), np.array([1, 2])), TypeError,
     r'to must be "device", a device ordinal, "host" or an asyncmr.Location, '
     r"got array\(\[1, 2\]\) \(numpy\.ndarray\)"),
    # A prefetch target of the wrong type is a TypeError wherever it is taken (as device=True
    # is), a str or ordinal of the wrong value a ValueError; each names the argument and what
    # it got.
    (lambda: AsyncManagedMR(prefetch=True), TypeError,
     r'prefetch must be None, "device", a device ordinal, "host" or an asyncmr\.Location, '
     r"got True \(bool\)"),
    (lambda: AsyncManagedMR(prefetch=np.True_), TypeError,
     r"prefetch must be None, .*, got (np\.)?True_? \(numpy\.bool_?\)"),
    (lambda: AsyncManagedMR(prefetch=1.0), TypeError,
     r"prefetch must be None, .*, got 1\.0 \(float\)"),
    (lambda: AsyncManagedMR(prefetch=("device", 0)), TypeError,
     r"prefetch must be None, .*, got \('device', 0\) \(tuple\)"),
    (lambda: AsyncManagedMR(prefetch="gpu"), ValueError,
     r'prefetch must be None, "device", a device ordinal, "host" or an asyncmr\.Location, '
     r"got 'gpu'"),
    (lambda: AsyncManagedMR(prefetch=-1), ValueError, r"prefetch must be in \[0, 2\*\*31\), got -1"),
    (lambda: asyncmr.prefetch((4096, 16), to=False), TypeError,
     r'to must be "device", a device ordinal, "host" or an asyncmr\.Location, got False \(bool\)'),
    (lambda: asyncmr.discard_and_prefetch((4096, 16), to=None), TypeError,
     r"to must be .*, got None \(NoneType\)"),
    (lambda: asyncmr.advise((4096, 16), "set_accessed_by", to=0.0), TypeError,
     r"to must be .*, got 0\.0 \(float\)"),
    (lambda: asyncmr.advise((4096, 16), "set_accessed_by", to="cpu"), ValueError,
     r"to must be .*, got 'cpu'"),
    # A Location whose kind is not a str is a TypeError as a target too, as to_location says
    # for a resource's location (a LocationKind member is not its name).
    (lambda: asyncmr.prefetch((4096, 16), to=Location(5, None)), TypeError,
     r"to: a location's kind must be a str .*, got int"),
    (lambda: AsyncManagedMR(prefetch=Location(asyncmr.LocationKind.device, 0)), TypeError,
     r"prefetch: a location's kind must be a str .*, got asyncmr\.LocationKind"),
    (lambda: AsyncManagedMR(location=Location.host_numa(0)), ValueError,
     "managed pools are located on a device, the host, or nowhere"),
    (lambda: AsyncManagedMR(location=Location.host_numa_current(), pool="new"), ValueError,
     "managed pools are located on a device, the host, or nowhere"),
    # accessible_from and MemPool.set_access's devices: ids, not bytes or a mapping's keys.
    (lambda: AsyncPinnedMR(accessible_from=b"all"), TypeError,
     "accessible_from must be 'all', a device id or a list of ids, got bytes"),
    (lambda: AsyncPinnedMR(accessible_from={0: 1}), TypeError,
     "accessible_from must be 'all', a device id or a list of ids, got dict"),
    (lambda: MemPool.__new__(MemPool).set_access("bogus"), ValueError,
     "devices must be 'all', a device id or a list of ids, got 'bogus'"),
    # A device named twice is refused before the driver is asked (which mode would it get?), by
    # C++ alone: check_resource_options here; mem_pool::set_access on a pool (a GPU test), so
    # Python passes set_access's devices on, here to an empty MemPool that refuses itself.
    (lambda: MemPool.__new__(MemPool).set_access([1, 0, np.int64(1)], "none"), TypeError,
     "MemPool.__new__ made an empty MemPool"),
    (lambda: AsyncPinnedMR(accessible_from=[0, 0]), ValueError,
     r"accessible_from: device 0 is named twice"),
    (lambda: AsyncManagedMR(location=Location.host(), accessible_from=(2, 2), pool="new"),
     ValueError, r"accessible_from: device 2 is named twice"),
    # NumPy's integers count as ints, its bools and floats do not.
    (lambda: AsyncDeviceMR(np.bool_(True)), TypeError, "device must be an int, got numpy.bool"),
    (lambda: AsyncDeviceMR(release_threshold=np.float64(1)), TypeError,
     "release_threshold must be an int number of bytes, got numpy.float64"),
    (lambda: AsyncDeviceMR(np.int64(-1)), ValueError, r"device must be in \[0, 2\*\*31\)"),
    (lambda: MemPool.from_handle(np.uint64(0)), ValueError, "non-zero"),
    (lambda: Location.host_numa(np.int8(-1)), ValueError, "NUMA node must be in"),
    # A type is named as type_name names it: NumPy's bool is no Python bool, another
    # library's Location no asyncmr.Location, though their bare names say the same.
    (lambda: MemPool.from_handle(0x7F0000001000, owned=np.True_), TypeError,
     r"owned must be a bool, got numpy\.bool"),
    (lambda: MemPool.create(_Theirs.Location("device", 0), "device"), TypeError,
     r"location must be an asyncmr\.Location .*, got test_cpu\._Theirs\.Location"),
    (lambda: MemPool.create(Location.device(0), asyncmr.PoolSource.new_pool), TypeError,
     r"allocation_type must be .*, got asyncmr\.PoolSource"),
    (lambda: MemPool.__new__(MemPool).set_access(0, np.True_), TypeError,
     r"access mode must be a str, got numpy\.bool"),
    (lambda: MemPool.__new__(MemPool).track_peak(np.int64(5)), TypeError,
     r"a phase's name must be a str, got numpy\.int64"),
    # import_pointer's data is bytes-like (export_pointer's 64 bytes): another type is named.
    (lambda: MemPool.__new__(MemPool).import_pointer("x" * 64, 64), TypeError,
     r"data must be the 64 bytes export_pointer returned \(a bytes-like object\), got str"),
    (lambda: MemPool.__new__(MemPool).import_pointer(None, 64), TypeError,
     r"data must be the 64 bytes .*, got NoneType"),
    (lambda: MemPool.__new__(MemPool).import_pointer(list(range(64)), 64), TypeError,
     r"data must be the 64 bytes .*, got list"),
    # An enum member other than ExportHandle's is no export handle type's bits (PoolSource.current
    # is 1, posix_fd's bit), and no member is an address.
    (lambda: MemPool.create(Location.host(), "pinned",
                            export_handle_types=asyncmr.PoolSource.current), TypeError,
     r"export_handle_types must be .*, got <PoolSource\.current: 1> "
     r"\(asyncmr\.PoolSource\)"),
    (lambda: MemPool.create(Location.host(), "pinned", export_handle_types=_Gpu.main), TypeError,
     r"export_handle_types must be .*, got <_Gpu\.main: 1> \(test_cpu\._Gpu\)"),
    (lambda: asyncmr.export_pointer(asyncmr.PoolSource.new_pool), TypeError,
     r"ptr must be a non-zero int address, got <PoolSource\.new_pool: 2> "
     r"\(asyncmr\.PoolSource\)"),
])
def test_bad_arguments_fail_before_cuda(call, exc, match):
    # These raise the same way with or without a GPU: validation runs first.
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("call", [
    lambda: AsyncManagedMR(),
    lambda: AsyncPinnedMR(),
    lambda: AsyncDeviceMR(),
    lambda: AsyncDeviceMR(pool="new"),
    lambda: MemPool.default(Location.device(0), "device"),
    lambda: MemPool.create(Location.host(), "pinned"),
    lambda: MemPool.create(Location.device(0), "managed", max_size=0),
    lambda: asyncmr.device_count(),
])
def test_no_gpu_message(no_gpu, call):
    with pytest.raises(asyncmr.NoDeviceError, match="no CUDA driver|no CUDA device|older than"):
        call()


@pytest.mark.parametrize("call", [
    lambda: AsyncDeviceMR(np.int64(0), release_threshold=np.uint64(1 << 30),
                          cache=np.int32(1 << 20), reserve=np.uint8(0)),
    lambda: AsyncManagedMR(prefetch=np.int64(0)),
    lambda: AsyncPinnedMR(accessible_from=np.int64(0), numa_node=np.int8(0)),
    lambda: AsyncPinnedMR(accessible_from=[np.int16(0)]),
    lambda: MemPool.from_handle(np.uint64(0x7F0000001000)),
    # asyncmr's own enum, alone or in a list of types.
    lambda: MemPool.create(Location.host(), "pinned",
                           export_handle_types=asyncmr.ExportHandle.posix_fd),
    lambda: MemPool.create(Location.host(), "pinned",
                           export_handle_types=[asyncmr.ExportHandle.posix_fd, "fabric"]),
])
def test_numpy_integers_are_taken_where_ints_are(no_gpu, call):
    # Valid: they pass every check and reach the device, which this machine lacks.
    with pytest.raises(asyncmr.NoDeviceError):
        call()


@pytest.mark.parametrize("call", [
    lambda: AsyncPinnedMR(accessible_from=[]),
    lambda: AsyncPinnedMR(pool="new", accessible_from=()),
    lambda: AsyncManagedMR(location=Location.host(), accessible_from=[]),
])
def test_an_empty_accessible_from_is_taken_as_no_device(no_gpu, call):
    # [] has a meaning: grant no device (host-only memory; test_resources checks the pool's
    # access on a GPU), neither "all" nor an error. Read as "all" it fails the assertion;
    # refused, the call raises ValueError or TypeError before the device is looked for.
    assert asyncmr._validate.devices([]) == (False, [])
    with pytest.raises(asyncmr.NoDeviceError):
        call()


class _Gpu(enum.IntEnum):
    """A user's own int enum, whose members are ints a device ordinal was read from."""
    main = 1
    zero = 0


# The message: the argument, the member and its type (asyncmr's enums, named as asyncmr's).
def _member(name, repr_, kind):
    return rf"{name}.*, got {re.escape(repr_)} \({kind}\)"


def _install(**kwargs):
    import asyncmr.cudf_pandas

    return asyncmr.cudf_pandas.install(**kwargs)


_LK, _TARGET = r"asyncmr\.LocationKind", r'must be .*"device", a device ordinal'


@pytest.mark.parametrize("call, match", [
    # A prefetch target: LocationKind.host (2) was read as device 2, LocationKind.device as 1.
    (lambda: AsyncManagedMR(prefetch=asyncmr.LocationKind.host),
     _member("prefetch " + _TARGET, "<LocationKind.host: 2>", _LK)),
    (lambda: AsyncManagedMR(prefetch=_Gpu.zero), _member("prefetch", "<_Gpu.zero: 0>",
                                                         r"test_cpu\._Gpu")),
    (lambda: asyncmr.prefetch((4096, 16), to=asyncmr.LocationKind.device),
     _member("to " + _TARGET, "<LocationKind.device: 1>", _LK)),
    (lambda: asyncmr.discard_and_prefetch((4096, 16), to=asyncmr.AccessMode.read),
     _member("to", "<AccessMode.read: 1>", r"asyncmr\.AccessMode")),
    (lambda: asyncmr.advise((4096, 16), "set_accessed_by", to=asyncmr.PoolSource.current),
     _member("to", "<PoolSource.current: 1>", r"asyncmr\.PoolSource")),
    (lambda: _install(prefetch=asyncmr.LocationKind.host),
     _member("prefetch", "<LocationKind.host: 2>", _LK)),
    # device=, numa_node=, accessible_from= (alone or in a list), MemPool's devices.
    (lambda: AsyncDeviceMR(asyncmr.LocationKind.device),
     _member("device must be an int", "<LocationKind.device: 1>", _LK)),
    (lambda: AsyncManagedMR(device=_Gpu.main),
     _member("device", "<_Gpu.main: 1>", "test_cpu._Gpu")),
    (lambda: AsyncPinnedMR(numa_node=_Gpu.zero),
     _member("numa_node", "<_Gpu.zero: 0>", "test_cpu._Gpu")),
    (lambda: AsyncPinnedMR(accessible_from=_Gpu.main),
     _member("accessible_from", "<_Gpu.main: 1>", "test_cpu._Gpu")),
    (lambda: AsyncManagedMR(accessible_from=[0, _Gpu.main]),
     _member("accessible_from device", "<_Gpu.main: 1>", "test_cpu._Gpu")),
    (lambda: MemPool.__new__(MemPool).set_access([_Gpu.zero]),
     _member("device", "<_Gpu.zero: 0>", "test_cpu._Gpu")),
    (lambda: MemPool.__new__(MemPool).access(_Gpu.zero),
     _member("device", "<_Gpu.zero: 0>", "test_cpu._Gpu")),
    # Locations: the class methods, and a Location built directly (judged where it is used).
    (lambda: Location.device(asyncmr.LocationKind.host),
     _member("device ordinal must be an int", "<LocationKind.host: 2>", _LK)),
    (lambda: Location.host_numa(_Gpu.main),
     _member("NUMA node", "<_Gpu.main: 1>", "test_cpu._Gpu")),
    (lambda: MemPool.create(Location("device", _Gpu.main), "device"),
     _member("device id", "<_Gpu.main: 1>", "test_cpu._Gpu")),
    (lambda: asyncmr.pool_support(Location("host_numa", _Gpu.zero), "pinned"),
     _member("host_numa id", "<_Gpu.zero: 0>", "test_cpu._Gpu")),
    (lambda: AsyncManagedMR(prefetch=Location("device", asyncmr.LocationKind.device)),
     _member("device id", "<LocationKind.device: 1>", _LK)),
    (lambda: asyncmr._core.device_facts(_Gpu.main),
     _member("device", "<_Gpu.main: 1>", "test_cpu._Gpu")),
], ids=["managed-prefetch-LocationKind", "managed-prefetch-user-enum", "prefetch-to",
        "discard_and_prefetch-to", "advise-to", "cudf_pandas-install-prefetch", "device-device",
        "managed-device", "pinned-numa_node", "pinned-accessible_from",
        "managed-accessible_from-list", "MemPool-set_access", "MemPool-access",
        "Location-device", "Location-host_numa", "MemPool-create-Location", "pool_support-Location",
        "managed-prefetch-Location", "device_facts"])
def test_an_enum_member_is_never_taken_as_a_device_ordinal(call, match):
    # An IntEnum member is an int, so it was read as the device (or NUMA node) its value
    # numbers; it is refused as b3c30c1 refuses one as a pool handle, before any CUDA call.
    with pytest.raises(TypeError, match=match):
        call()


def test_ints_stay_device_ordinals_where_enum_members_are_refused():
    assert Location.device(np.int64(1)) == Location.device(1)
    assert asyncmr._validate.devices([np.uint8(0), 1]) == (False, [0, 1])
    assert asyncmr._validate.target("to", np.int32(3)) == 3


def test_numpy_integers_make_locations_of_python_ints():
    assert Location.device(np.int64(1)) == Location.device(1)
    assert type(Location.host_numa(np.uint8(0)).id) is int


def test_a_zero_size_pinned_block_makes_no_resource(no_gpu):
    # It allocates nothing, so it asks for no pool: on a GPU the process-wide pinned resource
    # would otherwise be made (raising the default pool's threshold, granting access).
    block = asyncmr.PinnedBlock(0)
    assert (block.ptr, block.size, block.mr) == (0, 0, None)
    assert asyncmr.pinned._default_mr is None


def test_no_gpu_error_is_not_rmms_misleading_message(no_gpu):
    with pytest.raises(RuntimeError) as info:
        AsyncManagedMR()
    assert "cudaMallocAsync not supported" not in str(info.value)


def test_failed_constructions_keep_the_type_alive():
    # Regression: RMM's base type is a heap type whose dealloc releases a reference to the
    # instance's type; a static subclass lost one reference per instance and the interpreter
    # eventually freed the class and crashed.
    import sys

    before = sys.getrefcount(AsyncManagedMR)
    for _ in range(2000):
        with pytest.raises(ValueError):
            AsyncManagedMR(release_threshold=-1)
    assert sys.getrefcount(AsyncManagedMR) == before


# ---- one source of truth: enums and the attribute table come from C++ ---------------------------

def test_enums_are_the_cpp_enums():
    from asyncmr import _core

    assert [k.name for k in asyncmr.LocationKind] == [
        "none", "device", "host", "host_numa", "host_numa_current"]
    assert [t.name for t in asyncmr.AllocationType] == ["device", "pinned", "managed"]
    # The Python spellings of pool= map onto the C++ enum by C++'s own to_string.
    assert _core.POOL_SOURCES == {"default": asyncmr.PoolSource.default_pool,
                                  "current": asyncmr.PoolSource.current,
                                  "new": asyncmr.PoolSource.new_pool}
    assert set(_core.ACCESS_MODES.values()) == set(asyncmr.AccessMode)


def test_location_kinds_name_cpp_kinds():
    kinds = {Location.device(0).kind, Location.host().kind, Location.host_numa(0).kind,
             Location.host_numa_current().kind, Location.none().kind}
    assert kinds == {k.name for k in asyncmr.LocationKind}


def test_attribute_stub_matches_the_table():
    """The committed _attributes.pyi is what ci/generate_stubs.py makes from the table."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "ci" / "generate_stubs.py"
    spec = importlib.util.spec_from_file_location("generate_stubs", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    installed = pathlib.Path(asyncmr.__file__).with_name("_attributes.pyi")
    committed = gen.STUB.read_text() if gen.STUB.exists() else installed.read_text()
    rendered = gen.render()
    assert committed == rendered, "run: python ci/generate_stubs.py"
    for row in asyncmr.attribute_table:
        assert f"def {row.name}(self)" in rendered


def test_the_names_deprecated_in_0_2_are_removed():
    for cls in (MemPool, AsyncManagedMR, AsyncPinnedMR, AsyncDeviceMR):
        assert callable(cls.trim_to) and callable(cls.reset_peaks)
        assert not hasattr(cls, "trim") and not hasattr(cls, "reset_peak"), cls


def test_exported_enums_are_taken_where_their_names_are():
    from asyncmr import AllocationType, PoolSource

    by_name = _decide(13000, 13000, Location.host(), "pinned", "new")
    assert _decide(13000, 13000, Location.host(), AllocationType.pinned,
                   PoolSource.new_pool) == by_name
    with pytest.raises(ValueError, match="pool must be one of"):
        _decide(13000, 13000, Location.host(), "pinned", "owned")


@pytest.mark.parametrize("pool", [5, None, True, 2.0, b"default", ["default"], np.int64(2)])
def test_a_pool_choice_of_the_wrong_type_is_a_type_error(pool):
    # As AsyncManagedMR(pool=1.5) and AsyncMRPlugin(pool=5): TypeError naming the type, before
    # the device is looked for; a str that names no choice stays a ValueError.
    name = asyncmr._validate.type_name(pool)
    for call in (lambda: asyncmr.pool_support(Location.host(), "pinned", pool),
                 lambda: _decide(13000, 13000, Location.host(), "pinned", pool)):
        with pytest.raises(TypeError, match=rf"pool must be one of .* or a PoolSource, got "
                                            rf"{re.escape(name)}$"):
            call()
    with pytest.raises(ValueError, match=r"pool must be one of .*, got 'owned'"):
        asyncmr.pool_support(Location.host(), "pinned", "owned")


# ---- the support decision, for builds and drivers this machine does not have --------------------

def _decide(driver, build, loc, atype, source="default", **facts):
    from asyncmr import _core

    return _core._decide_pool_support(driver=driver, build=build, location=loc,
                                      allocation_type=atype, pool=source, **facts)


@pytest.mark.parametrize("source, path", [("default", "stand_in"), ("new", "runtime")])
def test_cuda12_build_on_a_12x_driver_has_host_pools(source, path):
    assert _decide(12090, 12090, Location.host(), "pinned", source) == (path, "")


def test_cuda12_build_on_a_12x_driver_has_no_current_host_pool():
    path, why = _decide(12090, 12090, Location.host(), "pinned", "current")
    assert path is None and "CUDA 13 driver feature" in why and "pool='new'" in why


@pytest.mark.parametrize("build", [12090, 13000])
def test_managed_pools_on_a_12x_driver_name_the_driver(build):
    path, why = _decide(12080, build, Location.device(0), "managed")
    assert path is None and "CUDA 13 driver" in why and "12.8" in why


@pytest.mark.parametrize("source", ["default", "current", "new"])
def test_host_pools_on_a_driver_older_than_12_6_say_so(source):
    path, why = _decide(12040, 12090, Location.host(), "pinned", source)
    assert path is None and "12.6" in why and "this driver is 12.4" in why


@pytest.mark.parametrize("atype, loc", [("managed", Location.device(0)),
                                        ("pinned", Location.host())])
@pytest.mark.parametrize("source", ["default", "current"])
def test_cuda12_build_on_a_13x_driver_reaches_the_driver(atype, loc, source):
    assert _decide(13000, 12090, loc, atype, source) == ("driver_entry_point", "")


def test_device_facts_decide():
    assert _decide(13000, 13000, Location.host(), "pinned", host_memory_pools=False)[0] is None
    path, why = _decide(13000, 13000, Location.device(0), "managed",
                        concurrent_managed_access=False)
    assert path is None and "concurrent managed access" in why
    assert _decide(13000, 13000, Location.device(0), "device", memory_pools=False)[0] is None


@pytest.mark.parametrize("module, blocked, wheel", [
    ("asyncmr.cupy", "cupy", "cupy-cuda{major}x"),
    ("asyncmr.cudf", "libcudf", "libcudf-cu{major}"),
])
def test_an_optional_door_names_the_wheel_of_this_builds_cuda(module, blocked, wheel):
    """Without its library, a door says which wheel to install: the one of the CUDA major this
    asyncmr was built for (cu12 users must not be sent to a CUDA 13 wheel)."""
    from gpu_helpers import run_python

    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            f"try:\n    import {module}\nexcept ImportError as e:\n    print(e)\n")
    out = run_python(code, timeout=120)
    assert out.returncode == 0, out.stderr
    major = asyncmr.runtime_version() // 1000
    assert f"pip install {wheel.format(major=major)}" in out.stdout, out.stdout


# ---- the command line ----------------------------------------------------------------------------

def test_version_is_printed():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "asyncmr", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"asyncmr {asyncmr.__version__} (CUDA runtime "), proc.stdout


def test_demo_refuses_an_unknown_option():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "asyncmr", "demo", "--elemnts", "5"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc
    assert "unrecognized arguments: --elemnts 5" in proc.stderr
    assert proc.stderr.startswith("usage: python -m asyncmr demo "), proc.stderr


def _command_parsers():
    """Every subcommand's own argparse parser, by name (bench's from the checkout)."""
    from asyncmr import _cli, _info, cudf_pandas
    from asyncmr.__main__ import COMMANDS, demo_parser

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from asyncmr_bench.__main__ import parser as bench_parser
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    parsers = {"demo": demo_parser(), "info": _info.parser(), "plot": _cli.plot_parser(),
               "cudf-pandas": cudf_pandas.parser(), "bench": bench_parser()}
    assert sorted(parsers) == sorted(COMMANDS)
    return parsers


# In-house words a user does not share: none of them in a command's help or messages.
IN_HOUSE = re.compile(r"(?i)\b(doors?|stand-in|parks?|epoch|refused_unmarked|gpu host|"
                      r"stacks stage)\b")


def test_every_subcommand_describes_itself_and_every_option():
    for name, parser in _command_parsers().items():
        assert parser.prog == f"python -m asyncmr {name}", parser.prog
        assert parser.description and len(parser.description) > 40, name
        assert "exit status" in (parser.epilog or ""), name
        for action in parser._actions:
            assert action.help, f"{name}: {action.option_strings or action.dest} has no help"
        text = parser.format_help()
        assert not IN_HOUSE.search(text), (name, IN_HOUSE.search(text))


@pytest.mark.parametrize("command", ["demo", "info", "plot", "cudf-pandas", "bench"])
def test_help_of_each_subcommand_is_its_own(command):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "asyncmr", command, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: python -m asyncmr {command} "), proc.stdout
    assert "exit status" in proc.stdout, proc.stdout


@pytest.mark.parametrize("command", ["demo", "info", "plot", "cudf-pandas", "bench"])
def test_an_unknown_option_prints_that_subcommands_usage(command, tmp_path):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "asyncmr", command, "--bogus", "x"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc
    assert f"usage: python -m asyncmr {command} " in proc.stderr, proc.stderr
    assert "usage: python -m asyncmr [-h]" not in proc.stderr, proc.stderr
    assert "--bogus" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_top_level_help_lists_the_commands_and_the_exit_statuses():
    from asyncmr import _cli
    from asyncmr.__main__ import COMMANDS, parser

    text = parser().format_help()
    for name in COMMANDS:
        assert f"    {name}" in text, name
    for code, _ in _cli.EXIT_STATUSES:
        assert f"  {code}  " in text, code
    codes = [code for code, _ in _cli.EXIT_STATUSES]
    assert len(set(codes)) == len(codes) == 5


@pytest.mark.parametrize("command", [["info"], ["info", "--json"], ["demo"], ["bench", "--quick"],
                                     ["cudf-pandas", "SCRIPT"]])
def test_without_a_usable_gpu_every_command_exits_3_in_one_line(command, tmp_path):
    # Every device hidden from the child (CUDA_VISIBLE_DEVICES=""), so this runs on GPU hosts
    # too; the same status for every command, and the program named once.
    from asyncmr._cli import EXIT_NO_GPU
    from gpu_helpers import describe, require_hidden_devices, run_python

    require_hidden_devices()
    script = tmp_path / "script.py"
    script.write_text("print('the script ran')\n")
    args = [str(script) if a == "SCRIPT" else a for a in command]
    if command[0] == "bench":
        args += ["--out", str(tmp_path / "out")]
    proc = run_python(f"import os, sys; os.chdir({str(ROOT)!r}); from asyncmr.__main__ import "
                      "main; sys.exit(main(sys.argv[1:]))", *args,
                      env={"CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    assert proc.returncode == EXIT_NO_GPU, describe(proc)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, describe(proc)
    assert lines[0].startswith(f"asyncmr {command[0]}: no usable CUDA "), describe(proc)
    assert lines[0].count("asyncmr:") == 0 and "Traceback" not in proc.stderr, describe(proc)
    assert "the script ran" not in proc.stdout


def test_a_missing_package_has_an_exit_status_of_its_own(tmp_path):
    # The benchmark outside a checkout: not installed with the package.
    import subprocess

    from asyncmr._cli import EXIT_MISSING

    env = {k: v for k, v in os.environ.items() if k != "ASYNCMR_BENCHMARKS"}
    proc = subprocess.run([sys.executable, "-m", "asyncmr", "bench"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_MISSING, proc
    assert proc.stderr.startswith("asyncmr bench: the benchmark is not part of the installed")


@pytest.mark.parametrize("value", ["-5", "0", "-0", "1.5", "x", "", "\u0663", " 7"])
def test_demo_refuses_elements_that_are_not_a_positive_integer(value, capsys):
    from asyncmr.__main__ import main

    with pytest.raises(SystemExit) as exit:  # before the demo looks for a GPU
        main(["demo", "--elements", value])
    assert exit.value.code == 2
    assert (f"error: argument --elements: must be a positive integer, got {value!r}"
            in capsys.readouterr().err)


@pytest.mark.parametrize("value", [str((1 << 30) + 1), str(10**30), "9" * 5000])
def test_demo_refuses_more_elements_than_it_can_hold_before_running(value, capsys):
    # The demo makes a float64 array of --elements on the host and several on the GPU: a count
    # past 2**30 (8 GiB an array) would end in a NumPy or CuPy traceback on a GPU host. Refused
    # up front, naming the bound.
    from asyncmr.__main__ import main

    with pytest.raises(SystemExit) as exit:  # before the demo looks for a GPU
        main(["demo", "--elements", value])
    assert exit.value.code == 2
    assert "error: argument --elements: must be at most 1073741824" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["", "a-file"])
def test_demo_refuses_a_history_dir_it_cannot_write_before_running(where, tmp_path, capsys):
    # Checked before the demo looks for a GPU: found after the run it was a traceback
    # (FileExistsError), and an empty name wrote into the working directory.
    from asyncmr.__main__ import main

    if where:
        (tmp_path / where).write_text("not a directory")
        where = str(tmp_path / where)
    with pytest.raises(SystemExit) as exit:
        main(["demo", "--history", where])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument --history: " in err
    assert ("needs a directory name" if not where else "is not a directory") in err


@pytest.mark.parametrize("twice, named, values", [
    (["--elements", "8", "--elements", "9"], "--elements", (8, 9)),
    (["--history", "a", "--history=b"], "--history", ("a", "b")),
])
def test_demo_refuses_an_option_given_twice_naming_it(twice, named, values, capsys):
    from asyncmr.__main__ import main

    with pytest.raises(SystemExit) as exit:
        main(["demo", *twice])
    assert exit.value.code == 2
    first, then = values
    assert (f"error: argument {named}: given twice (first {first!r}, then {then!r})"
            in capsys.readouterr().err)


def test_the_demo_writes_its_history_as_json_and_its_timeline(tmp_path, capsys):
    # The files `demo --history DIR` writes after its GPU run, from the committed recording.
    pytest.importorskip("matplotlib", reason="the timeline needs matplotlib")
    from asyncmr.__main__ import _write_history
    from asyncmr.history import load

    recorded = load(Path(__file__).resolve().parent.parent / "docs" / "images" /
                    "demo-history.json")
    _write_history(recorded, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["demo-history.json",
                                                                    "demo-timeline.png"]
    assert load(tmp_path / "out" / "demo-history.json").events == recorded.events
    assert (tmp_path / "out" / "demo-timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "export_torch_snapshot" in capsys.readouterr().out


def test_the_installed_distribution_carries_the_license():
    import importlib.metadata as md

    name = next(d.metadata["Name"] for d in md.distributions()
                if (d.metadata["Name"] or "").startswith("asyncmr"))
    dist = md.distribution(name)
    assert dist.metadata["License-Expression"] == "Apache-2.0"
    licenses = [f for f in dist.files or [] if f.name == "LICENSE"]
    assert licenses, f"no LICENSE in {name}'s files"
    assert "Apache License" in licenses[0].read_text()


def _installed_metadata():
    import importlib.metadata as md

    name = next(d.metadata["Name"] for d in md.distributions()
                if (d.metadata["Name"] or "").startswith("asyncmr"))
    return md.metadata(name)


def test_the_package_metadata_links_and_classifies_the_project():
    meta = _installed_metadata()
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls), urls
    assert all(u.startswith("https://") for u in urls.values()), urls
    classifiers = meta.get_all("Classifier") or []
    assert "Environment :: GPU :: NVIDIA CUDA" in classifiers, classifiers
    assert "Programming Language :: Python :: 3.11" in classifiers, classifiers
    assert not [c for c in classifiers if c.startswith("License ::")], "PEP 639: the expression"


def test_the_long_description_is_the_readmes_first_part_with_absolute_links():
    meta = _installed_metadata()
    body = meta.get_payload() or meta["Description"] or ""
    assert meta["Description-Content-Type"] == "text/markdown"
    assert body.startswith("# asyncmr"), body[:200]
    assert 20 < len(body.splitlines()) < 120, len(body.splitlines())
    assert "end of the package description" not in body
    relative = re.findall(r"\]\((?!https?://|#)([^)]+)\)", body)
    assert not relative, relative


# ---- the house: stubs, the README's code, the docs, the sources -------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def _ci_script(name):
    import subprocess
    import sys

    require = pytest.importorskip("mypy", reason="mypy is in the [test] extra; without it the "
                                                 "stub and README checks cannot run")
    del require
    return subprocess.run([sys.executable, str(ROOT / "ci" / name)], capture_output=True,
                          text=True, timeout=900)


def test_the_stubs_match_the_built_module():
    proc = _ci_script("check_stubs.py")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


def test_the_readmes_python_blocks_type_check():
    proc = _ci_script("check_readme_types.py")  # README.md and the docs' pages
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "pages: ok" in proc.stdout, proc.stdout


README = ROOT / "README.md"
DOC_PAGES = [README, ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md"] + sorted(
    p for p in (ROOT / "docs").rglob("*.md") if "_generated" not in p.parts)
FIGURES_BLOCK = re.compile(r"<!-- figures:(?P<name>[a-z0-9-]+) -->.*?<!-- /figures:(?P=name) -->",
                           re.S)


def test_the_readme_is_read_in_five_minutes():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    first_example = next(i for i, line in enumerate(lines, 1) if line == "```python")
    assert first_example <= 60, first_example
    # .ci/run runs the line after "# tests:"; the demo's line comes first.
    assert [i for i, line in enumerate(lines) if line.startswith("# main:")] == [
        i - 2 for i, line in enumerate(lines) if line.startswith("# tests:")]


def test_the_pages_carry_no_dates_and_the_readme_no_gpu_model():
    # Dates, hosts and run history live in git and in the results files; the pages rendered from
    # those (the README's figures blocks, the docs' generated benchmark pages) may carry them.
    date = re.compile(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}")
    dated = [f"{p.relative_to(ROOT)}:{i}" for p in DOC_PAGES
             for i, line in enumerate(FIGURES_BLOCK.sub("", p.read_text()).splitlines(), 1)
             if date.search(line)]
    assert not dated, dated
    gpu = re.compile(r"\b(H100|H200|GH200|A100|B200|V100|L40S?|RTX ?\d+)\b")
    outside = FIGURES_BLOCK.sub("", README.read_text())
    assert not gpu.search(outside), gpu.search(outside)


def test_the_readmes_links_into_the_tree_resolve():
    links = re.findall(r"\]\((?!https?://|#)([^)#]+)", README.read_text())
    assert len(links) > 10
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, missing


def test_the_cli_page_states_the_exit_statuses_of_the_code():
    from asyncmr._cli import EXIT_STATUSES

    text = (ROOT / "docs" / "cli.md").read_text()
    for code, what in EXIT_STATUSES:
        assert f"| {code} | {what} |" in text, (code, what)


LIBRARY_SOURCES = [p for d in ("include", "src", "python/asyncmr", "cmake", "ci")
                   for p in sorted((ROOT / d).rglob("*"))
                   if p.is_file() and p.suffix in {".hpp", ".cpp", ".py", ".pyx", ".pxd", ".pyi",
                                                    ".cmake", ".sh", ".txt", ".cu"}]


CORE = ROOT / "python" / "asyncmr" / "_core"


def test_each_compiled_part_is_built_declared_stubbed_and_documented():
    # A part is a .pyx with its .pxd (what other parts cimport), its stub (stubtest checks a
    # compiled module only through one), its line in the CMake list (else it is never built)
    # and its row in docs/ARCHITECTURE.md's "The Python layer".
    parts = {p.stem for p in CORE.glob("*.pyx")}
    assert len(parts) > 5, parts
    assert {p.stem for p in CORE.glob("*.pxd")} == parts
    assert {p.stem for p in CORE.glob("*.pyi")} == parts
    cmake = (ROOT / "python" / "asyncmr" / "CMakeLists.txt").read_text()
    assert set(re.findall(r"asyncmr_cython_module\(_core/(\w+)\)", cmake)) == parts
    layer = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("## The Python layer")[1]
    layer = layer.split("\n## ")[0]
    assert set(re.findall(r"^\| `(\w+)\.pyx`", layer, re.M)) == parts


def test_the_installed_parts_are_the_compiled_modules_asyncmr_imports():
    import importlib.machinery

    import asyncmr._core

    installed = Path(asyncmr._core.__file__).parent
    compiled = {p.name.split(".")[0] for p in installed.iterdir()
                if p.name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))}
    imported = {name.rsplit(".", 1)[1] for name in sys.modules
                if name.startswith("asyncmr._core.")}
    assert compiled == imported == {p.stem for p in installed.glob("*.pyi")}


def test_no_issue_numbers_in_the_sources():
    """Comments and messages say what the code does and why; history lives in git."""
    pattern = re.compile(r"\bissues?\s*#?\d+|\(#\d+\)", re.IGNORECASE)
    offenders = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
                 for p in LIBRARY_SOURCES + sorted(q for q in (ROOT / "benchmarks").rglob("*")
                                                   if q.suffix in {".py", ".cpp", ".hpp", ".md"})
                 for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
                 if pattern.search(line)]
    assert not offenders, "\n".join(offenders)


def test_import_pointer_takes_the_64_bytes_from_any_buffer():
    # A strided view of the 64 bytes is as good as bytes: it passes the data check and reaches
    # the pool (here an empty MemPool, refused by name), where memoryview's cast refused it.
    data = np.zeros(128, np.uint8)[::2]
    with pytest.raises(TypeError, match="MemPool.__new__ made an empty MemPool"):
        MemPool.__new__(MemPool).import_pointer(data, 64)

# SPDX-License-Identifier: Apache-2.0
"""Bad arguments, refused before any CUDA call with an exception naming the argument: the
catalogue, the messages without a GPU, NumPy integers where ints go, enum members where they do
not (see docs/ARCHITECTURE.md, "Which layer checks what")."""

import enum
import re
from typing import NamedTuple

import numpy as np
import pytest

import asyncmr
from asyncmr import AsyncDeviceMR, AsyncManagedMR, AsyncPinnedMR, Location, MemPool


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
    (lambda: AsyncManagedMR(pool=0x7F0000001000, prefetch=Location.none()), ValueError,
     "prefetch must be a device or the host, got none$"),
    (lambda: AsyncManagedMR(pool=0x7F0000001000, prefetch=-3), ValueError,
     r"prefetch must be in \[0, 2\*\*31\), got -3$"),
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
     r"location must be an asyncmr\.Location .*, got test_arguments\._Theirs\.Location"),
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
     r"export_handle_types must be .*, got <_Gpu\.main: 1> \(test_arguments\._Gpu\)"),
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
                                                         r"test_arguments\._Gpu")),
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
     _member("device", "<_Gpu.main: 1>", "test_arguments._Gpu")),
    (lambda: AsyncPinnedMR(numa_node=_Gpu.zero),
     _member("numa_node", "<_Gpu.zero: 0>", "test_arguments._Gpu")),
    (lambda: AsyncPinnedMR(accessible_from=_Gpu.main),
     _member("accessible_from", "<_Gpu.main: 1>", "test_arguments._Gpu")),
    (lambda: AsyncManagedMR(accessible_from=[0, _Gpu.main]),
     _member("accessible_from device", "<_Gpu.main: 1>", "test_arguments._Gpu")),
    (lambda: MemPool.__new__(MemPool).set_access([_Gpu.zero]),
     _member("device", "<_Gpu.zero: 0>", "test_arguments._Gpu")),
    (lambda: MemPool.__new__(MemPool).access(_Gpu.zero),
     _member("device", "<_Gpu.zero: 0>", "test_arguments._Gpu")),
    # Locations: the class methods, and a Location built directly (judged where it is used).
    (lambda: Location.device(asyncmr.LocationKind.host),
     _member("device ordinal must be an int", "<LocationKind.host: 2>", _LK)),
    (lambda: Location.host_numa(_Gpu.main),
     _member("NUMA node", "<_Gpu.main: 1>", "test_arguments._Gpu")),
    (lambda: MemPool.create(Location("device", _Gpu.main), "device"),
     _member("device id", "<_Gpu.main: 1>", "test_arguments._Gpu")),
    (lambda: asyncmr.pool_support(Location("host_numa", _Gpu.zero), "pinned"),
     _member("host_numa id", "<_Gpu.zero: 0>", "test_arguments._Gpu")),
    (lambda: AsyncManagedMR(prefetch=Location("device", asyncmr.LocationKind.device)),
     _member("device id", "<LocationKind.device: 1>", _LK)),
    (lambda: asyncmr._core.device_facts(_Gpu.main),
     _member("device", "<_Gpu.main: 1>", "test_arguments._Gpu")),
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

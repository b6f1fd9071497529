# SPDX-License-Identifier: Apache-2.0
"""``asyncmr.Location``: its class methods, its checks as it is built and converted, its repr,
and its kinds, which are C++'s."""


import numpy as np
import pytest

import asyncmr
from asyncmr import AsyncManagedMR, Location, MemPool


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


def test_ints_stay_device_ordinals_where_enum_members_are_refused():
    assert Location.device(np.int64(1)) == Location.device(1)
    assert asyncmr._validate.devices([np.uint8(0), 1]) == (False, [0, 1])
    assert asyncmr._validate.target("to", np.int32(3)) == 3


def test_numpy_integers_make_locations_of_python_ints():
    assert Location.device(np.int64(1)) == Location.device(1)
    assert type(Location.host_numa(np.uint8(0)).id) is int


def test_location_kinds_name_cpp_kinds():
    kinds = {Location.device(0).kind, Location.host().kind, Location.host_numa(0).kind,
             Location.host_numa_current().kind, Location.none().kind}
    assert kinds == {k.name for k in asyncmr.LocationKind}

# SPDX-License-Identifier: Apache-2.0
"""The support decision (``pool_support``) for builds and drivers this machine does not have,
the choice of pool it takes, and the optional doors' wheel names."""

import re

import numpy as np
import pytest

import asyncmr
from asyncmr import Location


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

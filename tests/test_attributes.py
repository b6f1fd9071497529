# SPDX-License-Identifier: Apache-2.0
"""The pool attribute table: one C++ table behind the driver's enum, the Python properties and
their stub, and the types each row takes (checked before a pool is touched)."""


import pytest

import asyncmr


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

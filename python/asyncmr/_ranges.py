# SPDX-License-Identifier: Apache-2.0
"""What ``asyncmr.prefetch`` / ``discard`` accept, as (address, bytes) ranges, checked before any
CUDA call: a ``(pointer, nbytes)`` pair, anything with ``__cuda_array_interface__`` (CuPy and
Numba arrays, PyTorch tensors, ``rmm.DeviceBuffer``), or a list or tuple of those."""

from __future__ import annotations

from typing import Any

from asyncmr._validate import as_integer, ascii_digits

_U64 = 1 << 64
_TYPE_KINDS = frozenset("biufcmMOSUV")  # the array interface's type kinds


def _int(value: Any, what: str) -> int:
    return as_integer(value, f"asyncmr: {what}")


def _is_pair(item: Any) -> bool:
    """A 2-tuple of two values that are not ranges themselves (not a sequence, no array
    interface): a pair, whose values ``_pair`` then checks, so a wrong one is named as the
    pointer or the size it stands for."""
    return isinstance(item, tuple) and len(item) == 2 and not any(
        isinstance(v, (tuple, list)) or hasattr(v, "__cuda_array_interface__") for v in item)


def _pair(ptr: Any, nbytes: Any, where: str) -> tuple[int, int]:
    p, n = _int(ptr, f"{where} pointer"), _int(nbytes, f"{where} size")
    if not 0 <= p < _U64:
        raise ValueError(f"asyncmr: {where} pointer must be in [0, 2**64), got {p}")
    if not 0 <= n < _U64:
        raise ValueError(f"asyncmr: {where} size must be in [0, 2**64) bytes, got {n}")
    if p == 0 and n != 0:
        raise ValueError(f"asyncmr: {where} is a null pointer of {n} bytes")
    if p + n > _U64:
        raise ValueError(f"asyncmr: {where} ({p:#x}, {n} bytes) ends past 2**64")
    return p, n


def _from_interface(obj: Any, where: str) -> tuple[int, int]:
    cai = obj.__cuda_array_interface__
    if not isinstance(cai, dict) or "data" not in cai or "shape" not in cai:
        raise ValueError(f"asyncmr: {where} has a malformed __cuda_array_interface__")
    data = cai["data"]
    if isinstance(data, (tuple, list)) and len(data) != 2:
        raise ValueError(f"asyncmr: {where} has a malformed __cuda_array_interface__ data entry "
                         f"(a (pointer, read_only) pair), got {data!r}")
    ptr = data[0] if isinstance(data, (tuple, list)) else data
    ptr = 0 if ptr is None else _int(ptr, f"{where} pointer")
    if not isinstance(cai["shape"], (tuple, list)):
        raise TypeError(f"asyncmr: {where} __cuda_array_interface__ shape must be a tuple of "
                        f"ints, got {type(cai['shape']).__name__}")
    shape = tuple(_int(n, f"{where} shape") for n in cai["shape"])
    if any(n < 0 for n in shape):
        raise ValueError(f"asyncmr: {where} shape entries must be >= 0, got shape {shape}")
    if "typestr" not in cai:  # required by the interface: without it no size can be known
        raise ValueError(f"asyncmr: {where} __cuda_array_interface__ has no typestr")
    typestr = str(cai["typestr"])
    # A byte order, a kind and an item size of 1 to 10 digits, at least one byte ('<f4', '|u1').
    if (len(typestr) > 12 or typestr[:1] not in ("<", ">", "|", "=")
            or typestr[1:2] not in _TYPE_KINDS or not ascii_digits(typestr[2:])
            or int(typestr[2:]) == 0):
        raise ValueError(f"asyncmr: {where} has an unknown typestr {typestr!r}")
    itemsize = int(typestr[2:])
    strides = cai.get("strides")
    if strides is not None:
        if not isinstance(strides, (tuple, list)):
            raise TypeError(f"asyncmr: {where} __cuda_array_interface__ strides must be None or a "
                            f"tuple of ints, got {type(strides).__name__}")
        strides = tuple(_int(step, f"{where} stride") for step in strides)
        if len(strides) != len(shape):
            raise ValueError(f"asyncmr: {where} strides {strides} do not match shape {shape}")
    if 0 in shape:
        return _pair(ptr, 0, where)
    if strides is None:  # C-contiguous
        count = 1
        for n in shape:
            count *= n
        return _pair(ptr, count * itemsize, where)
    low = high = 0
    for n, stride in zip(shape, strides):
        span = (n - 1) * stride
        low, high = low + min(0, span), high + max(0, span)
    return _pair(ptr + low, high - low + itemsize, where)


def ranges(obj: Any) -> list[tuple[int, int]]:
    """Every range ``obj`` names, in order."""
    def one(item: Any, where: str) -> tuple[int, int]:
        if hasattr(item, "__cuda_array_interface__"):
            return _from_interface(item, where)
        if _is_pair(item):
            return _pair(item[0], item[1], where)
        raise TypeError(f"asyncmr: {where} must be a (pointer, nbytes) pair or have "
                        f"__cuda_array_interface__, got {type(item).__name__}")

    if isinstance(obj, (list, tuple)) and not _is_pair(obj):
        return [one(item, f"range {i}") for i, item in enumerate(obj)]
    return [one(obj, "the range")]

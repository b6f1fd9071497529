# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3, embedsignature=True
"""Sharing pools and allocations between processes (src/ipc.cpp): exported pointers, the export
handle types of a pool, and imported allocations."""

from cython.operator cimport dereference as deref

from rmm.pylibrmm.stream cimport Stream
from rmm.pylibrmm.utils cimport as_stream

from asyncmr import _validate


def export_pointer(ptr):
    """The 64 bytes another process needs to import allocation ``ptr`` (an int address from a
    pool created with export handle types) with :meth:`MemPool.import_pointer`. Export the
    pool (:meth:`MemPool.export_fd`) first: the driver refuses the allocations of a pool it has
    not exported. Do not free ``ptr`` before every importer has released its import."""
    _validate.not_a_number("ptr must be a non-zero int address", ptr)
    ptr = _validate.as_integer(ptr, "ptr", "a non-zero int address")
    if not 0 <= ptr < 2**64:  # a pointer; C++ refuses a null one
        raise ValueError(f"ptr must be a 64-bit address, got {ptr}")
    cdef exported_pointer data = c_export_pointer(<void*><uintptr_t>ptr)
    return bytes([data.bytes[i] for i in range(64)])


_EXPORT_HANDLES = {h.name: h for h in ExportHandle}


cdef int export_handle_bits(value) except -1:
    """export_handle_types: None, a name ("posix_fd", "fabric"), names, or an int of bits."""
    if value is None:
        return 0
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, ExportHandle):  # another enum's member is a name, not bits
        _validate.not_a_number("export_handle_types must be 'posix_fd', 'fabric', an "
                               "ExportHandle, a list of them, or an int", value)
    bits = _validate.integer(value)
    if bits is not None:
        if not 0 <= bits < 2**31:
            raise ValueError(f"export_handle_types must be in [0, 2**31), got {bits}")
        return bits  # bits no handle type has: mem_pool::create refuses them
    if isinstance(value, bool):
        raise TypeError("export_handle_types must be a name, names or an int, got bool")
    names = _validate.items(value, "export_handle_types must be 'posix_fd', 'fabric', a list "
                                   "of them, or an int")
    bits = 0
    for name in names:
        if isinstance(name, ExportHandle):
            bits |= int(name)
            continue
        if not isinstance(name, str):
            raise TypeError("export handle types in a list are names or asyncmr.ExportHandle, "
                            f"got {_validate.type_name(name)}")
        handle = _EXPORT_HANDLES.get(name)
        if handle is None:
            raise ValueError(f"unknown export handle type {name!r}; expected one of "
                             f"{tuple(_EXPORT_HANDLES)}")
        bits |= int(handle)
    return bits


cdef class ImportedAllocation:
    """An allocation of another process, mapped into this one by
    :meth:`MemPool.import_pointer`. ``ptr`` is its address here, ``nbytes`` its size.

    ``release(stream=None)`` frees the mapping (``cudaFreeAsync`` on ``stream``, or on a stream
    of its own, then waits for it, so the exporter may free its allocation once every importer
    returned); a ``with`` block or the object's death releases it too. The imported pool lives at least as
    long.
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("use MemPool.import_pointer()")

    @staticmethod
    cdef ImportedAllocation _make(object pool, unique_ptr[imported_allocation]& imported,
                                  size_t nbytes):
        cdef ImportedAllocation self = ImportedAllocation.__new__(ImportedAllocation)
        self.pool = pool
        self.ptr = import_address(deref(imported))
        self.nbytes = nbytes
        self.c_import.swap(imported)
        return self

    @property
    def released(self):
        return not self.c_import or deref(self.c_import).released()

    def release(self, stream=None):
        """Free the mapping in stream order and wait for it. Idempotent.

        On ``stream`` when given (an ``rmm`` ``Stream``); by default on a stream of its own,
        made for the call in the context the import was made in, which is safe while another
        thread captures a graph in any mode (the legacy default stream is not: work queued there
        breaks a capture on any blocking stream of the device). ``with`` and the object's death
        release it that way too.

        A stream that is capturing is refused (:class:`UnsupportedError`) and nothing changes;
        if the driver refuses the free, :class:`CUDAError` is raised and the import stays live.
        """
        if not self.c_import:
            return
        cdef uintptr_t s = 0
        if stream is None:
            with nogil:  # idempotent there: a second caller returns once the first's has run
                release_import_on_own_stream(deref(self.c_import))
            return
        s = <uintptr_t>(<Stream?>as_stream(stream))._cuda_stream
        with nogil:
            release_import(deref(self.c_import), s)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __dealloc__(self):
        # The C++ object releases a live import on a stream of its own (never throwing),
        # waiting without the GIL: a Python host function queued anywhere can still run.
        with nogil:
            self.c_import.reset()

    def __repr__(self):
        state = "released" if self.released else "live"
        return f"ImportedAllocation(ptr={self.ptr:#x}, nbytes={self.nbytes}, {state})"

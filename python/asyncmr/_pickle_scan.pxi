# SPDX-License-Identifier: Apache-2.0
# Included by _core.pyx. For asyncmr.history's reader (_pickle_files.py): how deep a pickle
# nests its values, and whether it hashes one whose hash can cost more than its bytes, at C
# speed, before the unpickler builds any (_pickle_scan.hpp).

cdef extern from "_pickle_scan.hpp" namespace "asyncmr_py" nogil:
    const size_t pickle_table_row
    long long pickle_nesting(const unsigned char* data, size_t n, const unsigned char* table,
                             long long limit, long long* hashed_at,
                             long long* memo_at) except +


def _pickle_nesting(const unsigned char[::1] data, const unsigned char[::1] table, long long limit):
    """``(deepest, hashed_at, memo_at)``: the deepest nesting of the values the pickle ``data``
    builds (stopping once past ``limit``), or -1 when it is not a pickle ``table`` describes (see
    _pickle_files._opcode_table); the offset of the first opcode that hashes a value the table
    does not call hashable (a dict key, a set item), or -1; the offset of the first memo put
    of an index not below ``data``'s size, or -1."""
    if table.shape[0] != 256 * pickle_table_row:
        raise ValueError(f"asyncmr: the opcode table has {table.shape[0]} bytes, not "
                         f"{256 * pickle_table_row}")
    if data.shape[0] == 0:
        return -1, -1, -1
    cdef long long deepest
    cdef long long hashed_at = -1
    cdef long long memo_at = -1
    with nogil:
        deepest = pickle_nesting(&data[0], data.shape[0], &table[0], limit, &hashed_at,
                                 &memo_at)
    return deepest, hashed_at, memo_at

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// How deep a pickle nests its values, read off its opcodes without building any (for
// asyncmr.history, before its unpickler runs: CPython's C unpickler hashes a dict key, and
// Python prints and compares values, recursively, and a tuple nested a million deep killed the
// interpreter). What each opcode takes and does to the stack comes from Python's pickletools
// (history.py builds the table); this walks the bytes at C speed, as pickletools.genops would.

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace asyncmr_py {

/// Bytes per opcode in the table: argument kind, what, values popped below the mark (or all),
/// pops to a mark, values pushed, pushes a mark, how the memo index is written.
inline constexpr std::size_t pickle_table_row = 7;

/// Argument kinds (`arg`, as a signed byte): >= 0 a fixed number of bytes, or one of these.
enum pickle_arg : std::int8_t {
  arg_line      = -1,  // up to and including a newline
  arg_len1      = -2,  // a 1-byte length, then that many bytes
  arg_len4      = -3,  // a signed 4-byte little-endian length (negative: not a pickle)
  arg_len4u     = -4,  // an unsigned 4-byte length
  arg_len8u     = -5,  // an unsigned 8-byte length
  arg_two_lines = -6,  // two newline-ended lines (GLOBAL, INST)
  arg_unknown   = -100,  // not an opcode
};

/// What an opcode does besides its stack effect.
enum pickle_what : std::uint8_t {
  op_plain = 0,
  op_fills = 1,  // fills a container it leaves on the stack (APPEND, SETITEMS, ...)
  op_put   = 2,
  op_memoize = 3,
  op_get   = 4,
  op_stop  = 5,
};

/// How a memo index is written in the argument.
enum pickle_memo_arg : std::uint8_t { memo_none = 0, memo_text = 1, memo_u1 = 2, memo_u4 = 3 };

/**
 * The deepest nesting of the values `data` builds (an atom or an empty container 0, a container
 * one more than the deepest value put in it), stopping once past `limit`; -1 when `data` is not
 * a pickle `table` (256 rows of `pickle_table_row` bytes) describes: an unknown opcode, an
 * argument past the end, a pop from an empty stack, no STOP.
 */
inline long long pickle_nesting(unsigned char const* data,
                                std::size_t n,
                                unsigned char const* table,
                                long long limit)
{
  std::vector<long long> stack;  // depths; -1 is a mark
  // The memo: indices below the input's size (every index a pickle of ours writes: MEMOIZE
  // counts up) in a vector, the rest in an ordered map. Not a hash table: a file could choose
  // indices that all land in one bucket and make the scan quadratic.
  std::vector<long long> memo_dense;
  std::map<std::uint64_t, long long> memo_sparse;
  std::uint64_t memo_count = 0;
  auto memo_get = [&](std::uint64_t index) -> long long {
    if (index < memo_dense.size()) { return memo_dense[static_cast<std::size_t>(index)]; }
    auto const found = memo_sparse.find(index);
    return found == memo_sparse.end() ? 0 : found->second;
  };
  auto memo_put = [&](std::uint64_t index, long long depth) {
    if (index < n) {
      if (index >= memo_dense.size()) {
        memo_dense.resize(static_cast<std::size_t>(index) + 1, -2);  // -2: not memoized
      }
      if (memo_dense[static_cast<std::size_t>(index)] == -2) { ++memo_count; }
      memo_dense[static_cast<std::size_t>(index)] = depth;
    } else if (memo_sparse.insert_or_assign(index, depth).second) {
      ++memo_count;
    }
  };
  long long deepest = 0;
  std::size_t i     = 0;
  auto read_le      = [&](std::size_t at, std::size_t bytes) {
    std::uint64_t v = 0;
    for (std::size_t k = 0; k < bytes; ++k) { v |= std::uint64_t{data[at + k]} << (8 * k); }
    return v;
  };
  auto line_end = [&](std::size_t from) -> std::size_t {  // index past the newline, or 0
    for (std::size_t k = from; k < n; ++k) {
      if (data[k] == '\n') { return k + 1; }
    }
    return 0;
  };
  while (i < n) {
    unsigned char const* row = table + std::size_t{data[i++]} * pickle_table_row;
    auto const arg           = static_cast<std::int8_t>(row[0]);
    auto const what          = row[1];
    std::size_t const fixed  = row[2];
    bool const to_mark       = row[3] != 0;
    std::size_t const pushed = row[4];
    bool const pushes_mark   = row[5] != 0;
    auto const memo_arg      = row[6];
    std::size_t const at     = i;  // the argument's first byte
    std::size_t end          = i;
    switch (arg) {
      case arg_unknown: return -1;
      case arg_line:
        end = line_end(i);
        if (end == 0) { return -1; }
        break;
      case arg_two_lines:
        end = line_end(i);
        if (end == 0 || (end = line_end(end)) == 0) { return -1; }
        break;
      case arg_len1:
      case arg_len4:
      case arg_len4u:
      case arg_len8u: {
        std::size_t const width = arg == arg_len1 ? 1 : arg == arg_len8u ? 8 : 4;
        if (n - i < width) { return -1; }
        std::uint64_t length = read_le(i, width);
        if (arg == arg_len4 && (length & 0x80000000ULL) != 0) { return -1; }
        if (length > n - i - width) { return -1; }
        end = i + width + static_cast<std::size_t>(length);
        break;
      }
      default:
        if (arg < 0 || n - i < static_cast<std::size_t>(arg)) { return -1; }
        end = i + static_cast<std::size_t>(arg);
    }
    i = end;
    if (what == op_stop) { return deepest; }
    if (what == op_put || what == op_memoize || what == op_get) {
      std::uint64_t index = memo_count;
      if (what != op_memoize) {
        if (memo_arg == memo_u1) {
          index = data[at];
        } else if (memo_arg == memo_u4) {
          index = read_le(at, 4);
        } else {  // decimal text up to the newline
          index = 0;
          for (std::size_t k = at; k + 1 < end; ++k) {
            if (data[k] < '0' || data[k] > '9') { return -1; }
            index = index * 10 + (data[k] - '0');
          }
        }
      }
      if (what == op_get) {
        long long const depth = memo_get(index);
        stack.push_back(depth < 0 ? 0 : depth);  // never memoized: the unpickler refuses it
      } else {
        memo_put(index, stack.empty() ? 0 : stack.back());
      }
      continue;
    }
    long long items = -1;  // the deepest value popped above the mark
    if (to_mark) {
      for (;;) {
        if (stack.empty()) { return -1; }
        long long const v = stack.back();
        stack.pop_back();
        if (v == -1) { break; }
        if (v > items) { items = v; }
      }
    }
    if (stack.size() < fixed) { return -1; }
    long long depth = 0;
    if (what == op_fills && fixed > 0) {
      // The container (the lowest value popped) keeps its depth; what goes in is one deeper.
      long long const container = stack[stack.size() - fixed];
      for (std::size_t k = stack.size() - fixed + 1; k < stack.size(); ++k) {
        if (stack[k] > items) { items = stack[k]; }
      }
      depth = container > items + 1 ? container : items + 1;
    } else {
      for (std::size_t k = stack.size() - fixed; k < stack.size(); ++k) {
        if (stack[k] > items) { items = stack[k]; }
      }
      depth = items + 1;
    }
    stack.resize(stack.size() - fixed);
    if (pushes_mark) {
      stack.push_back(-1);
    } else if (pushed != 0) {
      for (std::size_t k = 0; k < pushed; ++k) { stack.push_back(depth); }
      if (depth > deepest) {
        deepest = depth;
        if (deepest > limit) { return deepest; }
      }
    }
  }
  return -1;  // no STOP
}

}  // namespace asyncmr_py

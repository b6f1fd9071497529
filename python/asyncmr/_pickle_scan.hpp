/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// How deep a pickle nests its values, read off its opcodes without building any (for
// asyncmr.history, before its unpickler runs: CPython's C unpickler hashes a dict key, and
// Python prints and compares values, recursively, and a tuple nested a million deep killed the
// interpreter), and whether the unpickler would hash a value whose hash can cost more than its
// bytes (a tuple of shared tuples 61 levels deep has 2**60 paths, and CPython caches no tuple's
// hash; ints a file chooses can share one hash, which makes a dict quadratic). What each opcode
// takes and does to the stack comes from Python's pickletools (_pickle_files.py builds the
// table); this walks the bytes at C speed, as pickletools.genops would.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <vector>

namespace asyncmr_py {

/// Bytes per opcode in the table: argument kind, what, values popped below the mark (or all),
/// pops to a mark, values pushed, pushes a mark, how the memo index is written, which values put
/// in it the unpickler hashes.
inline constexpr std::size_t pickle_table_row = 8;

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
  op_atom  = 6,  // pushes a value that holds nothing and takes nothing in (int, str, None, ...)
  op_hashable_atom = 7,  // an atom whose hash costs its bytes, from values a file cannot steer
};

/// Which values the opcode hashes, of those it puts in a dict or set (past the container).
enum pickle_hashes : std::uint8_t { hashes_none = 0, hashes_keys = 1, hashes_all = 2 };

/// How a memo index is written in the argument.
enum pickle_memo_arg : std::uint8_t { memo_none = 0, memo_text = 1, memo_u1 = 2, memo_u4 = 3 };

/**
 * The deepest nesting of the values `data` builds (an atom or an empty container 0, a container
 * one more than the deepest value put in it, counted with everything put in it before STOP),
 * stopping once past `limit`; the largest long long for a value that holds itself (it nests
 * without end); -1 when `data` is not a pickle `table` (256 rows of `pickle_table_row` bytes)
 * describes: an unknown opcode, an argument past the end, a pop from an empty stack, no STOP.
 * `*hashed_at` is set to the offset of the first opcode that hashes (as a dict key or set item)
 * a value not pushed by an `op_hashable_atom` opcode, if any; `*memo_at` to the offset of the
 * first memo put (PUT, BINPUT, LONG_BINPUT) of an index not below `n`: CPython's unpickler grows
 * its memo, an array, to twice the index put, and a pickler numbers its memo from 0, one entry
 * per value written, so such an index is a file's way to make a few bytes allocate gigabytes.
 * The scan reads on regardless of either.
 *
 * Linear in `data`'s size, in time and memory: a container a memo GET or a DUP names again can
 * be filled after another container took it (a list memoized empty, appended to a tuple, then
 * filled through GET), deepening that other, so such values are followed by identity: each
 * keeps its depth and the containers holding it, and when one deepens while held (rare: the
 * pickler fills every container before naming it again, unless it holds itself) the depths are
 * recomputed at STOP, children before parents, once over those links.
 */
inline long long pickle_nesting(unsigned char const* data,
                                std::size_t n,
                                unsigned char const* table,
                                long long limit,
                                long long* hashed_at,
                                long long* memo_at)
{
  // Stack (and memo) entries: >= 0 the depth of a value nothing else names, -1 a mark, -2 a
  // hashable atom (depth 0), below -2 a value the memo or a DUP may name twice,
  // `shared[-3 - entry]`. A value nothing else names cannot be reached once a container takes
  // it, so its depth is final there.
  struct shared_value {
    long long depth;
    std::size_t holders;  // the first of the links to the containers holding it, or `none`
  };
  struct holder_link {
    std::size_t holder;
    std::size_t next;  // the value's next link, or `none`
  };
  constexpr std::size_t none  = std::numeric_limits<std::size_t>::max();
  constexpr long long unset   = std::numeric_limits<long long>::min();  // a memo slot not written
  constexpr long long endless = std::numeric_limits<long long>::max();
  std::vector<long long> stack;
  std::vector<shared_value> shared;
  std::vector<holder_link> links;
  bool deepened_while_held = false;
  // The top was pushed as an atom: memoized, it stays an atom, not a shared value (the
  // unpickler fills no int, str or None, and a history names its strings, its dict keys,
  // through the memo millions of times).
  bool top_is_atom = false;
  constexpr long long hashable = -2;
  auto is_shared = [](long long entry) { return entry < hashable; };
  auto shared_of = [](long long entry) { return static_cast<std::size_t>(-3 - entry); };
  auto new_shared = [&](long long depth) {
    shared.push_back({depth, none});
    return -3 - static_cast<long long>(shared.size() - 1);
  };
  auto depth_of = [&](long long entry) {
    return is_shared(entry) ? shared[shared_of(entry)].depth : entry == hashable ? 0 : entry;
  };
  // `entry` may be named twice from now on; an atom holds nothing to follow.
  auto share = [&](long long& entry) {
    if (!is_shared(entry) && entry != hashable) { entry = new_shared(entry < 0 ? 0 : entry); }
  };
  // The memo: indices below the input's size (every index a pickle of ours writes: MEMOIZE
  // counts up) in a vector, the rest in an ordered map. Not a hash table: a file could choose
  // indices that all land in one bucket and make the scan quadratic.
  std::vector<long long> memo_dense;
  std::map<std::uint64_t, long long> memo_sparse;
  std::uint64_t memo_count = 0;
  auto memo_get = [&](std::uint64_t index) -> long long {
    if (index < memo_dense.size()) { return memo_dense[static_cast<std::size_t>(index)]; }
    auto const found = memo_sparse.find(index);
    return found == memo_sparse.end() ? unset : found->second;
  };
  auto memo_put = [&](std::uint64_t index, long long entry) {
    if (index < n) {
      if (index >= memo_dense.size()) {
        memo_dense.resize(static_cast<std::size_t>(index) + 1, unset);
      }
      if (memo_dense[static_cast<std::size_t>(index)] == unset) { ++memo_count; }
      memo_dense[static_cast<std::size_t>(index)] = entry;
    } else if (memo_sparse.insert_or_assign(index, entry).second) {
      ++memo_count;
    }
  };
  // Every shared value's depth once all it holds is counted: children before the containers
  // holding them (Kahn's order over the links); a value never reached lies on a cycle.
  auto settle = [&](long long deepest) -> long long {
    std::vector<std::size_t> unsettled(shared.size(), 0);  // shared values each one holds
    for (auto const& link : links) { ++unsettled[link.holder]; }
    std::vector<std::size_t> ready;
    for (std::size_t k = 0; k < shared.size(); ++k) {
      if (unsettled[k] == 0) { ready.push_back(k); }
    }
    std::size_t settled = 0;
    while (!ready.empty()) {
      std::size_t const value = ready.back();
      ready.pop_back();
      ++settled;
      long long const depth = shared[value].depth;
      if (depth > deepest) {
        deepest = depth;
        if (deepest > limit) { return deepest; }
      }
      for (std::size_t l = shared[value].holders; l != none; l = links[l].next) {
        shared_value& holder = shared[links[l].holder];
        if (depth + 1 > holder.depth) { holder.depth = depth + 1; }
        if (--unsettled[links[l].holder] == 0) { ready.push_back(links[l].holder); }
      }
    }
    return settled == shared.size() ? deepest : endless;
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
    if (what == op_stop) { return deepened_while_held ? settle(deepest) : deepest; }
    if (what == op_put || what == op_memoize || what == op_get) {
      std::uint64_t index = memo_count;
      if (what != op_memoize) {
        if (memo_arg == memo_u1) {
          index = data[at];
        } else if (memo_arg == memo_u4) {
          index = read_le(at, 4);
        } else {  // decimal text up to the newline (saturating: a longer one is past `n`)
          index = 0;
          for (std::size_t k = at; k + 1 < end; ++k) {
            if (data[k] < '0' || data[k] > '9') { return -1; }
            std::uint64_t const digit = data[k] - '0';
            constexpr std::uint64_t top = std::numeric_limits<std::uint64_t>::max();
            index = index > (top - digit) / 10 ? top : index * 10 + digit;
          }
        }
      }
      if (what == op_put && index >= n && *memo_at < 0) {
        *memo_at = static_cast<long long>(at) - 1;
      }
      if (what == op_get) {
        long long const entry = memo_get(index);
        stack.push_back(entry == unset ? 0 : entry);  // never memoized: the unpickler refuses it
        top_is_atom = false;
      } else if (stack.empty() || stack.back() == -1) {
        memo_put(index, 0);  // nothing to memoize (the unpickler refuses that)
      } else if (top_is_atom || stack.back() == hashable) {
        memo_put(index, stack.back());  // an atom, named again as itself
      } else {
        share(stack.back());
        memo_put(index, stack.back());
      }
      continue;
    }
    top_is_atom = what == op_atom || what == op_hashable_atom;
    // The values popped: `fixed` below the mark at `mark` (or the top `fixed`), and all above it.
    std::size_t mark = stack.size();
    if (to_mark) {
      do {
        if (mark == 0) { return -1; }
      } while (stack[--mark] != -1);
    }
    if (mark < fixed) { return -1; }
    std::size_t const base = mark - fixed;
    bool const fills       = what == op_fills && fixed > 0;  // stack[base] is the container
    long long items        = -1;  // the deepest value put in the container or the new value
    bool holds_shared      = false;
    auto const hashes      = row[7];
    std::size_t put        = 0;  // values put in so far: keys are the even ones
    for (std::size_t k = fills ? base + 1 : base; k < stack.size(); ++k) {
      if (k == mark) { continue; }
      if (depth_of(stack[k]) > items) { items = depth_of(stack[k]); }
      holds_shared = holds_shared || is_shared(stack[k]);
      bool const hashed = hashes == hashes_all || (hashes == hashes_keys && put % 2 == 0);
      if (hashed && stack[k] != hashable && *hashed_at < 0) {
        *hashed_at = static_cast<long long>(at) - 1;
      }
      ++put;
    }
    if (pushed == 0 || pushes_mark) {  // POP, POP_MARK, MARK, ...: nothing built
      stack.resize(base);
      if (pushes_mark) { stack.push_back(-1); }
      continue;
    }
    if (what == op_hashable_atom) {
      stack.push_back(hashable);
      continue;
    }
    long long depth  = items + 1;
    long long result = depth;  // what is pushed: the depth, unless the value is shared
    if (fills) {
      long long& container = stack[base];
      if (depth_of(container) > depth) { depth = depth_of(container); }
      // DUP names the container twice; a container holding a shared value deepens with it.
      if (holds_shared || pushed > 1) { share(container); }
      // A DUP of an atom pushes the atom twice.
      bool const same = is_shared(container) || (container == hashable && pushed > 1);
      result          = same ? container : depth;
    } else if (holds_shared) {
      result = new_shared(depth);
    }
    if (is_shared(result)) {
      std::size_t const holder = shared_of(result);
      // Linked before the depth changes: a container that holds itself is then held, deepening.
      for (std::size_t k = fills ? base + 1 : base; k < stack.size(); ++k) {
        if (k == mark || !is_shared(stack[k])) { continue; }
        shared_value& value = shared[shared_of(stack[k])];
        links.push_back({holder, value.holders});
        value.holders = links.size() - 1;
      }
      if (depth > shared[holder].depth) {
        deepened_while_held = deepened_while_held || shared[holder].holders != none;
        shared[holder].depth = depth;
      }
    }
    stack.resize(base);
    for (std::size_t k = 0; k < pushed; ++k) { stack.push_back(result); }
    if (depth > deepest) {
      deepest = depth;
      if (deepest > limit) { return deepest; }
    }
  }
  return -1;  // no STOP
}

}  // namespace asyncmr_py

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Private to src/: the pieces of the front cache (include/asyncmr/detail/front_cache.hpp) its
// three source files share: a bucket, the lock scope, the block lists, the ownership record's
// slot encoding and the class table. front_cache.cpp has the lookup, the budget and the hot
// path; front_cache_record.cpp the ownership record; front_cache_release.cpp the way out to the
// pool and the statistics.

#include <asyncmr/detail/front_cache.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace asyncmr::detail {
namespace front_cache_parts {

struct lock_scope {
  explicit lock_scope(spin_lock& l) noexcept : lock{l} { lock.lock(); }
  ~lock_scope() { lock.unlock(); }
  lock_scope(lock_scope const&)            = delete;
  lock_scope& operator=(lock_scope const&) = delete;
  spin_lock& lock;
};

/// Allocates whole cache lines: the block lists of two streams' buckets never share a line (a
/// list of a few pointers from plain malloc would sit next to another stream's, and every put
/// writes into it: false sharing between threads that otherwise touch nothing in common).
template <class T>
struct line_allocator {
  using value_type                  = T;
  static constexpr std::size_t line = 64;
  line_allocator() noexcept         = default;
  template <class U>
  line_allocator(line_allocator<U> const&) noexcept
  {
  }
  [[nodiscard]] T* allocate(std::size_t n)
  {
    return static_cast<T*>(::operator new(rounded(n), std::align_val_t{line}));
  }
  void deallocate(T* p, std::size_t n) noexcept
  {
    ::operator delete(p, rounded(n), std::align_val_t{line});
  }
  static std::size_t rounded(std::size_t n) noexcept
  {
    return (n * sizeof(T) + line - 1) / line * line;
  }
  template <class U>
  bool operator==(line_allocator<U> const&) const noexcept
  {
    return true;
  }
};

// A cached block is listed by its slot in the ownership record (the slot holds its address and
// class), so a hit reads the address and marks it handed out with no search of the record.
using record_slot = std::atomic<std::uint64_t>;
using block_list  = std::vector<record_slot*, line_allocator<record_slot*>>;
using block_lists = std::array<block_list, front_cache::class_count>;

// ---- the ownership record's slots -----------------------------------------------------------
//
// An open-addressing table of 64-bit slots: 0 is empty, anything else is a block's address
// (256-byte aligned, as every CUDA pool allocation is) with its class index in bits 1-7 and bit
// 0 set while the block is cached or parked. A pointer lives in one of the `probe` slots
// starting at the first slot of its home cache line; a block that finds them all taken by other
// blocks is not recorded (and so never cached); a graph's note there gives way to it. Slots
// change by compare-and-swap, so records of different blocks never interfere; the few blocks a
// thread recycles keep their lines in its core.

inline constexpr std::uint64_t cached_bit   = 1;
inline constexpr std::uint64_t class_shift  = 1;
inline constexpr std::uint64_t class_mask   = 0x7f;
inline constexpr std::uint64_t address_mask = ~std::uint64_t{0xff};
inline constexpr std::size_t probe          = 16;  // two cache lines of 8 slots
inline constexpr std::size_t graph_class    = class_mask;  // marks a graph's allocation, not a class
static_assert(front_cache::class_count <= graph_class);

// The epoch's clock (front_cache::stale_after_ns): steady, nanoseconds.
inline std::uint64_t steady_ns() noexcept
{
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      std::chrono::steady_clock::now().time_since_epoch())
                                      .count());
}

inline std::uint64_t address_of(void const* p) noexcept
{
  return reinterpret_cast<std::uintptr_t>(p);
}

inline std::size_t home_slot(std::uint64_t address, std::size_t mask) noexcept
{
  std::uint64_t const h = (address >> 8) * 0x9E3779B97F4A7C15ULL;
  return static_cast<std::size_t>(h >> 20) & mask & ~std::size_t{7};
}

inline std::size_t class_of(std::uint64_t slot) noexcept
{
  return (slot >> class_shift) & class_mask;
}

inline std::uint64_t slot_value(void const* p, std::size_t cls, bool cached) noexcept
{
  return address_of(p) | (std::uint64_t{cls} << class_shift) | (cached ? cached_bit : 0);
}

inline void* address_in(std::uint64_t slot) noexcept
{
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(slot & address_mask));
}

inline std::size_t record_size(std::size_t cap, std::size_t requested)
{
  std::size_t want =
    requested != 0 ? requested : std::clamp<std::size_t>(cap >> 10, 4096, 1 << 20);
  want             = std::max<std::size_t>(want, 1024);
  std::size_t n    = 1024;
  while (n < want) { n <<= 1; }
  return n;
}

inline constexpr auto class_table = [] {
  std::array<std::size_t, front_cache::class_count> t{};
  for (std::size_t i = 0; i < t.size(); ++i) { t[i] = front_cache::class_bytes(i); }
  return t;
}();

}  // namespace front_cache_parts

struct alignas(64) front_cache::bucket {
  // Guarded by `lock`. `key` and `bound` change under both `lock` and the registry lock (when a
  // bucket is bound to a stream, or unbound for reuse).
  spin_lock lock;
  stream_key key{};
  bool bound{false};
  std::size_t cached{};  // bytes of blocks in `free`, at class size
  std::size_t blocks{};
  std::size_t credit{};  // bytes reserved from the global budget and not used by a block
  std::size_t grant{};   // credit the next reservation asks for (doubles up to chunk_)
  std::size_t parked_bytes{};
  std::size_t parked_blocks{};
  std::uint64_t parked_proof{};  // proof_ as read after the last park (see park)
  std::uint64_t seen{};          // epoch of the last take or put
  std::uint64_t hits{};
  std::uint64_t misses{};
  std::uint64_t refused_cap{};
  std::uint64_t refused_uncacheable{};
  std::uint64_t refused_not_recorded{};
  std::uint64_t refused_wrong_size{};
  std::uint64_t refused_double_free{};
  std::uint64_t refused_unmarked{};
  std::uint64_t refused_no_memory{};
  void* marker{nullptr};  // the owner's marker of this bucket's stream (see "Markers")
  front_cache_parts::block_lists free;    // LIFO per class: the warmest block first
  front_cache_parts::block_lists parked;  // detached, their release ordered (free_parked)
};

}  // namespace asyncmr::detail

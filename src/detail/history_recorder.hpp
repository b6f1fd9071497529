/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Private to src/: a resource's allocation history, the part `pool_resource` holds for
// `start_history` and shares between its copies. The ring it records into is
// detail/history.hpp (no CUDA); this part stamps each event with the pool's state.

#include <asyncmr/detail/history.hpp>
#include <asyncmr/mem_pool.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace asyncmr::detail {

// The longest a recording goes without reading the pool's reserved and used bytes (while events
// come): trims the driver makes at synchronizations are seen at most this late.
inline constexpr std::uint64_t history_pool_read_ns = 100'000;

/**
 * Records a resource's events into a ring while a recording runs. Each event carries the pool's
 * reserved and used bytes right after it without asking the driver every time (two attribute
 * reads cost several times an uncached pair): `used` moves by each allocation's and free's
 * bytes; the pool itself is read when an allocation may grow it (fewer known unused reserved
 * bytes than it asks for), when the last read is older than `history_pool_read_ns`, and on every
 * oom and trim. Each read sets both values exactly, and a change in the reserved bytes it finds
 * is recorded as a grow or trim event a tick before the event that found it.
 */
class history_recorder {
 public:
  /// Starts a recording of `max_events` events into a new ring.
  /// @throws std::invalid_argument for 0 or too many events; std::logic_error while one runs
  void start(mem_pool const& pool, std::size_t max_events);
  /// Stops the recording: its events, oldest first; `dropped` gets how many were lost.
  /// @throws std::logic_error when none runs
  [[nodiscard]] std::vector<history_event> stop(std::uint64_t& dropped);
  /// The events recorded so far, oldest first, without stopping. @throws as `stop`
  [[nodiscard]] std::vector<history_event> read(std::uint64_t& dropped) const;
  /// The ring to record into now, or null: one load, on every allocation and free.
  [[nodiscard]] history_ring* active() const noexcept { return recordings_.active(); }

  /// An event of a pair (alloc, free, cache_hit, cache_put), stamped `now`: a hit or a put leaves
  /// the pool's known state as it is; an allocation or free moves `used` by its bytes. The pool
  /// is read when it is due, or when an allocation may have grown it. `cached`: the bytes the
  /// resource's front cache holds. An allocation is stamped after it returns, a free before it
  /// is made: once a block is back, another thread may get it, whose event must come later.
  void pair(history_ring& ring, mem_pool const& pool, history_action action, void const* ptr,
            std::size_t bytes, cudaStream_t stream, std::uint64_t now, std::size_t cached) noexcept;
  /// An oom or a trim (`bytes`: the allocation that failed, or 0): the pool read now.
  void pool_event(history_ring& ring, mem_pool const& pool, history_action action,
                  std::size_t bytes, cudaStream_t stream, std::size_t cached) noexcept;

 private:
  // Records `e` (a trim records nothing itself), after a grow or trim event if a read of the
  // pool (`forced`, or when it is due) finds its reserved bytes changed.
  void read_pool(history_ring& ring, mem_pool const& pool, history_event e, bool forced) noexcept;
  // Sets read_period_ (and period_settled_) from the counter's rate as measured now.
  void measure_read_period() noexcept;
  // An event's own part, with the pool's state as last known: what pair() and pool_event() share.
  [[nodiscard]] history_event known_event(std::uint64_t now, history_action action,
                                          void const* ptr, std::size_t bytes,
                                          cudaStream_t stream, std::size_t cached) const noexcept
  {
    history_event e{};
    e.time_ns  = now;
    e.address  = reinterpret_cast<std::uintptr_t>(ptr);
    e.bytes    = bytes;
    e.stream   = reinterpret_cast<std::uintptr_t>(stream);
    e.cached   = cached;
    e.action   = action;
    e.reserved = last_reserved_.load(std::memory_order_relaxed);
    e.used     = last_used_.load(std::memory_order_relaxed);
    return e;
  }

  history_owner recordings_;  // record into recordings_.active(), with &recordings_
  // The pool's reserved bytes at the last event that read them, to notice growth and trims.
  std::atomic<std::uint64_t> last_reserved_{0};
  // The pool's used bytes as last read, moved since by each allocation's and free's bytes.
  std::atomic<std::uint64_t> last_used_{0};
  std::atomic<std::uint64_t> last_read_{0};    // history_stamp() of the last read of the pool
  std::atomic<std::uint64_t> read_period_{0};  // history_pool_read_ns in stamps, at most
  // Whether read_period_ is at the counter's measured rate; until then (the first ~100 us of a
  // process's first recording) each read of the pool takes it again.
  std::atomic<bool> period_settled_{false};
  mutable std::mutex lock_;  // start, stop and reads of the events
};

// Stamps from `then` to `now`, 0 when `then` is the later: a free is stamped before it is made,
// so another thread's read of the pool may come after its stamp (the difference must not wrap).
[[gnu::always_inline]] inline std::uint64_t stamps_since(std::uint64_t now,
                                                         std::uint64_t then) noexcept
{
  return now > then ? now - then : 0;
}

// Inline: it runs on every recorded allocation and free.
[[gnu::always_inline]] inline void history_recorder::pair(history_ring& ring,
                                                          mem_pool const& pool,
                                                          history_action action,
                                                          void const* ptr,
                                                          std::size_t bytes,
                                                          cudaStream_t stream,
                                                          std::uint64_t now,
                                                          std::size_t cached) noexcept
{
  history_event e = known_event(now, action, ptr, bytes, stream, cached);
  // `used` moves by a load and a store, not a read-modify-write: two locked instructions on
  // every recorded pair otherwise (benchmark section 11 measures the recording's cost). Events
  // racing on several threads may lose each other's move until the next read of the pool sets it
  // right (at most history_pool_read_ns later); one thread's events are exact between reads.
  bool may_grow = false;
  if (action == history_action::alloc) {
    e.used += bytes;
    may_grow = e.reserved < e.used;
    last_used_.store(e.used, std::memory_order_relaxed);
  } else if (action == history_action::free) {
    e.used = e.used > bytes ? e.used - bytes : 0;
    last_used_.store(e.used, std::memory_order_relaxed);
  }
  if (may_grow || stamps_since(now, last_read_.load(std::memory_order_relaxed)) >=
                    read_period_.load(std::memory_order_relaxed)) [[unlikely]] {
    read_pool(ring, pool, e, may_grow);
    return;
  }
  ring.record(e, &recordings_);
}

}  // namespace asyncmr::detail

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file history.hpp
 * @brief What a resource's allocation history holds (`pool_resource::start_history`): its events,
 * and the number of the event the calling thread recorded last. The ring that records them is
 * `detail/history.hpp`; Python's `asyncmr.history` reads them.
 */

#include <cstdint>

namespace asyncmr {

/// @brief What an event records.
enum class history_action : std::uint32_t {
  alloc     = 0,  ///< an allocation the pool served
  free      = 1,  ///< a free that went to the pool
  cache_hit = 2,  ///< an allocation the front cache served
  cache_put = 3,  ///< a free the front cache kept
  grow      = 4,  ///< the pool's reserved bytes grew (`bytes`: by how much)
  trim      = 5,  ///< the pool's reserved bytes shrank (`bytes`: by how much)
  oom       = 6,  ///< an allocation of `bytes` failed for want of memory
};

/// @brief One event; sizes in bytes, the pool's state right after it.
struct history_event {
  std::uint64_t time_ns{};   ///< steady clock, nanoseconds (a stamp while in the ring)
  std::uint64_t address{};   ///< the block (0 for grow, trim, oom)
  std::uint64_t bytes{};     ///< the size asked for or freed, or the growth / trim
  std::uint64_t stream{};    ///< the stream handle's value
  std::uint64_t reserved{};  ///< the pool's reserved bytes after the event
  std::uint64_t used{};      ///< the pool's used bytes after the event
  std::uint64_t cached{};    ///< bytes charged to the resource's front cache (0 without one)
  history_action action{history_action::alloc};
  /// Its number, unique in its ring, as `last_history_event` told its thread: set when read back;
  /// recording ignores it. Numbers need not rise in a thread's order (a thread may continue a
  /// chunk, and its numbers, another thread let go): order events by time first.
  std::uint64_t number{};
};

/// @brief What `last_history_event()` says while this thread recorded no event since it forgot
/// the last one (no number is this large).
inline constexpr std::uint64_t no_history_event = ~std::uint64_t{0};

/// @brief The number (`history_event::number`) of the event this thread recorded last, in any
/// recording; `no_history_event` when it recorded none since `forget_last_history_event()` (an
/// event the ring refused, or one whose recording had stopped, gives no number). So a caller
/// matches what it knows of its own call (a Python stack) to that call's event.
[[nodiscard]] std::uint64_t last_history_event() noexcept;

/// @brief Forgets the event this thread recorded last; call it before the call whose event is
/// asked for after.
void forget_last_history_event() noexcept;

}  // namespace asyncmr

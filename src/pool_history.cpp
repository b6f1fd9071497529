/*
 * SPDX-License-Identifier: Apache-2.0
 */

// A resource's allocation history: starting, reading and stopping a recording. The function that
// stamps an event with the pool's state (pool_resource_base::note_event for the events of a
// pair, and note) is in pool_resource.cpp, beside the allocate and deallocate that call it.

#include "detail/history_state.hpp"
#include "detail/stream_cache.hpp"

#include <asyncmr/detail/pool_resource_base.hpp>

#include <stdexcept>
#include <utility>

namespace asyncmr::detail {

namespace {

// A ring's events with their stamps in steady_clock nanoseconds; `dropped`: the events it lost.
std::vector<history_event> events_in_ns(history_ring const& ring, std::uint64_t& dropped)
{
  std::vector<history_event> events = ring.events(dropped);
  history_stamp_converter const to_ns;
  for (history_event& e : events) { e.time_ns = to_ns(e.time_ns); }
  return events;
}

}  // namespace

void pool_resource_base::start_history(std::size_t max_events)
{
  auto ring = history_ring::make(max_events);  // checks max_events
  std::lock_guard guard{history_->lock};
  if (history_->recordings.active() != nullptr) {
    throw std::logic_error{"asyncmr: a history is being recorded on this resource already "
                           "(one at a time; stop it first)"};
  }
  std::uint64_t reserved = 0;
  try {
    reserved = pool_.get_attribute(pool_attribute::reserved_mem_current);
  } catch (...) {  // NOLINT(bugprone-empty-catch): growth is then seen from 0
  }
  history_->last_reserved.store(reserved, std::memory_order_relaxed);
  try {
    history_->last_used.store(pool_.get_attribute(pool_attribute::used_mem_current),
                              std::memory_order_relaxed);
  } catch (...) {  // NOLINT(bugprone-empty-catch)
  }
  // The stamp's kind is decided (reading the kernel's clocksource) here, not at the first event.
  history_->measure_read_period();
  history_->last_read.store(history_stamp(), std::memory_order_relaxed);
  history_->recordings.start(std::move(ring));
}

std::vector<history_event> pool_resource_base::stop_history(std::uint64_t& dropped)
{
  std::lock_guard guard{history_->lock};
  history_ring::handle const ring = history_->recordings.stop();
  if (!ring) { throw std::logic_error{"asyncmr: no history is being recorded on this resource"}; }
  // A writer that loaded the ring before may add one; the ring is freed once none can.
  return events_in_ns(*ring, dropped);
}

std::vector<history_event> pool_resource_base::read_history(std::uint64_t& dropped) const
{
  if (history_) {
    std::lock_guard guard{history_->lock};  // a stop on another thread would free the ring
    if (history_ring const* const ring = history_->recordings.active()) {
      return events_in_ns(*ring, dropped);
    }
  }
  throw std::logic_error{"asyncmr: no history is being recorded on this resource"};
}

bool pool_resource_base::recording_history() const noexcept
{
  return history_ && history_->recordings.active() != nullptr;
}

}  // namespace asyncmr::detail

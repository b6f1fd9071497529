/*
 * SPDX-License-Identifier: Apache-2.0
 */

// A resource's allocation history (detail/history_recorder.hpp): starting, reading and stopping
// a recording, and the events that ask the driver for the pool's state.

#include "detail/history_recorder.hpp"

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

void history_recorder::measure_read_period() noexcept
{
  history_stamp_converter const rate;
  read_period_.store(rate.stamps_in(history_pool_read_ns), std::memory_order_relaxed);
  period_settled_.store(rate.settled(), std::memory_order_relaxed);
}

void history_recorder::start(mem_pool const& pool, std::size_t max_events)
{
  auto ring = history_ring::make(max_events);  // checks max_events
  std::lock_guard guard{lock_};
  if (recordings_.active() != nullptr) {
    throw std::logic_error{"asyncmr: a history is being recorded on this resource already "
                           "(one at a time; stop it first)"};
  }
  std::uint64_t reserved = 0;
  try {
    reserved = pool.get_attribute(pool_attribute::reserved_mem_current);
  } catch (...) {  // NOLINT(bugprone-empty-catch): growth is then seen from 0
  }
  last_reserved_.store(reserved, std::memory_order_relaxed);
  try {
    last_used_.store(pool.get_attribute(pool_attribute::used_mem_current),
                     std::memory_order_relaxed);
  } catch (...) {  // NOLINT(bugprone-empty-catch)
  }
  // The stamp's kind is decided (reading the kernel's clocksource) here, not at the first event.
  measure_read_period();
  last_read_.store(history_stamp(), std::memory_order_relaxed);
  recordings_.start(std::move(ring));
}

std::vector<history_event> history_recorder::stop(std::uint64_t& dropped)
{
  std::lock_guard guard{lock_};
  history_ring::handle const ring = recordings_.stop();
  if (!ring) { throw std::logic_error{"asyncmr: no history is being recorded on this resource"}; }
  // A writer that loaded the ring before may add one; the ring is freed once none can.
  return events_in_ns(*ring, dropped);
}

std::vector<history_event> history_recorder::read(std::uint64_t& dropped) const
{
  std::lock_guard guard{lock_};  // a stop on another thread would free the ring
  if (history_ring const* const ring = recordings_.active()) {
    return events_in_ns(*ring, dropped);
  }
  throw std::logic_error{"asyncmr: no history is being recorded on this resource"};
}

void history_recorder::read_pool(history_ring& ring,
                                 mem_pool const& pool,
                                 history_event e,
                                 bool forced) noexcept
{
  std::uint64_t last = last_reserved_.load(std::memory_order_relaxed);
  bool read          = forced;
  if (read) {
    last_read_.store(e.time_ns, std::memory_order_relaxed);
  } else if (std::uint64_t read_at = last_read_.load(std::memory_order_relaxed);
             stamps_since(e.time_ns, read_at) >= read_period_.load(std::memory_order_relaxed)) {
    // One thread reads for all of them; the others record the known state.
    read = last_read_.compare_exchange_strong(read_at, e.time_ns, std::memory_order_relaxed);
  }
  if (read && !period_settled_.load(std::memory_order_relaxed)) [[unlikely]] {
    measure_read_period();  // the process's first moments: the rate is measured over longer now
  }
  if (read) {
    if (auto const usage = pool.usage()) {  // in relaxed capture mode: safe while any captures
      e.reserved = usage->reserved;
      e.used     = usage->used;
      last_used_.store(e.used, std::memory_order_relaxed);
    } else {
      read = false;  // the last known state stands
    }
  }
  if (read && e.reserved != last &&
      last_reserved_.compare_exchange_strong(last, e.reserved, std::memory_order_relaxed)) {
    history_event change = e;
    change.action        = e.reserved > last ? history_action::grow : history_action::trim;
    change.address       = 0;
    change.bytes         = e.reserved > last ? e.reserved - last : last - e.reserved;
    // A tick before the event that found it (the growth served that allocation; a trim came
    // before the read): read back in time order, events of one stamp fall back to their numbers,
    // which do not always rise in a thread's order (a thread may continue a chunk another let go).
    change.time_ns = e.time_ns > 0 ? e.time_ns - 1 : 0;
    ring.record(change, &recordings_);
  }
  if (e.action == history_action::trim) { return; }  // a trim call: only what it changed
  ring.record(e, &recordings_);
}

void history_recorder::pool_event(history_ring& ring,
                                  mem_pool const& pool,
                                  history_action action,
                                  std::size_t bytes,
                                  cudaStream_t stream,
                                  std::size_t cached) noexcept
{
  read_pool(ring, pool, known_event(history_stamp(), action, nullptr, bytes, stream, cached), true);
}

}  // namespace asyncmr::detail

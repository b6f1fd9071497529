/*
 * SPDX-License-Identifier: Apache-2.0
 */

// A resource's allocation history: starting and stopping a recording, and the one function that
// stamps an event with the pool's state (pool_resource_base::note).

#include "detail/history_state.hpp"
#include "detail/stream_cache.hpp"

#include <asyncmr/detail/pool_resource_base.hpp>

#include <stdexcept>

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
  auto ring = std::make_unique<history_ring>(max_events);  // checks max_events
  std::lock_guard guard{history_->lock};
  if (history_->active.load(std::memory_order_acquire) != nullptr) {
    throw std::logic_error{"asyncmr: a history is being recorded on this resource already "
                           "(one at a time; stop it first)"};
  }
  history_->rings.reserve(history_->rings.size() + 1);
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
  history_->read_period.store(history_stamps_in(history_pool_read_ns), std::memory_order_relaxed);
  history_->last_read.store(history_stamp(), std::memory_order_relaxed);
  history_->rings.push_back(std::move(ring));
  history_->active.store(history_->rings.back().get(), std::memory_order_release);
}

std::vector<history_event> pool_resource_base::stop_history(std::uint64_t& dropped)
{
  std::lock_guard guard{history_->lock};
  history_ring* const ring = history_->active.exchange(nullptr, std::memory_order_acq_rel);
  if (ring == nullptr) {
    throw std::logic_error{"asyncmr: no history is being recorded on this resource"};
  }
  return events_in_ns(*ring, dropped);  // a writer that loaded the ring before may add one
}

std::vector<history_event> pool_resource_base::read_history(std::uint64_t& dropped) const
{
  history_ring const* const ring = history_ ? history_->active.load(std::memory_order_acquire)
                                            : nullptr;
  if (ring == nullptr) {
    throw std::logic_error{"asyncmr: no history is being recorded on this resource"};
  }
  return events_in_ns(*ring, dropped);
}

bool pool_resource_base::recording_history() const noexcept
{
  return history_ && history_->active.load(std::memory_order_relaxed) != nullptr;
}

// How a recording follows the pool's reserved and used bytes without asking the driver on every
// event (two attribute reads cost ~700 ns an uncached pair on the H200, seven times a pair):
// `used` moves by each allocation's and free's bytes; the pool itself is read when an
// allocation may grow it (fewer known unused reserved bytes than it asks for), when the last
// read is older than history_pool_read_ns, and on every oom and trim_to. A grow or trim event is
// stamped at the read that sees the change.
void pool_resource_base::note(history_ring& ring,
                              history_action action,
                              void const* ptr,
                              std::size_t bytes,
                              cudaStream_t stream,
                              bool read_pool) noexcept
{
  history_state& h      = *history_;
  std::uint64_t const now = history_stamp();
  history_event e{};
  e.address = reinterpret_cast<std::uintptr_t>(ptr);
  e.bytes   = bytes;
  e.stream  = reinterpret_cast<std::uintptr_t>(stream);
  e.cached  = cache_ ? cache_->charged_bytes() : 0;
  e.time_ns = now;
  std::uint64_t last = h.last_reserved.load(std::memory_order_relaxed);
  e.reserved         = last;
  // `used` moves by a load and a store, not a read-modify-write: with the two locked instructions
  // an uncached pair made, recording added 114 ns to it on the H200, without them 100 ns (section
  // 11, one run each, 2026-12-02; the target is <= 100). Events racing on
  // several threads may lose each other's move until the next read of the pool sets it right
  // (at most history_pool_read_ns later); one thread's events are exact between reads.
  if (action == history_action::alloc) {
    e.used = h.last_used.load(std::memory_order_relaxed) + bytes;
    h.last_used.store(e.used, std::memory_order_relaxed);
    read_pool = read_pool || last < e.used;  // the pool may have grown for this block
  } else if (action == history_action::free) {
    std::uint64_t const used = h.last_used.load(std::memory_order_relaxed);
    e.used                   = used > bytes ? used - bytes : 0;
    h.last_used.store(e.used, std::memory_order_relaxed);
  } else {
    e.used = h.last_used.load(std::memory_order_relaxed);
  }
  if (read_pool) {
    h.last_read.store(now, std::memory_order_relaxed);
  } else if (std::uint64_t read_at = h.last_read.load(std::memory_order_relaxed);
             now - read_at >= h.read_period.load(std::memory_order_relaxed)) {
    // One thread reads for all of them.
    read_pool = h.last_read.compare_exchange_strong(read_at, now, std::memory_order_relaxed);
  }
  if (read_pool) {
    // Relaxed capture mode inside get_attribute: safe while any stream captures.
    try {
      e.reserved = pool_.get_attribute(pool_attribute::reserved_mem_current);
      e.used     = pool_.get_attribute(pool_attribute::used_mem_current);
      h.last_used.store(e.used, std::memory_order_relaxed);
    } catch (...) {  // NOLINT(bugprone-empty-catch): the last known state stands
      read_pool = false;
    }
  }
  if (read_pool && e.reserved != last &&
      h.last_reserved.compare_exchange_strong(last, e.reserved, std::memory_order_relaxed)) {
    history_event change = e;
    change.action        = e.reserved > last ? history_action::grow : history_action::trim;
    change.address       = 0;
    change.bytes         = e.reserved > last ? e.reserved - last : last - e.reserved;
    ring.record(change);
  }
  if (action == history_action::trim) { return; }  // a trim call: only what it changed
  e.action = action;
  ring.record(e);
}

}  // namespace asyncmr::detail

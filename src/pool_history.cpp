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
  dropped = ring->dropped();
  return ring->events();  // a writer that loaded the ring before the exchange may still add one
}

std::vector<history_event> pool_resource_base::read_history(std::uint64_t& dropped) const
{
  history_ring const* const ring = history_ ? history_->active.load(std::memory_order_acquire)
                                            : nullptr;
  if (ring == nullptr) {
    throw std::logic_error{"asyncmr: no history is being recorded on this resource"};
  }
  dropped = ring->dropped();
  return ring->events();
}

bool pool_resource_base::recording_history() const noexcept
{
  return history_ && history_->active.load(std::memory_order_relaxed) != nullptr;
}

void pool_resource_base::note(history_ring& ring,
                              history_action action,
                              void const* ptr,
                              std::size_t bytes,
                              cudaStream_t stream,
                              bool read_pool) noexcept
{
  history_event e{};
  e.address = reinterpret_cast<std::uintptr_t>(ptr);
  e.bytes   = bytes;
  e.stream  = reinterpret_cast<std::uintptr_t>(stream);
  e.cached  = cache_ ? cache_->charged_bytes() : 0;
  std::uint64_t last = history_->last_reserved.load(std::memory_order_relaxed);
  e.reserved         = last;
  e.used             = history_->last_used.load(std::memory_order_relaxed);
  if (read_pool) {
    // Relaxed capture mode inside get_attribute: safe while any stream captures.
    try {
      e.reserved = pool_.get_attribute(pool_attribute::reserved_mem_current);
      e.used     = pool_.get_attribute(pool_attribute::used_mem_current);
      history_->last_used.store(e.used, std::memory_order_relaxed);
    } catch (...) {  // NOLINT(bugprone-empty-catch): the last known state stands
      read_pool = false;
    }
  }
  if (read_pool && e.reserved != last &&
      history_->last_reserved.compare_exchange_strong(last, e.reserved,
                                                      std::memory_order_relaxed)) {
    history_event change = e;
    change.action        = e.reserved > last ? history_action::grow : history_action::trim;
    change.address       = 0;
    change.bytes         = e.reserved > last ? e.reserved - last : last - e.reserved;
    change.time_ns       = history_now_ns();
    ring.record(change);
  }
  if (action == history_action::trim) { return; }  // a trim call: only what it changed
  e.action  = action;
  e.time_ns = history_now_ns();
  ring.record(e);
}

}  // namespace asyncmr::detail

/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The allocation-history ring (detail/history.hpp).

#include <asyncmr/detail/history.hpp>

#include <chrono>
#include <stdexcept>
#include <string>

namespace asyncmr::detail {

std::uint64_t history_now_ns() noexcept
{
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      std::chrono::steady_clock::now().time_since_epoch())
                                      .count());
}

history_ring::history_ring(std::size_t capacity) : capacity_{capacity}
{
  if (capacity == 0 || capacity > max_capacity) {
    throw std::invalid_argument{"asyncmr: a history of " + std::to_string(capacity) +
                                " events: it must hold between 1 and " +
                                std::to_string(max_capacity) + " events"};
  }
  slots_ = std::make_unique<slot[]>(capacity);
}

void history_ring::record(history_event const& e) noexcept
{
  std::uint64_t const n = next_.fetch_add(1, std::memory_order_relaxed);
  slot& s               = slots_[n % capacity_];
  std::uint64_t held    = s.seq.load(std::memory_order_relaxed);
  // Claim the slot unless another writer (a whole ring behind or ahead) holds it.
  if ((held & 1) != 0 ||
      !s.seq.compare_exchange_strong(held, 2 * n + 1, std::memory_order_acquire,
                                     std::memory_order_relaxed)) {
    busy_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::uint64_t const values[fields] = {e.time_ns, e.address,  e.bytes,  e.stream,
                                        e.reserved, e.used,    e.cached, static_cast<std::uint64_t>(e.action)};
  for (std::size_t i = 0; i < fields; ++i) { s.f[i].store(values[i], std::memory_order_relaxed); }
  s.seq.store(2 * n + 2, std::memory_order_release);
}

std::vector<history_event> history_ring::events() const
{
  std::uint64_t const end   = next_.load(std::memory_order_acquire);
  std::uint64_t const begin = end > capacity_ ? end - capacity_ : 0;
  std::vector<history_event> out;
  out.reserve(static_cast<std::size_t>(end - begin));
  for (std::uint64_t n = begin; n < end; ++n) {
    slot const& s         = slots_[n % capacity_];
    std::uint64_t const a = s.seq.load(std::memory_order_acquire);
    if (a != 2 * n + 2) { continue; }  // not written yet, being written, or overwritten
    std::uint64_t v[fields];
    for (std::size_t i = 0; i < fields; ++i) { v[i] = s.f[i].load(std::memory_order_relaxed); }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != a) { continue; }  // overwritten while read
    out.push_back({v[0], v[1], v[2], v[3], v[4], v[5], v[6], static_cast<history_action>(v[7])});
  }
  return out;
}

std::uint64_t history_ring::dropped() const noexcept
{
  std::uint64_t const n = next_.load(std::memory_order_relaxed);
  return (n > capacity_ ? n - capacity_ : 0) + busy_.load(std::memory_order_relaxed);
}

}  // namespace asyncmr::detail

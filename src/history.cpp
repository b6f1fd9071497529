/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The allocation-history ring (detail/history.hpp).

#include <asyncmr/detail/history.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace asyncmr::detail {

std::uint64_t history_now_ns() noexcept
{
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      std::chrono::steady_clock::now().time_since_epoch())
                                      .count());
}

namespace {

bool clocksource_is_tsc() noexcept
{
#if defined(__x86_64__)
  std::FILE* const f =
    std::fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  if (f == nullptr) { return false; }
  char name[32] = {};
  std::size_t const n = std::fread(name, 1, sizeof(name) - 1, f);
  std::fclose(f);
  return n >= 3 && std::strncmp(name, "tsc", 3) == 0 && (n == 3 || name[3] == '\n');
#else
  return false;
#endif
}

// The two counters read together: the stamp converted is scaled between this pair, taken at the
// first stamp of the process, and a pair read at conversion time.
struct stamp_reference {
  bool ticks;
  std::uint64_t tick0;
  std::uint64_t ns0;
};

std::uint64_t read_ticks() noexcept
{
#if defined(__x86_64__)
  return __rdtsc();
#else
  return 0;
#endif
}

stamp_reference const& reference() noexcept
{
  static stamp_reference const ref = [] {
    bool const ticks = clocksource_is_tsc();
    return stamp_reference{ticks, ticks ? read_ticks() : 0, history_now_ns()};
  }();
  return ref;
}

// A (ticks, ns) pair read as close together as this thread can: the pair whose two tick reads
// around the clock read are nearest, of a few tries.
void read_pair(std::uint64_t& ticks, std::uint64_t& ns) noexcept
{
  std::uint64_t best = ~std::uint64_t{0};
  for (int i = 0; i < 5; ++i) {
    std::uint64_t const a = read_ticks();
    std::uint64_t const n = history_now_ns();
    std::uint64_t const b = read_ticks();
    if (b - a < best) {
      best  = b - a;
      ticks = a + (b - a) / 2;
      ns    = n;
    }
  }
}

}  // namespace

bool history_stamps_are_ticks() noexcept { return reference().ticks; }

std::uint64_t history_stamp() noexcept
{
  return reference().ticks ? read_ticks() : history_now_ns();
}

history_stamp_converter::history_stamp_converter() noexcept
{
  stamp_reference const& ref = reference();
  ticks_                     = ref.ticks;
  tick0_                     = ref.tick0;
  ns0_                       = ref.ns0;
  std::uint64_t tick1        = ref.tick0;
  std::uint64_t ns1          = ref.ns0;
  if (ticks_) { read_pair(tick1, ns1); }
  ticks_elapsed_ = tick1 > tick0_ ? tick1 - tick0_ : 0;
  ns_elapsed_    = ns1 > ns0_ ? ns1 - ns0_ : 0;
}

std::uint64_t history_stamp_converter::operator()(std::uint64_t stamp) const noexcept
{
  if (!ticks_) { return stamp; }
  if (ticks_elapsed_ == 0) { return ns0_; }  // no time since the reference: all at its instant
  // A stamp older than the reference (none: it is taken before the first stamp) maps to it.
  std::uint64_t const since = stamp > tick0_ ? stamp - tick0_ : 0;
  return ns0_ + static_cast<std::uint64_t>(static_cast<unsigned __int128>(since) * ns_elapsed_ /
                                           ticks_elapsed_);
}

std::uint64_t history_stamp_converter::stamps_in(std::uint64_t ns) const noexcept
{
  if (!ticks_) { return ns; }
  if (ns_elapsed_ < 1'000'000) { return ns * 5; }  // under 1 ms since the reference: 5 GHz at most
  return static_cast<std::uint64_t>(static_cast<unsigned __int128>(ns) * ticks_elapsed_ /
                                    ns_elapsed_);
}

std::uint64_t history_stamps_in(std::uint64_t ns) noexcept
{
  return history_stamp_converter{}.stamps_in(ns);
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
  std::uint64_t const values[fields] = {
    e.time_ns, e.address, e.bytes, e.stream, e.reserved, e.used,
    std::min(e.cached, cached_mask) | (std::uint64_t{static_cast<std::uint32_t>(e.action)} << action_shift)};
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
    out.push_back({v[0], v[1], v[2], v[3], v[4], v[5], v[6] & cached_mask,
                   static_cast<history_action>(v[6] >> action_shift)});
  }
  return out;
}

std::uint64_t history_ring::dropped() const noexcept
{
  std::uint64_t const n = next_.load(std::memory_order_relaxed);
  return (n > capacity_ ? n - capacity_ : 0) + busy_.load(std::memory_order_relaxed);
}

}  // namespace asyncmr::detail

/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The allocation-history ring (detail/history.hpp).

#include <asyncmr/detail/history.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
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

std::uint64_t history_stamp_first() noexcept
{
  bool const ticks = reference().ticks;  // the reference is taken before any stamp is read
  history_stamp_kind.store(ticks ? 1 : 2, std::memory_order_relaxed);
  return ticks ? read_ticks() : history_now_ns();
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

// ---- the ring ----------------------------------------------------------------------------

namespace {

// Every ring alive, so that a cursor let go by a thread that ends (or by a full cursor table)
// touches its ring only while it lives. Locked when a ring comes and goes, and when a thread
// lets go of chunks: never on an event's path. Never destroyed (threads end after statics go).
struct ring_registry {
  std::mutex lock;
  std::vector<history_ring*> rings;
};

ring_registry& registry()
{
  static auto* const r = new ring_registry;  // NOLINT(cppcoreguidelines-owning-memory)
  return *r;
}

std::atomic<std::uint64_t> next_ring_id{1};

}  // namespace

constinit thread_local history_cursor history_cursors[history_cursor::table_size] = {};

namespace {

// Constructed by a thread's first claim; lets the thread's chunks go when the thread ends.
struct cursor_reaper {
  cursor_reaper()                                = default;
  cursor_reaper(cursor_reaper const&)            = delete;
  cursor_reaper& operator=(cursor_reaper const&) = delete;
  ~cursor_reaper() { history_cursor::let_go_all(); }
};

thread_local cursor_reaper reaper;

}  // namespace

void history_cursor::forget(history_cursor& c, std::vector<history_ring*> const& alive) noexcept
{
  if (c.next_slot != nullptr && std::find(alive.begin(), alive.end(), c.ring) != alive.end()) {
    c.ring->let_go(c);  // the pointer may name a newer ring at the same address: let_go checks
  }
  c = history_cursor{};
}

history_cursor& history_cursor::find(history_ring& ring) noexcept
{
  history_cursor* const table = history_cursors;
  std::size_t i               = 0;
  while (i < table_size && table[i].ring_id != ring.id_) { ++i; }
  if (i == table_size) {  // a new ring for this thread: the least recently used entry goes
    i = table_size - 1;
    if (table[i].next_slot != nullptr) {  // still holds a chunk: let it go if its ring lives
      ring_registry& r = registry();
      std::lock_guard guard{r.lock};
      forget(table[i], r.rings);
    }
    table[i]         = history_cursor{};
    table[i].ring_id = ring.id_;
    table[i].ring    = &ring;
  }
  history_cursor const found = table[i];
  for (; i > 0; --i) { table[i] = table[i - 1]; }
  table[0] = found;
  return table[0];
}

void history_cursor::let_go_all() noexcept
{
  ring_registry& r = registry();
  std::lock_guard guard{r.lock};
  for (history_cursor& c : history_cursors) { forget(c, r.rings); }
}

history_ring::history_ring(std::size_t capacity)
  : id_{next_ring_id.fetch_add(1, std::memory_order_relaxed)}, capacity_{capacity}
{
  if (capacity == 0 || capacity > max_capacity) {
    throw std::invalid_argument{"asyncmr: a history of " + std::to_string(capacity) +
                                " events: it must hold between 1 and " +
                                std::to_string(max_capacity) + " events"};
  }
  // At least 64 chunks: a chunk each for many threads at once, with most of the ring cycling.
  chunk_  = capacity < 1024 ? 1 : std::min(max_chunk, capacity / 64);
  chunks_ = (capacity + chunk_ - 1) / chunk_;
  slots_  = std::make_unique<slot[]>(chunks_ * chunk_);
  states_ = std::make_unique<chunk_state[]>(chunks_);
  ring_registry& r = registry();
  std::lock_guard guard{r.lock};
  r.rings.push_back(this);
}

history_ring::~history_ring()
{
  ring_registry& r = registry();
  std::lock_guard guard{r.lock};
  r.rings.erase(std::find(r.rings.begin(), r.rings.end(), this));
}

bool history_ring::claim(history_cursor& c) noexcept
{
  static_cast<void>(&reaper);  // this thread's chunks are let go when it ends
  // The chunk let go part-filled last, where its claim stopped, if nobody took it since: its
  // event numbers are that claim's own (its ticket's range), so they stay unique.
  if (std::size_t const p = partial_.load(std::memory_order_relaxed) == 0
                              ? 0
                              : partial_.exchange(0, std::memory_order_acq_rel);
      p != 0) {
    chunk_state& state = states_[p - 1];
    if (!state.held.exchange(true, std::memory_order_acquire)) {
      std::size_t const left = state.resume_left.load(std::memory_order_relaxed);
      if (left != 0) {
        state.resume_left.store(0, std::memory_order_relaxed);
        c.next_event = state.resume_event.load(std::memory_order_relaxed);
        c.next_slot  = &slots_[(p - 1) * chunk_ + (chunk_ - left)];
        c.state      = &state;
        c.left       = left;
        state.first.store(c.next_event, std::memory_order_relaxed);
        return true;
      }
      state.held.store(false, std::memory_order_release);  // filled since: claim afresh
    }
  }
  // A chunk a thread still holds (part-filled) is passed over; every chunk held: refused.
  for (std::size_t tries = 0; tries < chunks_; ++tries) {
    std::uint64_t const ticket = tickets_.fetch_add(1, std::memory_order_relaxed);
    std::size_t const chunk    = static_cast<std::size_t>(ticket % chunks_);
    if (!states_[chunk].held.exchange(true, std::memory_order_acquire)) {
      c.next_slot  = &slots_[chunk * chunk_];
      c.next_event = ticket * chunk_;
      c.state      = &states_[chunk];
      c.left       = chunk_;
      c.state->resume_left.store(0, std::memory_order_relaxed);  // written afresh from slot 0
      c.state->first.store(c.next_event, std::memory_order_relaxed);
      // Ask for the chunk's lines for writing now: its events come between the resource's
      // driver calls, which push the ring's lines out of the near caches, and a store to a line
      // not held waits for it (PREFETCHW: a no-op on a CPU without it).
#if defined(__x86_64__)
      for (std::size_t i = 0; i < chunk_; ++i) {
        asm volatile("prefetchw %0" : : "m"(*reinterpret_cast<char const*>(c.next_slot + i)));
      }
#endif
      return true;
    }
  }
  return false;
}

void history_ring::let_go(history_cursor& c) noexcept
{
  if (c.ring_id != id_ || c.next_slot == nullptr) { return; }
  chunk_state& state = *c.state;
  // Events this claim wrote (a claim that went on in a part-filled chunk started past its 0).
  std::uint64_t const n = c.next_event - state.first.load(std::memory_order_relaxed);
  state.written.store(state.written.load(std::memory_order_relaxed) + n,
                      std::memory_order_relaxed);
  state.resume_event.store(c.next_event, std::memory_order_relaxed);
  state.resume_left.store(c.left, std::memory_order_relaxed);
  state.held.store(false, std::memory_order_release);
  if (c.left != 0) {  // offered to the next claim (a full chunk has nothing to go on from)
    partial_.store(static_cast<std::size_t>(&state - states_.get()) + 1,
                   std::memory_order_release);
  }
  c.next_slot = nullptr;
}

history_cursor* history_ring::place() noexcept
{
  history_cursor& c = history_cursor::find(*this);
  if (c.next_slot == nullptr && !claim(c)) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  return &c;
}

// Copies every whole event into `out` (when given); returns how many there are.
std::size_t history_ring::whole_events(std::vector<history_event>* out,
                                       std::uint64_t offered) const
{
  std::size_t const slots = chunks_ * chunk_;
  std::vector<std::uint64_t> numbers;  // each copied event's number, to order ties in time
  if (out != nullptr) {
    out->reserve(std::min<std::size_t>(slots, static_cast<std::size_t>(offered)));
    numbers.reserve(out->capacity());
  }
  std::size_t whole = 0;
  for (std::size_t i = 0; i < slots; ++i) {
    slot const& s         = slots_[i];
    std::uint64_t const a = s.seq.load(std::memory_order_acquire);
    if (a == 0 || (a & 1) != 0) { continue; }  // empty, or being written
    std::uint64_t v[fields];
    for (std::size_t k = 0; k < fields; ++k) { v[k] = s.f[k].load(std::memory_order_relaxed); }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != a) { continue; }  // overwritten while read
    ++whole;
    if (out != nullptr) {
      out->push_back({v[0], v[1], v[2], v[3], v[4], v[5], v[6] & cached_mask,
                      static_cast<history_action>(v[6] >> action_shift)});
      numbers.push_back(a / 2 - 1);
    }
  }
  if (out == nullptr) { return std::min(whole, capacity_); }
  std::vector<std::size_t> order(out->size());
  for (std::size_t i = 0; i < order.size(); ++i) { order[i] = i; }
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    auto const& ex = (*out)[x];
    auto const& ey = (*out)[y];
    return ex.time_ns != ey.time_ns ? ex.time_ns < ey.time_ns : numbers[x] < numbers[y];
  });
  // The newest capacity_ of them (the last chunk may hold a few more), oldest first.
  std::size_t const first = order.size() > capacity_ ? order.size() - capacity_ : 0;
  std::vector<history_event> sorted;
  sorted.reserve(order.size() - first);
  for (std::size_t i = first; i < order.size(); ++i) { sorted.push_back((*out)[order[i]]); }
  *out = std::move(sorted);
  return out->size();
}

std::vector<history_event> history_ring::events() const
{
  std::vector<history_event> out;
  whole_events(&out, recorded());
  return out;
}

std::vector<history_event> history_ring::events(std::uint64_t& dropped) const
{
  std::vector<history_event> out;
  std::uint64_t const offered = recorded();
  whole_events(&out, offered);
  dropped = offered > out.size() ? offered - out.size() : 0;
  return out;
}

std::uint64_t history_ring::recorded() const noexcept
{
  std::uint64_t n = refused_.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < chunks_; ++i) {
    chunk_state const& state = states_[i];
    n += state.written.load(std::memory_order_relaxed);
    if (!state.held.load(std::memory_order_acquire)) { continue; }
    // The claim holding it: its events are the slots numbered from its first on.
    std::uint64_t const first = state.first.load(std::memory_order_relaxed);
    for (std::size_t k = 0; k < chunk_; ++k) {
      if (slots_[i * chunk_ + k].seq.load(std::memory_order_relaxed) > 2 * first) { ++n; }
    }
  }
  return n;
}

std::uint64_t history_ring::dropped() const noexcept
{
  std::uint64_t const offered = recorded();
  std::size_t const whole     = whole_events(nullptr, 0);  // allocates nothing: cannot throw
  return offered > whole ? offered - whole : 0;
}

}  // namespace asyncmr::detail

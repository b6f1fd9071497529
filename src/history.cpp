/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The allocation-history ring (detail/history.hpp).

#include <asyncmr/detail/history.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
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

std::uint64_t read_ticks() noexcept
{
#if defined(__x86_64__)
  return __rdtsc();
#else
  return 0;
#endif
}

// A (ticks, ns) pair read as close together as this thread can: the pair whose two tick reads
// around the clock read are nearest, of a few tries (the first read of the clock in a process
// can take microseconds; a try the thread was interrupted in is passed over too).
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

// The two counters read together at the process's first stamp: a stamp converted is scaled
// between this pair and a pair read at conversion time.
struct stamp_reference {
  bool ticks;
  std::uint64_t tick0;
  std::uint64_t ns0;
};

stamp_reference const& reference() noexcept
{
  static stamp_reference const ref = [] {
    stamp_reference r{clocksource_is_tsc(), 0, 0};
    if (r.ticks) {
      read_pair(r.tick0, r.ns0);
    } else {
      r.ns0 = history_now_ns();
    }
    return r;
  }();
  return ref;
}

// How long the rate is measured over before stamps_in uses it: both pairs are read within
// ~40 ns, so from 100 us on it is within 0.05%.
constexpr std::uint64_t rate_settles_ns = 100'000;

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

bool history_stamp_converter::settled() const noexcept
{
  return !ticks_ || ns_elapsed_ >= rate_settles_ns;
}

std::uint64_t history_stamp_converter::stamps_in(std::uint64_t ns) const noexcept
{
  // Not measured yet: a tick a nanosecond, which a counter of 1 GHz or more spans in <= ns.
  if (!ticks_ || !settled()) { return ns; }
  return static_cast<std::uint64_t>(static_cast<unsigned __int128>(ns) * ticks_elapsed_ /
                                    ns_elapsed_);
}

// ---- the ring ----------------------------------------------------------------------------

namespace {

std::atomic<std::size_t> live_rings{0};

// Constructed by a thread's first place; lets the thread's places go when the thread ends.
struct cursor_reaper {
  cursor_reaper()                                = default;
  cursor_reaper(cursor_reaper const&)            = delete;
  cursor_reaper& operator=(cursor_reaper const&) = delete;
  ~cursor_reaper()
  {
    history_cursor::let_go_all();
    history_this_thread.ended = true;  // a later event (a thread_local's end) lets go at once
  }
};

thread_local cursor_reaper reaper;

}  // namespace

constinit thread_local history_thread history_this_thread{};

void history_cursor::forget(history_cursor& c) noexcept
{
  history_ring* const ring = c.ring;
  if (ring == nullptr) { return; }
  ring->let_go(c);
  c = history_cursor{};
  history_ring::drop(ring);  // after the chunk went: the ring may go with this count
}

history_cursor* history_cursor::find(history_ring const& ring) noexcept
{
  history_cursor* const table = history_this_thread.cursors;
  std::size_t i               = 0;
  while (i < table_size && table[i].ring != &ring) { ++i; }
  if (i == table_size) { return nullptr; }
  history_cursor const found = table[i];
  for (; i > 0; --i) { table[i] = table[i - 1]; }
  table[0] = found;
  return &table[0];
}

history_cursor& history_cursor::add(history_ring& ring) noexcept
{
  static_cast<void>(&reaper);  // this thread's places are let go when it ends
  history_cursor* const table = history_this_thread.cursors;
  // Places in rings whose recording stopped go now: this thread is taking a place elsewhere, so
  // it is inside no call that still writes there. (Such a place keeps only the ring's object and
  // address range, its memory going with its handle, but a thread's table is for live rings.)
  std::size_t kept = 0;
  for (std::size_t i = 0; i < table_size; ++i) {
    if (table[i].ring != nullptr && table[i].ring->stopped_.load(std::memory_order_relaxed)) {
      forget(table[i]);
    } else {
      table[kept++] = table[i];
    }
  }
  for (std::size_t i = kept; i < table_size; ++i) { table[i] = history_cursor{}; }
  forget(table[table_size - 1]);  // the least recently used place goes
  for (std::size_t i = table_size - 1; i > 0; --i) { table[i] = table[i - 1]; }
  table[0]      = history_cursor{};
  table[0].ring = &ring;
  return table[0];
}

void history_cursor::forget(history_ring const& ring) noexcept
{
  history_cursor* const table = history_this_thread.cursors;
  for (std::size_t i = 0; i < table_size; ++i) {
    if (table[i].ring != &ring) { continue; }
    forget(table[i]);
    for (; i + 1 < table_size; ++i) { table[i] = table[i + 1]; }  // the places after move up
    table[table_size - 1] = history_cursor{};
    return;
  }
}

void history_cursor::let_go_all() noexcept
{
  for (history_cursor& c : history_this_thread.cursors) { forget(c); }
}

history_ring::history_ring(std::size_t capacity) : capacity_{capacity}
{
  if (capacity == 0 || capacity > max_capacity) {
    throw std::invalid_argument{"asyncmr: a history of " + std::to_string(capacity) +
                                " events: it must hold between 1 and " +
                                std::to_string(max_capacity) + " events"};
  }
  // At least 64 chunks: a chunk each for many threads at once, with most of the ring cycling.
  chunk_  = capacity < 1024 ? 1 : std::min(max_chunk, capacity / 64);
  chunks_ = (capacity + chunk_ - 1) / chunk_;
  std::size_t const slots = chunks_ * chunk_;
  storage_bytes_          = slots * sizeof(slot) + chunks_ * sizeof(chunk_state);
#if defined(__linux__)
  // A mapping of its own, not the heap's: discard_storage gives its pages back while threads'
  // places still name addresses in it, and no other object may be in those pages.
  storage_ = mmap(nullptr, storage_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                  -1, 0);
  if (storage_ == MAP_FAILED) { throw std::bad_alloc{}; }
#else
  storage_ = ::operator new(storage_bytes_, std::align_val_t{alignof(slot)});
#endif
  // Made in zeroed memory, all zeros themselves: the state discard_storage leaves them in.
  slots_  = static_cast<slot*>(storage_);
  states_ = reinterpret_cast<chunk_state*>(slots_ + slots);
  std::uninitialized_value_construct_n(slots_, slots);
  std::uninitialized_value_construct_n(states_, chunks_);
  live_rings.fetch_add(1, std::memory_order_relaxed);
}

history_ring::~history_ring()
{
  // slot and chunk_state hold only atomics of integers: nothing to destroy but the mapping.
#if defined(__linux__)
  munmap(storage_, storage_bytes_);
#else
  ::operator delete(storage_, std::align_val_t{alignof(slot)});
#endif
  live_rings.fetch_sub(1, std::memory_order_relaxed);
}

void history_ring::discard_storage() noexcept
{
#if defined(__linux__)
  // 4 KiB pages from now on, so a late writer's stores bring back a page, not 2 MiB of one.
  static_cast<void>(madvise(storage_, storage_bytes_, MADV_NOHUGEPAGE));
  static_cast<void>(madvise(storage_, storage_bytes_, MADV_DONTNEED));
#endif
}

history_ring::handle history_ring::make(std::size_t capacity)
{
  return handle{new history_ring(capacity)};  // NOLINT(cppcoreguidelines-owning-memory)
}

std::size_t history_ring::live() noexcept { return live_rings.load(std::memory_order_relaxed); }

void history_ring::release::operator()(history_ring* ring) const noexcept
{
  // Nobody reads the ring after its handle, and a recording's ring is stopped before its handle
  // is given out, so only late writers with a place are left: their stores may land in zeroed
  // pages, unread. Given back while this count holds the mapping (the last place may go at any
  // moment after the count does); not when the count is the last, as the ring goes whole then.
  if (ring->refs_.load(std::memory_order_acquire) != 1) { ring->discard_storage(); }
  drop(ring);
}

void history_ring::drop(history_ring* ring) noexcept
{
  // acq_rel: every write of every holder into the ring comes before the last one frees it.
  if (ring->refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    delete ring;  // NOLINT(cppcoreguidelines-owning-memory)
  }
}

bool history_ring::join(history_owner const* owner) noexcept
{
  if (owner != nullptr) {
    // Against history_owner::stop, which swaps the ring out and then reads joining_ (all four
    // sequentially consistent): either stop sees this thread joining and waits for it, or this
    // thread sees the ring stopped and touches nothing of it.
    owner->joining_.fetch_add(1, std::memory_order_seq_cst);
    bool const recording = owner->active_.load(std::memory_order_seq_cst) == this;
    if (recording) { refs_.fetch_add(1, std::memory_order_relaxed); }
    owner->joining_.fetch_sub(1, std::memory_order_release);
    return recording;
  }
  refs_.fetch_add(1, std::memory_order_relaxed);  // the caller's handle keeps the ring meanwhile
  return true;
}

namespace {
std::atomic<void (*)() noexcept> claim_hook{nullptr};
}  // namespace

void set_history_claim_hook(void (*hook)() noexcept) noexcept
{
  claim_hook.store(hook, std::memory_order_relaxed);
}

bool history_ring::claim(history_cursor& c) noexcept
{
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
    if (auto* const hook = claim_hook.load(std::memory_order_relaxed)) [[unlikely]] { hook(); }
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
  if (c.next_slot == nullptr) { return; }
  chunk_state& state = *c.state;
  // Events this claim wrote (a claim that went on in a part-filled chunk started past its 0).
  std::uint64_t const n = c.next_event - state.first.load(std::memory_order_relaxed);
  state.written.store(state.written.load(std::memory_order_relaxed) + n,
                      std::memory_order_relaxed);
  state.resume_event.store(c.next_event, std::memory_order_relaxed);
  state.resume_left.store(c.left, std::memory_order_relaxed);
  state.held.store(false, std::memory_order_release);
  if (c.left != 0) {  // offered to the next claim (a full chunk has nothing to go on from)
    partial_.store(static_cast<std::size_t>(&state - states_) + 1,
                   std::memory_order_release);
  }
  c.next_slot = nullptr;
}

history_cursor* history_ring::place(history_owner const* owner) noexcept
{
  history_cursor* c = history_cursor::find(*this);
  if (c == nullptr) {
    if (!join(owner)) { return nullptr; }  // its recording stopped: the event is not made
    c = &history_cursor::add(*this);
  }
  if (c->next_slot == nullptr && !claim(*c)) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  return c;
}

// Copies every whole event into `out` (when given); returns how many there are.
std::size_t history_ring::whole_events(std::vector<history_event>* out,
                                       std::uint64_t offered) const
{
  std::size_t const slots = chunks_ * chunk_;
  if (out != nullptr) {
    out->reserve(std::min<std::size_t>(slots, static_cast<std::size_t>(offered)));
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
                      static_cast<history_action>(v[6] >> action_shift), a / 2 - 1});
    }
  }
  if (out == nullptr) { return std::min(whole, capacity_); }
  std::vector<std::size_t> order(out->size());
  for (std::size_t i = 0; i < order.size(); ++i) { order[i] = i; }
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    auto const& ex = (*out)[x];
    auto const& ey = (*out)[y];
    return ex.time_ns != ey.time_ns ? ex.time_ns < ey.time_ns : ex.number < ey.number;
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
    // The claim holding it: its events are the slots numbered in its own range, from its first
    // on (a claim held up after its ticket may find the chunk's later slots filled since by a
    // newer claim, whose events are counted in `written` already).
    std::uint64_t const first = state.first.load(std::memory_order_relaxed);
    for (std::size_t k = 0; k < chunk_; ++k) {
      std::uint64_t const seq = slots_[i * chunk_ + k].seq.load(std::memory_order_relaxed);
      if (seq > 2 * first && seq <= 2 * (first + chunk_)) { ++n; }
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

// ---- the owner ---------------------------------------------------------------------------

history_owner::~history_owner() { static_cast<void>(stop()); }

void history_owner::start(history_ring::handle ring)
{
  history_ring* expected = nullptr;
  if (!active_.compare_exchange_strong(expected, ring.get(), std::memory_order_acq_rel)) {
    throw std::logic_error{"asyncmr: a history is being recorded here already (one at a time)"};
  }
  static_cast<void>(ring.release());  // active_ holds its count now
}

history_ring::handle history_owner::stop() noexcept
{
  history_ring* const ring = active_.exchange(nullptr, std::memory_order_seq_cst);
  if (ring == nullptr) { return {}; }
  ring->stopped_.store(true, std::memory_order_relaxed);
  // A thread that saw the ring recorded into as it joined has counted its place when it leaves:
  // a few instructions, so this spins a moment at most; none joins it after.
  while (joining_.load(std::memory_order_seq_cst) != 0) { std::this_thread::yield(); }
  history_cursor::forget(*ring);  // this thread's own place: it records here no more
  return history_ring::handle{ring};
}

}  // namespace asyncmr::detail

std::uint64_t asyncmr::last_history_event() noexcept { return detail::history_last_event(); }

void asyncmr::forget_last_history_event() noexcept { detail::history_forget_last_event(); }

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file history.hpp
 * @brief A bounded ring of allocation events that writers fill without allocating, locking or
 * waiting: the recorder behind `record_history`. No CUDA in here (tested on any machine).
 *
 * The ring is cut into chunks of `chunk_events()` slots. A thread claims a whole chunk (one
 * atomic increment for a ticket and one exchange for the chunk's "held" flag) and writes the
 * events it records into it with plain stores, alone, until the chunk is full; then it lets the
 * chunk go and claims the next. Each slot is a sequence lock (odd while its writer writes, then
 * the event's number), so a reader copies only whole events. An event therefore costs no
 * locked instruction: a fraction of a ticket and a slot claim per event (cache_bench's history
 * rows measure both).
 *
 * When the ring is full a claimed chunk overwrites the oldest events; `dropped()` counts what was
 * overwritten or not written (every chunk held: more threads writing at once than chunks). A
 * thread that stops recording part-way through a chunk keeps it, so up to `chunk_events() - 1`
 * of its events outlive newer ones (read back in time order, they are simply older); a thread
 * that ends lets its chunks go. Rings under 1024 events have chunks of one slot: every event
 * claims, and nothing is kept past a newer event.
 *
 * Each event has a number, unique in its ring (a claim's ticket numbers its chunk's slots): the
 * reader gives it back (history_event::number), and the thread that recorded the event is told
 * it (history_last_event, one plain thread-local store), so a caller matches what it knows of
 * its own event (a Python stack) to that event and never to another one at the same address.
 *
 * A thread keeps its place in its 8 most recently used rings (history_cursor): the chunk it
 * holds and where it is in it. A place counts as a reference to its ring, as the ring's handle
 * (history_ring::make) does, and the ring is freed when the last of them goes: a thread's place
 * goes when a ninth ring pushes it out, when the thread ends, or when the thread stops the
 * recording (history_owner::stop). So an event in a ring its thread has a place in touches no
 * count, and a thread's first event in a ring takes a place: a ring a history_owner records into
 * is first asked of the owner, which may have stopped it (its last count may then be gone, and
 * the ring is not touched). A stopped recording's ring is freed once no thread can write into
 * it, and the write path has no locked instruction for it.
 *
 * A thread that keeps a place and never records again (a worker parked between tasks) would keep
 * its ring until it ends, and no other thread can take the place from it: it may be about to
 * write there (it read the ring before its driver call), and the write path has no room for the
 * fence that would tell. So a place keeps only the ring's address range: the slots and chunk
 * states are one mapping of their own, whose pages go back to the system when the handle goes
 * (history_ring::release). Nobody can read the ring after that, and a late writer's stores land
 * in fresh zeroed pages (their starting state) of a mapping that stays until the last place goes:
 * a page or two, lost unread, never memory of anything else.
 */

#include <asyncmr/history.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace asyncmr::detail {

using asyncmr::history_action;
using asyncmr::history_event;

/// @brief What history_last_event() says while this thread recorded no event since it forgot the
/// last one (no number is this large: a slot's sequence holds twice a number plus two).
inline constexpr std::uint64_t history_no_event = asyncmr::no_history_event;

/// @brief Nanoseconds of std::chrono::steady_clock (CLOCK_MONOTONIC on Linux: Python's
/// time.monotonic_ns()), the clock a read history is in.
[[nodiscard]] std::uint64_t history_now_ns() noexcept;

/// @brief Whether events are stamped with the CPU's time-stamp counter: on x86-64 when the
/// kernel's clocksource is "tsc" (the kernel found the counter invariant and synchronized across
/// CPUs, and steady_clock reads it too, then scales it, at about twice the raw counter's cost).
/// Otherwise stamps are steady_clock nanoseconds. Decided once.
[[nodiscard]] bool history_stamps_are_ticks() noexcept;

/// @brief What history_stamp reads: 0 not decided yet, 1 the time-stamp counter, 2 steady_clock.
/// Set once, by the first stamp (history_stamp_first), and never again.
inline std::atomic<unsigned char> history_stamp_kind{0};

/// @brief Decides the stamp's kind (history_stamp_kind), then stamps: the first stamp's path.
[[nodiscard]] std::uint64_t history_stamp_first() noexcept;

/// @brief The stamp an event gets: a time-stamp-counter read or steady_clock nanoseconds (see
/// history_stamps_are_ticks). Monotonic; history_stamp_converter turns it into nanoseconds.
/// Inline, and one relaxed load of the kind before the read: no call, no static's guard.
[[nodiscard]] inline std::uint64_t history_stamp() noexcept
{
  unsigned char const kind = history_stamp_kind.load(std::memory_order_relaxed);
#if defined(__x86_64__)
  if (kind == 1) [[likely]] { return __builtin_ia32_rdtsc(); }
#endif
  if (kind == 2) { return history_now_ns(); }
  return history_stamp_first();
}

/// @brief Converts stamps to steady_clock nanoseconds. Ticks are scaled by the rate measured
/// between a reference taken at the process's first stamp and the converter's making (both
/// counters read together, each pair the closest of a few tries), so the longer a process runs
/// the closer the rate; monotonic.
class history_stamp_converter {
 public:
  history_stamp_converter() noexcept;  ///< reads the counters now
  [[nodiscard]] std::uint64_t operator()(std::uint64_t stamp) const noexcept;
  /// @brief How many stamps span `ns` nanoseconds at most: `ns` when stamps are nanoseconds,
  /// else at the rate measured (`ns` itself until it is settled).
  [[nodiscard]] std::uint64_t stamps_in(std::uint64_t ns) const noexcept;
  /// @brief Whether stamps_in uses the rate measured: stamps are nanoseconds, or the rate was
  /// measured over 100 us or more (the pairs' reads are ~40 ns apart: within 0.05%). Until then
  /// a span is taken as if the counter ran at 1 GHz, its slowest, so it is never longer than
  /// asked (a process's first recording starts a few microseconds after its first stamp).
  [[nodiscard]] bool settled() const noexcept;

 private:
  bool ticks_;
  std::uint64_t tick0_, ns0_, ticks_elapsed_, ns_elapsed_;
};

struct history_cursor;
class history_owner;

class history_ring {
 public:
  static constexpr std::size_t max_capacity = std::size_t{1} << 26;  ///< 64 Mi events
  static constexpr std::size_t max_chunk    = 16;  ///< slots a chunk holds, at most

  /// @brief Lets the maker's count of a ring go: its events' memory goes back to the system now
  /// (no reader is left; a thread's place keeps the address range alone), and the ring is freed
  /// once no thread's place counts it either.
  struct release {
    void operator()(history_ring* ring) const noexcept;
  };
  /// @brief The maker's count of a ring (make): reading its events needs one.
  using handle = std::unique_ptr<history_ring, release>;

  /// @brief A ring of `capacity` events (and up to max_chunk - 1 slots more), allocated now; its
  /// memory goes back when its handle goes, the ring when every thread's place in it is gone too.
  /// @throws std::invalid_argument when `capacity` is 0 or above `max_capacity`; std::bad_alloc
  [[nodiscard]] static handle make(std::size_t capacity);
  history_ring(history_ring const&)            = delete;
  history_ring& operator=(history_ring const&) = delete;

  /// @brief Adds an event; never allocates, waits or takes a lock of its own (a thread's first
  /// event in a ring, and every `chunk_events()`-th, claims a chunk: two atomic instructions; a
  /// first event also takes a place, three more, and may free the ring whose place it pushes
  /// out). Inline: a caller that builds the event in place stores its fields straight into the
  /// slot. `owner`: the history_owner whose recording this ring is, which a thread's first event
  /// asks whether it still records into it (if not, the event is dropped and the ring is not
  /// touched: it may be gone); null when the caller holds the ring's handle.
  void record(history_event const& event, history_owner const* owner = nullptr) noexcept;
  /// @brief The newest `capacity()` whole events in the ring now, in time order (by stamp; one
  /// thread's events in the order it recorded them).
  [[nodiscard]] std::vector<history_event> events() const;
  /// @brief The same, with `dropped` set to the events lost by then (see dropped()).
  [[nodiscard]] std::vector<history_event> events(std::uint64_t& dropped) const;
  /// @brief Events ever offered to `record` (exact once writers are quiet).
  [[nodiscard]] std::uint64_t recorded() const noexcept;
  /// @brief Events lost: overwritten by newer ones, or not written (no chunk free). Reads the
  /// whole ring; exact once writers are quiet.
  [[nodiscard]] std::uint64_t dropped() const noexcept;
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// @brief Slots a chunk holds: 1 under 1024 events, then up to max_chunk.
  [[nodiscard]] std::size_t chunk_events() const noexcept { return chunk_; }
  /// @brief Rings made and not freed yet, in the process (one whose handle went may count on
  /// with no memory of its events, while a thread's place names it).
  [[nodiscard]] static std::size_t live() noexcept;

 private:
  friend struct history_cursor;
  friend class history_owner;  // marks the ring stopped
  explicit history_ring(std::size_t capacity);
  ~history_ring();
  // Seven words an event: the action goes in the top byte of `cached` (a cache of 2^56 bytes
  // cannot be), so a slot is one cache line.
  static constexpr std::size_t fields       = 7;
  static constexpr unsigned action_shift    = 56;
  static constexpr std::uint64_t cached_mask = (std::uint64_t{1} << action_shift) - 1;
  struct alignas(64) slot {
    std::atomic<std::uint64_t> seq{0};  // 0 empty, odd being written, 2g+2 holds event g
    std::array<std::atomic<std::uint64_t>, fields> f{};
  };
  static_assert(sizeof(slot) == 64);
  struct alignas(64) chunk_state {
    std::atomic<bool> held{false};
    std::atomic<std::uint64_t> first{0};  // the first event number of the claim holding it
    // Events written into this chunk by claims that let it go: added by the holder as it lets
    // go (the claim holding it now is counted from its slots), so an event touches no count.
    std::atomic<std::uint64_t> written{0};
    // Where a claim let go part-filled stopped (its next event number and the slots left), for
    // the next claim to go on from; 0 slots left: nothing to go on from. Read and written by
    // the holder only.
    std::atomic<std::uint64_t> resume_event{0};
    std::atomic<std::size_t> resume_left{0};
  };

  bool claim(history_cursor& cursor) noexcept;
  void let_go(history_cursor& cursor) noexcept;
  // This thread's cursor with a chunk held, its place taken first if it has none; null: refused,
  // or `owner` records into another ring now (then nothing of this ring is touched).
  history_cursor* place(history_owner const* owner) noexcept;
  // Counts a new place; false (and nothing counted or touched) when `owner` no longer records
  // into this ring.
  bool join(history_owner const* owner) noexcept;
  static void drop(history_ring* ring) noexcept;  // lets a count go; frees on the last
  // Gives the pages of the slots and chunk states back, leaving the range mapped and reading as
  // zeros: what they held when made. Called as the handle goes, while it still counts.
  void discard_storage() noexcept;
  // The whole events (copied into `out`, sorted, when it is given; `offered`: recorded() read
  // by the caller, the room to reserve) and how many of them count (at most capacity_).
  std::size_t whole_events(std::vector<history_event>* out, std::uint64_t offered) const;

  std::size_t capacity_;
  std::size_t chunk_;
  std::size_t chunks_;
  // One mapping (storage_, storage_bytes_): the slots, then the chunk states. Its pages may be
  // given back before the ring goes (discard_storage), so it is apart from anything else.
  void* storage_             = nullptr;
  std::size_t storage_bytes_ = 0;
  slot* slots_               = nullptr;
  chunk_state* states_       = nullptr;
  alignas(64) std::atomic<std::uint64_t> tickets_{0};
  std::atomic<std::uint64_t> refused_{0};  // events not written: no chunk was free
  // The chunk let go part-filled last (its index + 1; 0: none): the next claim goes on in it,
  // so threads that end or move to other rings leave no slots unused.
  std::atomic<std::size_t> partial_{0};
  std::atomic<std::size_t> refs_{1};  // the handle's count and each thread's place's
  // Set when its owner stops recording into it: a thread taking a place in another ring lets
  // its place here go (it records here no more, and the place alone keeps the ring's object and
  // address range).
  std::atomic<bool> stopped_{false};
};

/**
 * @brief Who records into rings, one at a time (a resource): the ring recorded into now, and an
 * end to each recording after which no thread takes a new place in its ring.
 *
 * A writer reads active() and records into that ring later (a resource's allocation reads it
 * before its driver call), so a stopped ring may still be written by a thread that has a place in
 * it (that place keeps its address range mapped), or be asked for one. The ring's memory goes
 * back when the handle stop() returns goes; a thread lets its places in stopped rings go when it
 * takes a place in another ring, and all of them when it ends. stop() waits for the threads
 * taking a place at that moment (a few atomic instructions; none waits on stop), so once it
 * returns no thread takes a new place in the stopped ring, and the ring is freed when its handle
 * and the places taken before are gone. start and stop are called one at a time (the resource's lock); active()
 * and record from any thread.
 */
class history_owner {
 public:
  history_owner() = default;
  ~history_owner();  ///< stops a recording still running
  history_owner(history_owner const&)            = delete;
  history_owner& operator=(history_owner const&) = delete;

  /// @brief The ring recorded into now (null: none); record into it with this owner.
  [[nodiscard]] history_ring* active() const noexcept
  {
    return active_.load(std::memory_order_acquire);
  }
  /// @brief Records into `ring` from now on. @throws std::logic_error while a recording runs.
  void start(history_ring::handle ring);
  /// @brief Ends the recording: its ring's handle, to read its events (null when none was
  /// running). The calling thread's own place in the ring goes, so a thread that records and
  /// stops in turn keeps none of its stopped rings.
  [[nodiscard]] history_ring::handle stop() noexcept;

 private:
  friend class history_ring;
  std::atomic<history_ring*> active_{nullptr};  // holds the count its start was handed
  mutable std::atomic<std::uint64_t> joining_{0};  // threads taking a place in a ring of it now
};

// What a thread knows of one ring it records into: its place (counted by the ring, so the ring
// outlives it), the chunk it holds and the next slot in it. Plain thread-local data (no guard on
// the path of an event); a thread keeps `table_size` of them, the most recently used first, and
// lets the last go when a new ring comes.
struct history_cursor {
  static constexpr std::size_t table_size = 8;

  history_ring* ring;             // null: unused
  history_ring::slot* next_slot;  // null: no chunk held
  std::uint64_t next_event;       // the number the next event gets (unique: tickets are)
  history_ring::chunk_state* state;
  std::size_t left;  // slots left in the chunk

  // This thread's cursor for `ring`, moved to the front; null: it has no place in it.
  static history_cursor* find(history_ring const& ring) noexcept;
  // A new cursor for `ring`, whose count the caller took, at the front (the last place goes).
  static history_cursor& add(history_ring& ring) noexcept;
  // Lets this thread's place in `ring` go, if it has one.
  static void forget(history_ring const& ring) noexcept;
  // Lets every place of this thread go (as it ends).
  static void let_go_all() noexcept;
  // Lets `c`'s chunk and its count go; clears c.
  static void forget(history_cursor& c) noexcept;
};

// A thread's part of the rings: the number of the event it recorded last, and its places. One
// thread-local (one address to find), its first line holding both the number and the place of
// the thread's latest ring.
struct alignas(64) history_thread {
  std::uint64_t last_event = history_no_event;
  // Set once the thread's places were let go as it ends: an event recorded after that (by a
  // thread_local destroyed later) lets its place go again at once.
  bool ended = false;
  history_cursor cursors[history_cursor::table_size] = {};
};

/// @brief This thread's history_thread: constant-initialized, so reading it calls no
/// thread-local initializer.
extern constinit thread_local history_thread history_this_thread;

/// @brief For tests: `hook` runs in a thread claiming a fresh chunk, between taking its ticket and
/// taking the chunk (where a preemption may hold a thread up); null: none.
void set_history_claim_hook(void (*hook)() noexcept) noexcept;

/// @brief Forgets the event this thread recorded last: history_last_event() says
/// history_no_event until the thread records an event again. Call it before the call whose event
/// is asked for after.
inline void history_forget_last_event() noexcept
{
  history_this_thread.last_event = history_no_event;
}

/// @brief The number (history_event::number) of the event this thread recorded last, in
/// whichever ring; history_no_event when it recorded none since history_forget_last_event (an
/// event the ring refused, or one its owner had stopped, gives no number).
[[nodiscard]] inline std::uint64_t history_last_event() noexcept
{
  return history_this_thread.last_event;
}

inline void history_ring::record(history_event const& e, history_owner const* owner) noexcept
{
  history_thread& thread = history_this_thread;
  // The thread's last ring, holding a chunk: nothing to look up or claim. (A place keeps its
  // ring alive, so no other ring is at its address: comparing the pointers is exact.)
  history_cursor* c = &thread.cursors[0];
  if (c->ring != this || c->next_slot == nullptr) [[unlikely]] {
    c = place(owner);
    if (c == nullptr) { return; }
  }
  slot& s                   = *c->next_slot;
  std::uint64_t const event = c->next_event;
  // The holder is this chunk's only writer: plain stores, ordered for a reader by the sequence.
  s.seq.store(2 * event + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  // Field by field: copying the event whole first read it in 16-byte loads, which wait for the
  // caller's 8-byte stores that just built it (a failed store forward) where it is not inlined.
  s.f[0].store(e.time_ns, std::memory_order_relaxed);
  s.f[1].store(e.address, std::memory_order_relaxed);
  s.f[2].store(e.bytes, std::memory_order_relaxed);
  s.f[3].store(e.stream, std::memory_order_relaxed);
  s.f[4].store(e.reserved, std::memory_order_relaxed);
  s.f[5].store(e.used, std::memory_order_relaxed);
  s.f[6].store((e.cached < cached_mask ? e.cached : cached_mask) |
                 (std::uint64_t{static_cast<std::uint32_t>(e.action)} << action_shift),
               std::memory_order_relaxed);
  s.seq.store(2 * event + 2, std::memory_order_release);
  c->next_event      = event + 1;
  thread.last_event = event;
  ++c->next_slot;
  if (--c->left == 0) { let_go(*c); }
  if (thread.ended) [[unlikely]] { history_cursor::let_go_all(); }
}

}  // namespace asyncmr::detail

/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The allocation-history ring (detail/history.hpp) on the CPU, and a resource's recording on
// the GPU: what each kind of call records, in order, with the pool's state.

#include "test_support.hpp"

#include <asyncmr/detail/history.hpp>

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <map>
#include <mutex>
#include <memory>
#include <set>
#include <utility>
#include <stdexcept>
#include <thread>
#include <vector>

namespace asyncmr::detail {
namespace {

history_event event(std::uint64_t n)
{
  return {n, n * 256, n, 7, 0, 0, 0, history_action::alloc};
}

// A reader copying the ring's events over and over while writers record, counting the torn ones
// (every field of an event(n) derives from its time stamp n).
class reader_during_writes {
 public:
  explicit reader_during_writes(history_ring const& ring)
    : reader_{[this, &ring] {
        while (!done_.load()) {
          for (auto const& e : ring.events()) {
            if (e.address != e.time_ns * 256 || e.bytes != e.time_ns || e.stream != 7) { ++torn_; }
          }
        }
      }}
  {
  }
  // Stops the reader; the torn events it saw.
  std::uint64_t stop()
  {
    done_ = true;
    reader_.join();
    return torn_.load();
  }

 private:
  std::atomic<bool> done_{false};
  std::atomic<std::uint64_t> torn_{0};
  std::thread reader_;  // last: it starts once the counters exist
};

// `ring_count` rings of 4096 events, `per_ring` events recorded into each in turn by this thread:
// each ring keeps them all, in order.
void expect_rings_in_turn_keep_every_event(int ring_count, std::uint64_t per_ring)
{
  std::vector<history_ring::handle> rings;
  for (int r = 0; r < ring_count; ++r) { rings.push_back(history_ring::make(4096)); }
  for (std::uint64_t i = 0; i < per_ring; ++i) {
    for (auto& ring : rings) { ring->record(event(i)); }
  }
  for (auto& ring : rings) {
    std::uint64_t dropped = 1;
    auto const events     = ring->events(dropped);
    ASSERT_EQ(events.size(), per_ring);
    EXPECT_EQ(dropped, 0U);
    for (std::uint64_t i = 0; i < per_ring; ++i) { ASSERT_EQ(events[i].time_ns, i); }
  }
}

TEST(HistoryRing, RefusesNoEventsAndTooMany)
{
  EXPECT_THROW(static_cast<void>(history_ring::make(0)), std::invalid_argument);
  EXPECT_THROW(static_cast<void>(history_ring::make(history_ring::max_capacity + 1)),
               std::invalid_argument);
}

TEST(HistoryRing, KeepsEventsInOrder)
{
  auto const ring = history_ring::make(16);
  for (std::uint64_t n = 0; n < 10; ++n) { ring->record(event(n)); }
  auto const events = ring->events();
  ASSERT_EQ(events.size(), 10U);
  for (std::uint64_t n = 0; n < 10; ++n) {
    EXPECT_EQ(events[n].time_ns, n);
    EXPECT_EQ(events[n].address, n * 256);
  }
  EXPECT_EQ(ring->dropped(), 0U);
}

TEST(HistoryRing, AFullRingDropsTheOldestAndCountsThem)
{
  auto const ring = history_ring::make(8);
  for (std::uint64_t n = 0; n < 20; ++n) { ring->record(event(n)); }
  auto const events = ring->events();
  ASSERT_EQ(events.size(), 8U);
  EXPECT_EQ(events.front().time_ns, 12U);
  EXPECT_EQ(events.back().time_ns, 19U);
  EXPECT_EQ(ring->dropped(), 12U);
  EXPECT_EQ(ring->recorded(), 20U);
}

TEST(HistoryRing, EveryFieldAndActionComesBackWhole)
{
  auto const ring = history_ring::make(8);
  std::uint64_t const big = (std::uint64_t{1} << 56) - 1;  // the largest cache charge kept
  ring->record({1, 2, 3, 4, 5, 6, big, history_action::oom});
  ring->record({~std::uint64_t{0}, ~std::uint64_t{0}, ~std::uint64_t{0}, ~std::uint64_t{0},
               ~std::uint64_t{0}, ~std::uint64_t{0}, 0, history_action::trim});
  auto const events = ring->events();
  ASSERT_EQ(events.size(), 2U);
  EXPECT_EQ(events[0].time_ns, 1U);
  EXPECT_EQ(events[0].address, 2U);
  EXPECT_EQ(events[0].bytes, 3U);
  EXPECT_EQ(events[0].stream, 4U);
  EXPECT_EQ(events[0].reserved, 5U);
  EXPECT_EQ(events[0].used, 6U);
  EXPECT_EQ(events[0].cached, big);
  EXPECT_EQ(events[0].action, history_action::oom);
  EXPECT_EQ(events[1].time_ns, ~std::uint64_t{0});
  EXPECT_EQ(events[1].used, ~std::uint64_t{0});
  EXPECT_EQ(events[1].cached, 0U);
  EXPECT_EQ(events[1].action, history_action::trim);
}

// Stamps, whichever kind this machine makes, read back as steady_clock nanoseconds: in order,
// between the clock readings around them, and as far apart as the clock says.
TEST(HistoryStamp, ConvertsToTheSteadyClock)
{
  std::uint64_t const before = history_now_ns();
  std::uint64_t const first  = history_stamp();
  std::uint64_t const mid_ns = history_now_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::uint64_t const second = history_stamp();
  std::uint64_t const after  = history_now_ns();
  history_stamp_converter const to_ns;
  std::uint64_t const a = to_ns(first);
  std::uint64_t const b = to_ns(second);
  // The tick rate is measured over this process's life so far: allow 1% and 50 us of reading.
  std::uint64_t const slack = (after - before) / 100 + 50'000;
  EXPECT_GE(a + slack, before);
  EXPECT_LE(a, mid_ns + slack);
  EXPECT_GE(b + slack, mid_ns + 20'000'000);
  EXPECT_LE(b, after + slack);
  EXPECT_LT(a, b);
  EXPECT_LE(to_ns(first), to_ns(first + 1)) << "monotonic";
  if (!history_stamps_are_ticks()) { EXPECT_EQ(a, first) << "steady_clock stamps are already ns"; }
  EXPECT_GE(history_stamp_converter{}.stamps_in(100'000), 100'000U)
    << "100 us span at least 100k stamps (nanoseconds, or ticks of a counter of >= 1 GHz)";
}

// A stamp and a steady_clock reading taken together: of a few tries, the one whose stamps around
// the clock's reading are nearest (a thread can be held up for microseconds between two reads).
struct stamped_instant {
  std::uint64_t stamp;
  std::uint64_t ns;
  std::uint64_t width;  // stamps between the two stamp reads around the clock's
};

stamped_instant stamp_and_clock()
{
  stamped_instant best{};
  std::uint64_t width = ~std::uint64_t{0};
  for (int i = 0; i < 5; ++i) {
    std::uint64_t const a  = history_stamp();
    std::uint64_t const ns = history_now_ns();
    std::uint64_t const b  = history_stamp();
    if (b - a < width) {
      width = b - a;
      best  = {a + (b - a) / 2, ns, b - a};
    }
  }
  return best;
}

// The checks of HistoryStamp.TheFirstRecordingOfAProcessSpansWhatItAsks, in a process of its
// own: its first stamp is taken here. The exit code says which failed (0: none).
int check_the_first_stamps_of_a_process()
{
  std::uint64_t const first  = history_stamp();  // the process's reference is taken now
  // What a first recording reads the pool by:
  std::uint64_t const period = history_stamp_converter{}.stamps_in(100'000);
  stamped_instant const t0   = stamp_and_clock();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stamped_instant const t1  = stamp_and_clock();
  double const per_ns       = static_cast<double>(t1.stamp - t0.stamp) / (t1.ns - t0.ns);
  double const true_period  = 100'000 * per_ns;  // the stamps 100 us span, measured over 20 ms
  std::uint64_t const later = history_stamp_converter{}.stamps_in(100'000);
  history_stamp_converter const to_ns;
  double const span = static_cast<double>(to_ns(t1.stamp) - to_ns(t0.stamp));
  std::fprintf(stderr, "first recording's period %llu stamps, later %llu, true %.0f; 20 ms read "
               "as %.0f ns (clock: %llu); pair widths %llu and %llu stamps\n",
               static_cast<unsigned long long>(period), static_cast<unsigned long long>(later),
               true_period, span, static_cast<unsigned long long>(t1.ns - t0.ns),
               static_cast<unsigned long long>(t0.width),
               static_cast<unsigned long long>(t1.width));
  std::fflush(stderr);
  if (first > t0.stamp) { return 1; }
  if (static_cast<double>(period) > true_period * 1.002) { return 2; }  // too long: reads too few
  // Each pair (the converter's two and these two) is off by at most its read's width; where the
  // clock is read in ~40 ns that is 2 ppm over 20 ms, and the bounds below are 1 us and 1e-4. A
  // machine whose clock read is slow (a system call in some virtual machines) widens them by its
  // own widths. (A pair read apart, as the first reading of the clock in a process can be, put
  // these 4 to 13 us off: the widths are of the best of five reads, so they stay small here.)
  double const read_ns =
    static_cast<double>(std::max(t0.width, t1.width)) / per_ns;  // one pair's width, in ns
  double const slack_ns = 1'000 + 4 * read_ns;
  double const clock_ns = static_cast<double>(t1.ns - t0.ns);
  if (std::abs(static_cast<double>(later) - true_period) >
      true_period * (1e-4 + 4 * read_ns / clock_ns)) {
    return 3;
  }
  if (std::abs(span - clock_ns) > slack_ns) { return 4; }
  return 0;
}

// A process's first recording reads the pool at least as often as every later one: a span of
// 100 us in stamps, asked for as the process takes its first stamp, is never longer than 100 us
// (the counter's rate cannot be measured over a few nanoseconds yet), and once it has been
// measured it is as close as a later recording's. Run in a child of its own (threadsafe
// death-test style), whose first stamp is this test's whichever tests ran before.
TEST(HistoryStamp, TheFirstRecordingOfAProcessSpansWhatItAsks)
{
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::_Exit(check_the_first_stamps_of_a_process()), ::testing::ExitedWithCode(0), "");
}

// Writers on several threads and a reader at the same time (ThreadSanitizer runs this too): the
// reader only ever copies whole events, each one a writer wrote.
TEST(HistoryRing, ManyWritersAndAReaderSeeOnlyWholeEvents)
{
  auto const ring = history_ring::make(1024);
  constexpr int threads = 8;
  constexpr std::uint64_t per_thread = 20000;
  reader_during_writes reader{*ring};
  std::vector<std::thread> writers;
  for (int t = 0; t < threads; ++t) {
    writers.emplace_back([&ring, t] {
      for (std::uint64_t i = 0; i < per_thread; ++i) { ring->record(event(t * per_thread + i)); }
    });
  }
  for (auto& w : writers) { w.join(); }
  EXPECT_EQ(reader.stop(), 0U);
  EXPECT_EQ(ring->recorded(), threads * per_thread);
  EXPECT_LE(ring->events().size(), 1024U);
}

// Rings of 1024 events and up are cut in chunks a thread holds and fills alone.
TEST(HistoryRing, ChunksAreSizedByTheRing)
{
  EXPECT_EQ(history_ring::make(8)->chunk_events(), 1U);
  EXPECT_EQ(history_ring::make(1023)->chunk_events(), 1U);
  EXPECT_EQ(history_ring::make(1024)->chunk_events(), 16U);
  EXPECT_EQ(history_ring::make(65536)->chunk_events(), history_ring::max_chunk);
}

// A chunked ring, full, keeps its newest `capacity` events in order and counts the rest.
TEST(HistoryRing, AFullChunkedRingKeepsTheNewestInOrder)
{
  auto const ring = history_ring::make(1000 + 1024);  // not a whole number of chunks
  std::uint64_t const n = 10'000;
  for (std::uint64_t i = 0; i < n; ++i) { ring->record(event(i)); }
  std::uint64_t dropped = 0;
  auto const events     = ring->events(dropped);
  ASSERT_EQ(events.size(), ring->capacity());
  EXPECT_EQ(events.front().time_ns, n - ring->capacity());
  EXPECT_EQ(events.back().time_ns, n - 1);
  for (std::size_t i = 1; i < events.size(); ++i) { ASSERT_EQ(events[i].time_ns, events[i - 1].time_ns + 1); }
  EXPECT_EQ(dropped, n - ring->capacity());
  EXPECT_EQ(ring->dropped(), dropped);
  EXPECT_EQ(ring->recorded(), n);
}

// A thread that stops part-way through its chunk keeps those events (read back first: they are
// the oldest) and the chunk's other slots unused; once it ends, its chunk goes back to the ring
// and newer events overwrite them.
TEST(HistoryRing, AQuietThreadKeepsItsChunkUntilItEnds)
{
  auto const ring = history_ring::make(1024);  // 64 chunks of 16
  std::atomic<int> stage{0};
  std::thread quiet{[&] {
    for (std::uint64_t i = 0; i < 3; ++i) { ring->record(event(i)); }
    stage = 1;
    while (stage.load() != 2) { std::this_thread::yield(); }
  }};
  while (stage.load() != 1) { std::this_thread::yield(); }
  for (std::uint64_t i = 100; i < 100 + 4 * 1024; ++i) { ring->record(event(i)); }
  auto const kept = ring->events();
  stage           = 2;
  quiet.join();
  ASSERT_EQ(kept.size(), 1024U - 13) << "63 chunks of the newest, and the quiet thread's 3";
  EXPECT_EQ(kept[0].time_ns, 0U);
  EXPECT_EQ(kept[2].time_ns, 2U);
  EXPECT_EQ(kept[3].time_ns, 100U + 4 * 1024 - 1008) << "then the newest, in order";
  EXPECT_EQ(kept.back().time_ns, 100U + 4 * 1024 - 1);
  for (std::uint64_t i = 10'000; i < 10'000 + 2 * 1024; ++i) { ring->record(event(i)); }
  auto const after = ring->events();
  ASSERT_EQ(after.size(), 1024U);
  EXPECT_EQ(after.front().time_ns, 10'000U + 1024) << "the ended thread's chunk was reused";
  EXPECT_EQ(ring->recorded(), 3U + 4 * 1024 + 2 * 1024);
  EXPECT_EQ(ring->dropped(), ring->recorded() - 1024);
}

// Threads that each record a little and end (a pool that churns threads) give their chunks
// back: far more threads than the ring has chunks lose nothing but the oldest.
TEST(HistoryRing, ThreadsThatEndGiveTheirChunksBack)
{
  auto const ring = history_ring::make(1024);  // 64 chunks of 16
  for (std::uint64_t t = 0; t < 200; ++t) {
    std::thread{[&ring, t] { ring->record(event(t)); }}.join();
  }
  for (std::uint64_t i = 1000; i < 1000 + 1024; ++i) { ring->record(event(i)); }
  EXPECT_EQ(ring->recorded(), 200U + 1024);
  auto const events = ring->events();
  ASSERT_EQ(events.size(), 1024U);
  EXPECT_EQ(events.front().time_ns, 1000U) << "every chunk an ended thread held was reused";
  EXPECT_EQ(ring->dropped(), 200U);
}

// A thread_local whose destructor records (a buffer made at the thread's start and freed
// through a recording resource as the thread ends) is destroyed after the thread's places were
// let go, if it was made before the thread's first event: its event takes a place again, which
// must be let go too, or the ring outlives every handle (found by a review helper).
history_ring* g_ring_at_exit = nullptr;
struct records_at_exit {
  ~records_at_exit() { g_ring_at_exit->record(event(7)); }
};

TEST(HistoryRing, AnEventRecordedAsItsThreadEndsKeepsNoPlace)
{
  auto const live_before = history_ring::live();
  {
    auto ring      = history_ring::make(1024);
    g_ring_at_exit = ring.get();
    std::thread{[&ring] {
      thread_local records_at_exit late;  // made first: destroyed last
      static_cast<void>(&late);
      ring->record(event(1));
    }}.join();
    auto const events = ring->events();
    ASSERT_EQ(events.size(), 2U) << "the event of the ending thread is kept";
    EXPECT_EQ(events.back().time_ns, 7U);
    EXPECT_EQ(history_ring::live(), live_before + 1);
  }
  EXPECT_EQ(history_ring::live(), live_before) << "the ring outlived its last handle";
}

// A thread held up between its ticket and its chunk (a preemption) while other threads claim
// their way round the ring: it then holds a chunk whose later slots hold a newer claim's events,
// already counted as written. Counting them again as the holder's made recorded() and dropped()
// too high for as long as it held the chunk (found by a review helper).
std::atomic<int> held_up_stage{0};
thread_local bool held_up_thread = false;

TEST(HistoryRing, AClaimHeldUpWhileOthersGoRoundTheRingCountsEachEventOnce)
{
  auto const ring = history_ring::make(1024);  // 64 chunks of 16
  held_up_stage.store(0);
  set_history_claim_hook([]() noexcept {
    if (held_up_thread && held_up_stage.load() == 0) {
      held_up_stage.store(1);
      while (held_up_stage.load() != 2) { std::this_thread::yield(); }
    }
  });
  std::thread held_up{[&ring] {
    held_up_thread = true;
    ring->record(event(0));  // ticket 0: held up before it takes chunk 0
    held_up_stage.store(3);
    while (held_up_stage.load() != 4) { std::this_thread::yield(); }  // quiet, holding it
  }};
  while (held_up_stage.load() != 1) { std::this_thread::yield(); }
  for (std::uint64_t i = 1; i <= 1024; ++i) { ring->record(event(i)); }
  held_up_stage.store(2);
  while (held_up_stage.load() != 3) { std::this_thread::yield(); }
  set_history_claim_hook(nullptr);
  std::uint64_t dropped = 0;
  auto const events     = ring->events(dropped);
  EXPECT_EQ(ring->recorded(), 1025U) << "events offered: 1 + 1024";
  EXPECT_EQ(dropped, 1025U - events.size());
  EXPECT_EQ(ring->dropped(), 1025U - events.size());
  held_up_stage.store(4);
  held_up.join();
  EXPECT_EQ(ring->recorded(), 1025U);
}

// A long-lived thread (a worker of a pool) that recorded into a recording since stopped keeps its
// place there, and with it the ring's object and address range (its memory goes with its handle:
// the test below), until it ends. When it takes a place in a new ring, its places in stopped ones
// go (found by a review helper).
TEST(HistoryRing, AThreadJoiningANewRecordingLetsItsPlacesInStoppedOnesGo)
{
  history_owner owner;
  auto const live_before = history_ring::live();
  std::atomic<int> step{0};
  auto record_now = [&owner] {
    if (history_ring* const ring = owner.active()) { ring->record(event(1), &owner); }
  };
  owner.start(history_ring::make(1024));
  std::thread worker{[&] {
    record_now();  // into the first recording
    step.store(1);
    while (step.load() != 2) { std::this_thread::yield(); }
    record_now();  // into the second
    step.store(3);
    while (step.load() != 4) { std::this_thread::yield(); }
  }};
  while (step.load() != 1) { std::this_thread::yield(); }
  static_cast<void>(owner.stop());  // its handle goes at once: only the worker's place keeps it
  EXPECT_EQ(history_ring::live(), live_before + 1);
  owner.start(history_ring::make(1024));
  step.store(2);
  while (step.load() != 3) { std::this_thread::yield(); }
  EXPECT_EQ(history_ring::live(), live_before + 1) << "the stopped ring outlived its recording";
  step.store(4);
  worker.join();
  static_cast<void>(owner.stop());
  EXPECT_EQ(history_ring::live(), live_before);
}

// Many short-lived threads, each recording a couple of events (a thread pool's workers that come
// and go): the ring keeps all of them while they fit, not one chunk's worth of slots per thread.
TEST(HistoryRing, ShortLivedThreadsLoseNoEventsTheRingHasRoomFor)
{
  auto const ring = history_ring::make(65536);  // 4096 chunks of 16
  for (std::uint64_t t = 0; t < 10000; ++t) {
    std::thread{[&ring, t] {
      ring->record(event(2 * t));
      ring->record(event(2 * t + 1));
    }}.join();
  }
  std::uint64_t dropped = 1;
  auto const events     = ring->events(dropped);
  EXPECT_EQ(ring->recorded(), 20000U);
  EXPECT_EQ(events.size(), 20000U);
  EXPECT_EQ(dropped, 0U);
  for (std::size_t i = 0; i < events.size(); ++i) {
    ASSERT_EQ(events[i].time_ns, i) << "an event out of order, or a hole";
  }
}

// Threads coming and going on several threads at once, while a reader reads: part-filled chunks
// go from one claim to the next with every event whole and counted once.
TEST(HistoryRing, ThreadsComingAndGoingAtOnceKeepEveryEventWholeAndCounted)
{
  auto const ring = history_ring::make(65536);
  constexpr int spawners = 6;
  constexpr std::uint64_t per_spawner = 400;  // threads, 3 events each
  reader_during_writes reader{*ring};
  std::vector<std::thread> spawning;
  for (int s = 0; s < spawners; ++s) {
    spawning.emplace_back([&ring, s] {
      for (std::uint64_t t = 0; t < per_spawner; ++t) {
        std::uint64_t const base = (s * per_spawner + t) * 3;
        std::thread{[&ring, base] {
          for (std::uint64_t i = 0; i < 3; ++i) { ring->record(event(base + i)); }
        }}.join();
      }
    });
  }
  for (auto& t : spawning) { t.join(); }
  EXPECT_EQ(reader.stop(), 0U);
  std::uint64_t dropped = 1;
  auto const events     = ring->events(dropped);
  EXPECT_EQ(ring->recorded(), spawners * per_spawner * 3);
  EXPECT_EQ(events.size() + dropped, spawners * per_spawner * 3);
  std::set<std::uint64_t> seen;
  for (auto const& e : events) { EXPECT_TRUE(seen.insert(e.time_ns).second) << "twice"; }
}

// One thread recording into more rings than it keeps places for, many events each (a process
// recording every GPU's resource and a pinned one): every ring keeps all it has room for.
TEST(HistoryRing, OneThreadRecordingIntoManyRingsLosesNoEventsTheyHaveRoomFor)
{
  int const more_than_a_thread_keeps = 2 * static_cast<int>(history_cursor::table_size) + 1;
  expect_rings_in_turn_keep_every_event(more_than_a_thread_keeps, 1000);
}

// One thread recording into more rings than it keeps places for (8), in turn: every ring gets
// every event, and rings that come and go (at one address, often) start afresh.
TEST(HistoryRing, OneThreadRecordsIntoManyRingsInTurn)
{
  expect_rings_in_turn_keep_every_event(11, 100);
  for (int round = 0; round < 20; ++round) {
    auto const ring = history_ring::make(4096);
    ring->record(event(1));
    ring->record(event(2));
    EXPECT_EQ(ring->events().size(), 2U);
    EXPECT_EQ(ring->dropped(), 0U);
  }
}

// Chunks of one slot (a small ring) claimed by many threads at once: whole events only, every
// event counted, the ring full at the end.
TEST(HistoryRing, ManyWritersOnASmallRingSeeOnlyWholeEvents)
{
  auto const ring = history_ring::make(64);
  constexpr int threads             = 8;
  constexpr std::uint64_t per_thread = 20000;
  std::vector<std::thread> writers;
  for (int t = 0; t < threads; ++t) {
    writers.emplace_back([&ring, t] {
      for (std::uint64_t i = 0; i < per_thread; ++i) { ring->record(event(t * per_thread + i)); }
    });
  }
  for (auto& w : writers) { w.join(); }
  auto const events = ring->events();
  EXPECT_EQ(events.size(), 64U);
  for (auto const& e : events) { EXPECT_EQ(e.address, e.time_ns * 256); }
  EXPECT_EQ(ring->recorded(), threads * per_thread);
  EXPECT_EQ(ring->dropped(), threads * per_thread - 64);
}

// Every event comes back with the number its thread was told as it recorded it
// (history_last_event), on several threads at once and after the ring dropped older ones: what a
// caller knows of an event it made (a Python stack) is matched to that event by its number, never
// to another event at the same address.
TEST(HistoryRing, EveryEventComesBackWithTheNumberItsThreadWasTold)
{
  auto const ring = history_ring::make(1024);
  constexpr int threads              = 4;
  constexpr std::uint64_t per_thread = 3000;  // more than the ring keeps
  std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>> told(threads);  // (number, n)
  std::vector<std::thread> writers;
  for (int t = 0; t < threads; ++t) {
    writers.emplace_back([&ring, &told, t] {
      for (std::uint64_t i = 0; i < per_thread; ++i) {
        std::uint64_t const n = t * per_thread + i;
        history_forget_last_event();
        ring->record(event(n));
        told[t].emplace_back(history_last_event(), n);
      }
    });
  }
  for (auto& w : writers) { w.join(); }
  std::map<std::uint64_t, std::uint64_t> made_by_number;
  for (auto const& thread : told) {
    for (auto const& [number, n] : thread) {
      ASSERT_NE(number, history_no_event) << "event " << n << " was recorded";
      ASSERT_TRUE(made_by_number.emplace(number, n).second) << "number " << number << " twice";
    }
  }
  auto const events = ring->events();
  ASSERT_EQ(events.size(), ring->capacity());
  for (auto const& e : events) {
    auto const made = made_by_number.find(e.number);
    ASSERT_NE(made, made_by_number.end()) << "event " << e.time_ns << ": a number no one was told";
    EXPECT_EQ(made->second, e.time_ns) << "number " << e.number << " names another event";
  }
}

// A thread is told of no event after it forgot its last one until it records again: an event the
// ring refused (every chunk held by another thread) gives no number, so a caller attaches what it
// knows to nothing rather than to the thread's event before.
TEST(HistoryRing, ARefusedEventGivesNoNumber)
{
  auto const ring = history_ring::make(1024);  // 64 chunks of 16
  std::atomic<int> holding{0};
  std::atomic<bool> release{false};
  std::vector<std::thread> holders;
  for (std::size_t t = 0; t < 1024 / ring->chunk_events(); ++t) {
    holders.emplace_back([&ring, &holding, &release, t] {
      ring->record(event(t));  // holds a chunk, part-filled, until it ends
      ++holding;
      while (!release.load()) { std::this_thread::yield(); }
    });
  }
  while (holding.load() != static_cast<int>(holders.size())) { std::this_thread::yield(); }
  ring->record(event(500));  // refused: no chunk is free
  EXPECT_EQ(ring->dropped(), 1U);
  history_forget_last_event();
  EXPECT_EQ(history_last_event(), history_no_event);
  ring->record(event(501));
  EXPECT_EQ(history_last_event(), history_no_event) << "refused: no event to be told of";
  release = true;
  for (auto& h : holders) { h.join(); }
  ring->record(event(502));
  // Told the number event 502 has in this ring. (Numbers are unique within a ring only: one an
  // earlier test's ring gave this thread may be 502's too, so only this ring's answer counts.)
  auto const events = ring->events();
  auto const recorded =
    std::find_if(events.begin(), events.end(), [](auto const& e) { return e.time_ns == 502; });
  ASSERT_NE(recorded, events.end());
  EXPECT_EQ(history_last_event(), recorded->number);
  EXPECT_EQ(ring->dropped(), 2U) << "500 and 501 refused, 502 kept";
}

// A thread that read the ring recorded into and is held up until its recording stopped (a
// resource's allocation reads it before its driver call): with no place in the ring, it finds the
// ring stopped and touches nothing of it, which is freed already; with a place, it writes into the
// ring, which its place keeps until the thread lets it go. (A write into the freed ring would be
// a use after free, which ThreadSanitizer reports.)
TEST(HistoryRing, AWriterLateForAStoppedRingWritesOnlyWhereItHasAPlace)
{
  for (bool const has_place : {false, true}) {
    SCOPED_TRACE(has_place ? "a writer with a place in the ring" : "a writer with none");
    auto const live_before = history_ring::live();
    history_owner owner;
    owner.start(history_ring::make(1024));
    std::atomic<int> stage{0};
    std::uint64_t told = 0;
    std::thread writer{[&] {
      history_ring* const ring = owner.active();
      if (has_place) { ring->record(event(1), &owner); }
      stage = 1;
      while (stage.load() != 2) { std::this_thread::yield(); }
      history_forget_last_event();
      ring->record(event(2), &owner);  // after the stop
      told = history_last_event();
      stage = 3;
      while (stage.load() != 4) { std::this_thread::yield(); }
    }};
    while (stage.load() != 1) { std::this_thread::yield(); }
    {
      auto const ring = owner.stop();
      EXPECT_EQ(ring->events().size(), has_place ? 1U : 0U);
    }
    EXPECT_EQ(history_ring::live(), live_before + (has_place ? 1 : 0))
      << "freed with its handle, unless the writer's place holds it";
    stage = 2;
    while (stage.load() != 3) { std::this_thread::yield(); }
    if (has_place) {
      EXPECT_NE(told, history_no_event) << "written into the ring its place keeps";
    } else {
      EXPECT_EQ(told, history_no_event) << "dropped: the ring is gone";
    }
    stage = 4;
    writer.join();
    EXPECT_EQ(history_ring::live(), live_before) << "the writer's end let its place go";
  }
}

// This process's resident memory in bytes (/proc/self/statm): what a ring's storage costs the
// machine, whichever object holds it.
std::int64_t resident_bytes()
{
  std::FILE* const f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) { return -1; }
  long pages = 0, resident = 0;  // NOLINT(google-runtime-int): fscanf's %ld
  int const read = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return read == 2 ? static_cast<std::int64_t>(resident) * sysconf(_SC_PAGESIZE) : -1;
}

// A thread that recorded into a recording and then stays alive doing nothing more with rings (a
// worker parked between tasks, or one that goes on allocating through resources that do not
// record): once the recording stopped and its handle is gone, the ring's memory goes back,
// though the thread never comes back to let its place go (found by a review: the place kept the
// whole ring, 64 MiB here, until the thread ended).
TEST(HistoryRing, AnIdleThreadsPlaceKeepsNoStoppedRingsMemory)
{
  constexpr std::size_t capacity = std::size_t{1} << 20;  // 64 MiB of slots
  constexpr std::int64_t ring_bytes = static_cast<std::int64_t>(capacity) * 64;
  history_owner owner;
  owner.start(history_ring::make(capacity));  // constructing its slots touched every page
  std::int64_t const recording = resident_bytes();
  ASSERT_GT(recording, 0) << "no /proc/self/statm";
  std::mutex m;
  std::condition_variable cv;
  bool recorded = false;
  bool leave    = false;
  std::thread idle{[&] {
    if (history_ring* const ring = owner.active()) { ring->record(event(1), &owner); }
    std::unique_lock lock{m};
    recorded = true;
    cv.notify_all();
    cv.wait(lock, [&] { return leave; });  // parked: records nothing more, and stays alive
  }};
  {
    std::unique_lock lock{m};
    cv.wait(lock, [&] { return recorded; });
  }
  {
    auto const ring = owner.stop();
    ASSERT_EQ(ring->events().size(), 1U);
  }  // the handle goes: nobody can read the ring any more
  std::int64_t const stopped = resident_bytes();
  EXPECT_GE(recording - stopped, ring_bytes * 3 / 4)
    << "resident while recording " << recording << " B, after the stop " << stopped
    << " B: the idle thread's place kept the stopped ring's memory";
  {
    std::lock_guard lock{m};
    leave = true;
  }
  cv.notify_all();
  idle.join();
}

// Recordings one after another on one long-lived owner (a resource recording each step of a long
// run), while two threads that stay and threads that come and go write into whichever ring is
// active, as a resource's callers do: each stopped ring is freed once no thread can write into it
// any more, so the rings alive stay a few however many recordings there were, and every event
// read is whole. (ThreadSanitizer runs this too; the test before makes a late writer for
// certain.)
TEST(HistoryRing, StoppedRingsAreFreedOnceNoThreadCanWriteIntoThem)
{
  constexpr int recordings = 300;
  constexpr int staying    = 2;  // threads that write throughout
  constexpr int churning   = 2;  // threads that start short-lived writers, one after another
  history_cursor::let_go_all();  // this thread's places in rings of earlier tests
  auto const alive = [before = static_cast<std::int64_t>(history_ring::live())] {
    return static_cast<std::int64_t>(history_ring::live()) - before;
  };
  history_owner owner;
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> next{0};
  // As a resource's allocation does: the ring is read before the driver call and recorded into
  // after it (here a sleep, for one event in four), by when its recording may have stopped.
  auto write = [&](int events) {
    for (int i = 0; i < events; ++i) {
      if (history_ring* const ring = owner.active()) {
        if (i % 4 == 0) { std::this_thread::sleep_for(std::chrono::microseconds(100)); }
        ring->record(event(next.fetch_add(1)), &owner);
      }
    }
  };
  std::vector<std::thread> writers;
  for (int t = 0; t < staying; ++t) {
    writers.emplace_back([&] {
      while (!done.load()) { write(16); }
    });
  }
  for (int t = 0; t < churning; ++t) {
    writers.emplace_back([&] {
      while (!done.load()) { std::thread{[&] { write(3); }}.join(); }
    });
  }
  std::int64_t most_alive = 0;
  std::uint64_t torn      = 0;
  std::uint64_t read      = 0;
  for (int r = 0; r < recordings; ++r) {
    owner.start(history_ring::make(1024));
    write(1);  // the thread that stops records too
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    auto const ring = owner.stop();
    for (auto const& e : ring->events()) {
      if (e.address != e.time_ns * 256 || e.bytes != e.time_ns || e.stream != 7) { ++torn; }
      ++read;
    }
    most_alive = std::max(most_alive, alive());
  }
  done = true;
  for (auto& w : writers) { w.join(); }
  EXPECT_EQ(torn, 0U);
  EXPECT_GT(read, std::uint64_t{recordings}) << "the writers wrote into the rings";
  // A thread keeps a place in its 8 most recent rings: each staying thread holds up to 8 stopped
  // ones, each short-lived one the one or two it wrote into; and the ring being read.
  auto const places = static_cast<std::int64_t>(history_cursor::table_size);
  EXPECT_LE(most_alive, staying * places + churning * 2 + 1);
  EXPECT_LE(alive(), 0) << "every stopped ring freed once the threads that wrote into it ended";
}

}  // namespace
}  // namespace asyncmr::detail

namespace asyncmr::test {
namespace {

class HistoryTest : public GpuTest {};

// The calls' own events, leaving out the pool's growth and trims (when a pool gives memory back
// is the driver's choice: at a synchronization, with a release threshold of 0).
std::vector<detail::history_action> calls(std::vector<detail::history_event> const& events)
{
  std::vector<detail::history_action> out;
  for (auto const& e : events) {
    if (e.action != detail::history_action::grow && e.action != detail::history_action::trim) {
      out.push_back(e.action);
    }
  }
  return out;
}

TEST_F(HistoryTest, ACachedResourceRecordsAllocationsHitsPutsAndGrowth)
{
  using detail::history_action;
  async_device_memory_resource mr{{.source = pool_source::new_pool, .cache = 64 * mib}};
  mr.start_history(1024);
  EXPECT_THROW(mr.start_history(16), std::logic_error) << "one recording at a time";
  void* p = mr.allocate(stream_ref(), 4096);  // a miss: the new pool grows
  mr.deallocate(stream_ref(), p, 4096);       // kept by the cache
  void* q = mr.allocate(stream_ref(), 4096);  // a hit
  EXPECT_EQ(q, p);
  mr.deallocate(stream_ref(), q, 4096);
  EXPECT_THROW(static_cast<void>(mr.allocate(stream_ref(), std::size_t{1} << 50)), rmm::out_of_memory);
  std::uint64_t dropped = 99;
  auto const events = mr.stop_history(dropped);
  EXPECT_EQ(dropped, 0U);
  std::vector<history_action> const expected{history_action::alloc, history_action::cache_put,
                                             history_action::cache_hit, history_action::cache_put,
                                             history_action::oom};
  EXPECT_EQ(calls(events), expected);
  ASSERT_GE(events.size(), expected.size() + 1);
  EXPECT_EQ(events[0].action, history_action::grow) << "the new pool grew for the first block";
  EXPECT_GE(events[0].bytes, 4096U) << "the growth's size";
  EXPECT_EQ(events[1].address, reinterpret_cast<std::uintptr_t>(p));
  EXPECT_EQ(events[1].stream, reinterpret_cast<std::uintptr_t>(stream()));
  EXPECT_GE(events[1].reserved, 4096U);
  EXPECT_GE(events[1].used, 4096U);
  EXPECT_GT(events[2].cached, 0U) << "the cache's charge after a put";
  for (std::size_t i = 1; i < events.size(); ++i) { EXPECT_GE(events[i].time_ns, events[i - 1].time_ns); }
  EXPECT_THROW(static_cast<void>(mr.stop_history(dropped)), std::logic_error);
  EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
}

TEST_F(HistoryTest, AnUncachedResourceRecordsFreesAndTrims)
{
  using detail::history_action;
  async_pinned_memory_resource mr{{.source = pool_source::new_pool}};
  mr.start_history(64);
  void* p = mr.allocate(stream_ref(), 1 * mib);
  mr.deallocate(stream_ref(), p, 1 * mib);
  EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
  mr.trim_to(0);
  std::uint64_t dropped = 0;
  auto const events = mr.stop_history(dropped);
  std::vector<history_action> const expected{history_action::alloc, history_action::free};
  EXPECT_EQ(calls(events), expected);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().action, history_action::grow);
  EXPECT_EQ(events.back().action, history_action::trim) << "trim_to gave the memory back";
  EXPECT_EQ(events.back().reserved, 0U);
  EXPECT_EQ(events.back().bytes, events.front().bytes) << "all that the pool grew by";
}

// A recording per step on one long-lived resource: each stopped recording's ring is freed at its
// stop (the thread that allocated in it stops it), so the memory held does not grow per step.
TEST_F(HistoryTest, EachStoppedRecordingOfAResourceIsFreed)
{
  async_device_memory_resource mr{{.source = pool_source::new_pool, .cache = 64 * mib}};
  detail::history_cursor::let_go_all();  // this thread's places in rings of earlier tests
  auto const before = detail::history_ring::live();
  for (int step = 0; step < 50; ++step) {
    mr.start_history(4096);
    void* p = mr.allocate(stream_ref(), 4096);
    mr.deallocate(stream_ref(), p, 4096);
    std::uint64_t dropped = 0;
    EXPECT_EQ(detail::history_ring::live(), before + 1) << "the ring being recorded";
    EXPECT_EQ(calls(mr.stop_history(dropped)).size(), 2U);
    ASSERT_EQ(detail::history_ring::live(), before) << "step " << step << "'s ring was kept";
  }
  EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
}

}  // namespace
}  // namespace asyncmr::test

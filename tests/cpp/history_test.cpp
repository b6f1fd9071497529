/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The allocation-history ring (detail/history.hpp) on the CPU, and a resource's recording on
// the GPU: what each kind of call records, in order, with the pool's state.

#include "test_support.hpp"

#include <asyncmr/detail/history.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

namespace asyncmr::detail {
namespace {

history_event event(std::uint64_t n)
{
  return {n, n * 256, n, 7, 0, 0, 0, history_action::alloc};
}

TEST(HistoryRing, RefusesNoEventsAndTooMany)
{
  EXPECT_THROW(history_ring{0}, std::invalid_argument);
  EXPECT_THROW(history_ring{history_ring::max_capacity + 1}, std::invalid_argument);
}

TEST(HistoryRing, KeepsEventsInOrder)
{
  history_ring ring{16};
  for (std::uint64_t n = 0; n < 10; ++n) { ring.record(event(n)); }
  auto const events = ring.events();
  ASSERT_EQ(events.size(), 10U);
  for (std::uint64_t n = 0; n < 10; ++n) {
    EXPECT_EQ(events[n].time_ns, n);
    EXPECT_EQ(events[n].address, n * 256);
  }
  EXPECT_EQ(ring.dropped(), 0U);
}

TEST(HistoryRing, AFullRingDropsTheOldestAndCountsThem)
{
  history_ring ring{8};
  for (std::uint64_t n = 0; n < 20; ++n) { ring.record(event(n)); }
  auto const events = ring.events();
  ASSERT_EQ(events.size(), 8U);
  EXPECT_EQ(events.front().time_ns, 12U);
  EXPECT_EQ(events.back().time_ns, 19U);
  EXPECT_EQ(ring.dropped(), 12U);
  EXPECT_EQ(ring.recorded(), 20U);
}

TEST(HistoryRing, EveryFieldAndActionComesBackWhole)
{
  history_ring ring{8};
  std::uint64_t const big = (std::uint64_t{1} << 56) - 1;  // the largest cache charge kept
  ring.record({1, 2, 3, 4, 5, 6, big, history_action::oom});
  ring.record({~std::uint64_t{0}, ~std::uint64_t{0}, ~std::uint64_t{0}, ~std::uint64_t{0},
               ~std::uint64_t{0}, ~std::uint64_t{0}, 0, history_action::trim});
  auto const events = ring.events();
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
  EXPECT_GE(history_stamps_in(100'000), 100'000U)
    << "100 us span at least 100k stamps (nanoseconds, or ticks of a counter of >= 1 GHz)";
}

// Writers on several threads and a reader at the same time (ThreadSanitizer runs this too): the
// reader only ever copies whole events, each one a writer wrote.
TEST(HistoryRing, ManyWritersAndAReaderSeeOnlyWholeEvents)
{
  history_ring ring{1024};
  constexpr int threads = 8;
  constexpr std::uint64_t per_thread = 20000;
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> torn{0};
  std::thread reader{[&] {
    while (!done.load()) {
      for (auto const& e : ring.events()) {
        // Every field of an event derives from its time stamp.
        if (e.address != e.time_ns * 256 || e.bytes != e.time_ns || e.stream != 7) { ++torn; }
      }
    }
  }};
  std::vector<std::thread> writers;
  for (int t = 0; t < threads; ++t) {
    writers.emplace_back([&ring, t] {
      for (std::uint64_t i = 0; i < per_thread; ++i) { ring.record(event(t * per_thread + i)); }
    });
  }
  for (auto& w : writers) { w.join(); }
  done = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0U);
  EXPECT_EQ(ring.recorded(), threads * per_thread);
  EXPECT_LE(ring.events().size(), 1024U);
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

}  // namespace
}  // namespace asyncmr::test

/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The per-stream front cache (detail/block_cache.hpp) on the CPU: no CUDA, blocks are fake
// 256-byte-aligned addresses (the cache never touches the memory behind a pointer). Ends with a
// randomized model-based stress test: threads on streams that come and go allocate, free, free
// twice, free foreign and graph-owned pointers and wrong sizes, while another thread releases
// and reclaims; a shadow model of every block catches an address handed out twice, to the wrong
// stream or class, or freed to the pool while a user holds it or after the release's proof.

#include "alloc_failure.hpp"

#include <asyncmr/detail/block_cache.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <shared_mutex>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

namespace asyncmr::detail {
namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

/// The i-th fake block address: distinct, 4 KiB apart, never dereferenced.
void* fake(std::size_t i)
{
  return reinterpret_cast<void*>(std::uintptr_t{0x100000000} + std::uintptr_t{i} * 4096);
}

/// A block as the owner makes it on a miss: allocated at the class size, then recorded.
void* handed(block_cache& cache, std::size_t i, std::size_t bytes)
{
  void* const p = fake(i);
  EXPECT_TRUE(cache.record(p, bytes)) << "block " << i;
  return p;
}

bool cached(block_cache& cache, stream_key k, void* p, std::size_t bytes)
{
  return cache.put(k, p, bytes).status == put_status::cached;
}

using block = std::tuple<stream_key, void*, std::size_t>;

/// A release as the owner makes it (no markers here: see BlockCacheMarkers).
std::multiset<block> release_all(block_cache& cache)
{
  cache.detach_all();
  std::uint64_t const proven = cache.begin_proof();
  std::multiset<block> out;
  cache.free_parked(proven,
                    [&](stream_key k, void* p, std::size_t n) noexcept { out.emplace(k, p, n); });
  return out;
}

// ---- size classes ----------------------------------------------------------------------------

TEST(BlockCacheClasses, FourClassesPerDoublingFrom256)
{
  std::vector<std::size_t> const first{256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280};
  for (std::size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(block_cache::class_bytes(i), first[i]) << "class " << i;
  }
  EXPECT_EQ(block_cache::class_bytes(block_cache::class_count - 1), block_cache::max_block_limit)
    << "the last class is the largest cacheable block";
}

TEST(BlockCacheClasses, EachRequestGetsTheSmallestClassAtOrAboveIt)
{
  auto check = [](std::size_t b) {
    std::size_t const i = block_cache::class_index(b);
    std::size_t const c = block_cache::class_bytes(i);
    ASSERT_LT(i, block_cache::class_count) << b;
    ASSERT_GE(c, b) << b;
    if (i > 0) { ASSERT_LT(block_cache::class_bytes(i - 1), b) << b; }
  };
  for (std::size_t b = 1; b <= 70000; ++b) { check(b); }
  for (std::size_t e = 17; e <= 26; ++e) {
    for (std::size_t b : {(std::size_t{1} << e) - 1, std::size_t{1} << e, (std::size_t{1} << e) + 1}) {
      if (b <= block_cache::max_block_limit) { check(b); }
    }
  }
}

TEST(BlockCacheClasses, WasteIsBelowAQuarterOfTheRequest)
{
  for (std::size_t b = 257; b <= 1 * MiB; b += 97) {
    std::size_t const c = block_cache::round_to_class(b);
    EXPECT_LT(c - b, b / 4 + 1) << b;
  }
}

TEST(BlockCacheClasses, ClassSizeIsZeroForZeroBytesAndAboveMaxBlock)
{
  block_cache const cache{64 * MiB};
  EXPECT_EQ(cache.max_block(), 1 * MiB) << "default: min(1 MiB, cap / 8)";
  EXPECT_EQ(cache.class_size(0), 0U);
  EXPECT_EQ(cache.class_size(1), 256U);
  EXPECT_EQ(cache.class_size(4 * KiB), 4 * KiB);
  EXPECT_EQ(cache.class_size(1 * MiB), 1 * MiB);
  EXPECT_EQ(cache.class_size(1 * MiB + 1), 0U);
}

TEST(BlockCacheClasses, MaxBlockFollowsTheCap)
{
  EXPECT_EQ(block_cache{1 * MiB}.max_block(), 128 * KiB);
  EXPECT_EQ(block_cache{1000}.max_block(), 256U) << "never below the smallest class";
  EXPECT_EQ((block_cache{1 * MiB, 5000}.max_block()), 4 * KiB) << "rounded down to a class";
  EXPECT_EQ((block_cache{1 * MiB, 1 * MiB}.max_block()), 1 * MiB);
}

TEST(BlockCache, ConstructorRefusesBadCapsMaxBlocksAndRecords)
{
  EXPECT_THROW(block_cache{0}, std::invalid_argument) << "0 = no cache: construct none";
  EXPECT_THROW(block_cache{255}, std::invalid_argument);
  EXPECT_THROW(block_cache{block_cache::max_cap + 1}, std::invalid_argument);
  EXPECT_THROW((block_cache{1 * MiB, 2 * MiB}), std::invalid_argument) << "above the cap";
  EXPECT_THROW((block_cache{1024 * MiB, 128 * MiB}), std::invalid_argument) << "above 64 MiB";
  EXPECT_THROW((block_cache{1 * MiB, 100}), std::invalid_argument) << "below 256 B";
  EXPECT_THROW((block_cache{1 * MiB, 0, (std::size_t{1} << 30) + 1}), std::invalid_argument);
  EXPECT_NO_THROW(block_cache{256});
  EXPECT_EQ((block_cache{1 * MiB, 0, 3000}.record_slots()), 4096U) << "a power of two";
  EXPECT_EQ(block_cache{64 * MiB}.record_slots(), 65536U) << "one slot per KiB of cap";
}

// ---- the ownership record --------------------------------------------------------------------

TEST(BlockCacheRecord, OnlyABlockTheCacheHandedOutIsTakenBack)
{
  block_cache cache{1 * MiB};
  void* const ours    = handed(cache, 0, 4 * KiB);
  void* const foreign = fake(1);  // another pool's block, a graph's allocation: never recorded
  auto const r        = cache.put(1, foreign, 4 * KiB);
  EXPECT_EQ(r.status, put_status::not_recorded);
  EXPECT_EQ(r.recorded_bytes, 0U);
  EXPECT_EQ(cache.take(1, 4 * KiB), nullptr) << "the foreign block must never be handed out";
  EXPECT_TRUE(cached(cache, 1, ours, 4 * KiB));
  EXPECT_EQ(cache.take(1, 4 * KiB), ours);
  auto const s = cache.stats();
  EXPECT_EQ(s.refused_not_recorded, 1U);
  EXPECT_EQ(s.recorded_blocks, 1U);
}

TEST(BlockCacheRecord, AGraphAddressFreedAgainAndAgainNeverEntersTheCache)
{
  block_cache cache{1 * MiB};
  void* const graph = fake(7);  // allocated inside a capture; comes back at each launch
  cache.record_graph(graph);
  for (int launch = 0; launch < 5; ++launch) {
    EXPECT_EQ(cache.put(3, graph, 1 * KiB).status, put_status::graph) << launch;
    EXPECT_EQ(cache.put(3, graph, 2 * MiB).status, put_status::graph) << "any size";
  }
  EXPECT_EQ(cache.take(3, 1 * KiB), nullptr);
  EXPECT_EQ(cache.recorded_bytes(graph), 0U);
  auto const s = cache.stats();
  EXPECT_EQ(s.cached_blocks, 0U);
  EXPECT_EQ(s.recorded_blocks, 0U) << "a graph note is not a block of the cache";
  // The pool hands the address out later (the graph is gone): the note gives way.
  ASSERT_TRUE(cache.record(graph, 1 * KiB));
  EXPECT_TRUE(cached(cache, 3, graph, 1 * KiB));
  EXPECT_EQ(cache.take(3, 1 * KiB), graph);
}

TEST(BlockCacheRecord, NotesOfGraphsLongGoneNeverStopTheCacheFromRecording)
{
  // A graph's note is dropped only when its address is recorded, forgotten or unrecorded; a
  // destroyed graph's notes stay. A program that captures and destroys graphs over time must
  // still have its blocks recorded, and so cached, by a cache of the smallest record.
  block_cache cache{1 * MiB};
  constexpr std::size_t notes = 20000;
  constexpr std::size_t fresh = 1000;
  for (std::size_t i = 0; i < notes; ++i) { cache.record_graph(fake(100000 + i)); }
  std::size_t recorded = 0;
  for (std::size_t i = 0; i < fresh; ++i) { recorded += cache.record(fake(i), 256) ? 1 : 0; }
  EXPECT_EQ(recorded, fresh) << "blocks handed out after the graphs went are untracked";
  auto const s = cache.stats();
  EXPECT_EQ(s.untracked, 0U);
  EXPECT_EQ(s.recorded_blocks, fresh);
  std::size_t cached_now = 0;
  for (std::size_t i = 0; i < fresh; ++i) { cached_now += cached(cache, 1, fake(i), 256) ? 1 : 0; }
  EXPECT_EQ(cached_now, fresh) << "the cache stopped caching";
  // A note that gave way costs the graph's frees nothing but the driver's word: never cached.
  for (std::size_t i = 0; i < notes; ++i) {
    auto const r = cache.put(1, fake(100000 + i), 1 * KiB);
    ASSERT_TRUE(r.status == put_status::graph || r.status == put_status::not_recorded) << i;
  }
  EXPECT_EQ(cache.check_invariants(), cached_now * 256);
}

TEST(BlockCacheRecord, AGraphNoteNeverReplacesACachedBlock)
{
  block_cache cache{1 * MiB};
  void* const p = handed(cache, 0, 4 * KiB);
  ASSERT_TRUE(cached(cache, 1, p, 4 * KiB));
  cache.record_graph(p);
  EXPECT_EQ(cache.take(1, 4 * KiB), p);
  EXPECT_EQ(cache.recorded_bytes(p), 4 * KiB);
}

TEST(BlockCacheRecord, AWrongSizeIsRefusedAndChangesNothing)
{
  block_cache cache{1 * MiB};
  void* const p = handed(cache, 0, 256);
  auto const r  = cache.put(1, p, 64 * KiB);  // a 256-byte block freed as 64 KiB
  EXPECT_EQ(r.status, put_status::wrong_size);
  EXPECT_EQ(r.recorded_bytes, 256U);
  EXPECT_EQ(cache.take(1, 64 * KiB), nullptr) << "a 256-byte block must not serve 64 KiB";
  EXPECT_EQ(cache.put(1, p, 0).status, put_status::wrong_size);
  EXPECT_EQ(cache.put(1, p, 1 * MiB).status, put_status::wrong_size) << "uncacheable size";
  EXPECT_EQ(cache.put(1, p, 200).status, put_status::cached) << "200 bytes is the 256 class";
  EXPECT_EQ(cache.stats().refused_wrong_size, 3U);
}

TEST(BlockCacheRecord, ASecondFreeOfACachedBlockIsRefused)
{
  block_cache cache{1 * MiB};
  void* const p = handed(cache, 0, 4 * KiB);
  ASSERT_TRUE(cached(cache, 1, p, 4 * KiB));
  EXPECT_EQ(cache.put(1, p, 4 * KiB).status, put_status::already_cached);
  EXPECT_EQ(cache.put(2, p, 4 * KiB).status, put_status::already_cached) << "on another stream";
  EXPECT_EQ(cache.take(1, 4 * KiB), p);
  EXPECT_EQ(cache.take(1, 4 * KiB), nullptr) << "it was cached once";
  EXPECT_EQ(cache.stats().refused_double_free, 2U);
}

TEST(BlockCacheRecord, ARefusedPutForgetsTheBlock)
{
  block_cache cache{4 * KiB, 4 * KiB};
  void* const a = handed(cache, 0, 4 * KiB);
  void* const b = handed(cache, 1, 4 * KiB);
  ASSERT_TRUE(cached(cache, 1, a, 4 * KiB));
  auto const r = cache.put(1, b, 4 * KiB);
  EXPECT_EQ(r.status, put_status::refused) << "the cap is full";
  EXPECT_EQ(cache.recorded_bytes(b), 0U) << "b goes back to the pool, its record with it";
  EXPECT_EQ(cache.put(1, b, 4 * KiB).status, put_status::not_recorded);
}

TEST(BlockCacheRecord, ForgetDropsAHandedOutBlockOnly)
{
  block_cache cache{1 * MiB};
  void* const p = handed(cache, 0, 4 * KiB);
  void* const q = handed(cache, 1, 4 * KiB);
  ASSERT_TRUE(cached(cache, 1, q, 4 * KiB));
  EXPECT_TRUE(cache.forget(p));
  EXPECT_FALSE(cache.forget(p));
  EXPECT_FALSE(cache.forget(q)) << "a cached block is the cache's: not forgotten";
  EXPECT_EQ(cache.put(1, p, 4 * KiB).status, put_status::not_recorded);
}

TEST(BlockCacheThreads, AStreamsBucketIsBoundOnlyOnceNothingCanFailAnyMore)
{
  // A thread that met stream 1 before keeps its bucket in its own table. The bucket goes idle
  // and back to the spares; another thread meets stream 1, takes that spare, and the map entry
  // it then needs cannot be allocated. A put from the first thread in that moment must not end
  // up in a bucket the failed lookup gives back to the spares: the next new stream would get
  // the block, freed on stream 1, with no ordering.
  block_cache cache{1 * MiB};
  void* const y = handed(cache, 1, 4 * KiB);
  std::atomic<int> step{0};
  put_status late{};
  std::thread other{[&] {
    EXPECT_EQ(cache.take(1, 4 * KiB), nullptr);  // meets stream 1: a bucket, in its table
    step.store(1);
    while (step.load() != 2) { std::this_thread::yield(); }
    late = cache.put(1, y, 4 * KiB).status;
    step.store(3);
  }};
  while (step.load() != 1) { std::this_thread::yield(); }
  cache.detach_stale();  // a new epoch
  cache.detach_stale();  // stream 1 idle for all of it: its bucket goes to the spares
  ASSERT_EQ(cache.stats().streams, 0U);
  struct moment {
    std::atomic<int>* step;
    static void run(void* self) noexcept
    {
      auto& s = *static_cast<moment*>(self)->step;
      s.store(2);  // the other thread's put, now; given a moment (it may need the registry)
      auto const until = std::chrono::steady_clock::now() + std::chrono::milliseconds{200};
      while (s.load() != 3 && std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      }
    }
  } at{&step};
  {
    asyncmr::test::failing_allocations const no_memory{&moment::run, &at};
    EXPECT_EQ(cache.take(1, 4 * KiB), nullptr);
  }
  other.join();
  EXPECT_NO_THROW(static_cast<void>(cache.check_invariants()));
  EXPECT_NE(cache.take(2, 4 * KiB), y) << "a block freed on stream 1 went to stream 2";
  if (late == put_status::cached) {
    EXPECT_EQ(cache.take(1, 4 * KiB), y) << "cached, it is stream 1's";
  }
}

TEST(BlockCacheRecord, ASecondFreeOfACachedBlockIsADoubleFreeWhateverSizeItNames)
{
  block_cache cache{1 * MiB};
  void* const p = handed(cache, 0, 4 * KiB);
  ASSERT_TRUE(cached(cache, 1, p, 4 * KiB));
  for (std::size_t const bytes : {std::size_t{0}, 2 * MiB, std::size_t{256}}) {
    auto const r = cache.put(1, p, bytes);
    EXPECT_EQ(r.status, put_status::already_cached) << bytes << " bytes";
    EXPECT_EQ(r.recorded_bytes, 4 * KiB);
  }
  auto const s = cache.stats();
  EXPECT_EQ(s.refused_double_free, 3U);
  EXPECT_EQ(s.refused_wrong_size, 0U);
  EXPECT_EQ(cache.take(1, 4 * KiB), p);
}

TEST(BlockCacheRecord, AWrongSizeWithNoHostMemoryForABucketIsStillAWrongSize)
{
  // A live block freed at another class on a stream whose bucket cannot be made (no host
  // memory) is a wrong size, as it is with a bucket: not a double free of a block the user
  // still holds, and the record's class is said.
  block_cache cache{1 * MiB};
  void* const p = handed(cache, 0, 4 * KiB);
  put_result r{};
  {
    test::failing_allocations const no_host_memory;
    r = cache.put(0xF00D, p, 256);
  }
  EXPECT_EQ(r.status, put_status::wrong_size) << "a handed-out block answered as a double free";
  EXPECT_EQ(r.recorded_bytes, 4 * KiB);
  EXPECT_EQ(cache.recorded_bytes(p), 4 * KiB) << "a refusal changes nothing";
  EXPECT_TRUE(cached(cache, 1, p, 4 * KiB)) << "the user's own free at its class is cached";
}

TEST(BlockCacheRecord, UnrecordLetsGoOfAHandedOutBlockOnlyAtItsClass)
{
  // The owner's free inside a capture: the record is asked before the driver.
  block_cache cache{1 * MiB};
  void* const out    = handed(cache, 0, 4 * KiB);
  void* const in     = handed(cache, 1, 4 * KiB);
  void* const graphs = fake(2);
  ASSERT_TRUE(cached(cache, 1, in, 4 * KiB));
  cache.record_graph(graphs);
  auto const twice = cache.unrecord(in, 4 * KiB);
  EXPECT_EQ(twice.status, put_status::already_cached) << "a cached block is the cache's";
  EXPECT_EQ(twice.recorded_bytes, 4 * KiB);
  auto const wrong = cache.unrecord(out, 256);
  EXPECT_EQ(wrong.status, put_status::wrong_size);
  EXPECT_EQ(wrong.recorded_bytes, 4 * KiB);
  EXPECT_EQ(cache.unrecord(out, 8 * MiB).status, put_status::wrong_size) << "uncacheable size";
  EXPECT_EQ(cache.recorded_bytes(out), 4 * KiB) << "a refusal changes nothing";
  auto const mine = cache.unrecord(out, 4000);  // the same class
  EXPECT_EQ(mine.status, put_status::refused);
  EXPECT_EQ(mine.recorded_bytes, 4 * KiB);
  EXPECT_EQ(cache.recorded_bytes(out), 0U);
  EXPECT_EQ(cache.unrecord(out, 4 * KiB).status, put_status::not_recorded) << "let go once";
  EXPECT_EQ(cache.unrecord(graphs, 1 * KiB).status, put_status::graph);
  EXPECT_EQ(cache.unrecord(graphs, 1 * KiB).status, put_status::not_recorded) << "note gone";
  EXPECT_EQ(cache.unrecord(fake(3), 4 * KiB).status, put_status::not_recorded);
  EXPECT_EQ(cache.stats().recorded_blocks, 1U) << "only the cached block is recorded";
  EXPECT_EQ(cache.take(1, 4 * KiB), in) << "and the cache still hands it out";
}

TEST(BlockCacheRecord, MisalignedAndUncacheableBlocksAreNotRecorded)
{
  block_cache cache{1 * MiB};
  void* const odd = static_cast<char*>(fake(0)) + 16;
  EXPECT_FALSE(cache.record(odd, 4 * KiB));
  EXPECT_FALSE(cache.record(nullptr, 4 * KiB));
  EXPECT_FALSE(cache.record(fake(1), 1 * MiB)) << "above max_block";
  EXPECT_EQ(cache.stats().untracked, 3U);
  EXPECT_EQ(cache.put(1, odd, 4 * KiB).status, put_status::not_recorded);
}

TEST(BlockCacheRecord, AFullRecordLeavesNewBlocksUntrackedNeverWrong)
{
  block_cache cache{64 * MiB, 0, 1024};  // the smallest record
  std::size_t tracked = 0;
  for (std::size_t i = 0; i < 4096; ++i) { tracked += cache.record(fake(i), 256) ? 1 : 0; }
  EXPECT_LE(tracked, 1024U);
  EXPECT_GT(tracked, 512U) << "probing should fill most of the table";
  EXPECT_EQ(cache.stats().untracked, 4096U - tracked);
  std::size_t accepted = 0;
  for (std::size_t i = 0; i < 4096; ++i) {
    auto const r = cache.put(1, fake(i), 256);
    ASSERT_TRUE(r.status == put_status::cached || r.status == put_status::not_recorded);
    accepted += r.status == put_status::cached ? 1 : 0;
  }
  EXPECT_EQ(accepted, tracked) << "exactly the recorded blocks are cached";
  EXPECT_EQ(cache.check_invariants(), tracked * 256);
}

TEST(BlockCacheRecord, AnAddressThePoolReusesIsRecordedAfresh)
{
  block_cache cache{1 * MiB};
  void* const p = handed(cache, 0, 256);
  ASSERT_TRUE(cached(cache, 1, p, 256));
  EXPECT_EQ(release_all(cache).size(), 1U);  // back to the pool: the record forgets it
  EXPECT_EQ(cache.recorded_bytes(p), 0U);
  ASSERT_TRUE(cache.record(p, 64 * KiB));  // the pool hands the address out again, larger
  EXPECT_EQ(cache.recorded_bytes(p), 64 * KiB);
  EXPECT_EQ(cache.put(1, p, 256).status, put_status::wrong_size);
  EXPECT_TRUE(cached(cache, 1, p, 64 * KiB));
}

// ---- reuse and isolation ---------------------------------------------------------------------

TEST(BlockCache, ABlockPutForAStreamIsTakenByThatStreamOnly)
{
  block_cache cache{1 * MiB};
  void* const p = handed(cache, 0, 1000);
  ASSERT_TRUE(cached(cache, 1, p, 1000));
  EXPECT_EQ(cache.take(2, 1000), nullptr);
  EXPECT_EQ(cache.take(0, 1000), nullptr);
  EXPECT_EQ(cache.take(1, 768), nullptr) << "768 is its own class";
  EXPECT_EQ(cache.take(1, 1024), p) << "1024 is the class of 1000";
  EXPECT_EQ(cache.take(1, 1000), nullptr) << "handed out once";
}

TEST(BlockCache, UncacheablePutsAreRefusedAndTakesMiss)
{
  block_cache cache{1 * MiB};  // max_block 128 KiB
  EXPECT_EQ(cache.put(1, nullptr, 4 * KiB).status, put_status::uncacheable);
  EXPECT_EQ(cache.put(1, fake(0), 0).status, put_status::uncacheable);
  EXPECT_EQ(cache.put(1, fake(1), 128 * KiB + 1).status, put_status::uncacheable);
  EXPECT_EQ(cache.take(1, 0), nullptr);
  EXPECT_EQ(cache.take(1, 128 * KiB + 1), nullptr);
  auto const s = cache.stats();
  EXPECT_EQ(s.refused_uncacheable, 3U);
  EXPECT_EQ(s.refused_cap, 0U);
  EXPECT_EQ(s.misses, 2U);
  EXPECT_EQ(s.cached_bytes, 0U);
}

// ---- the cap ---------------------------------------------------------------------------------

TEST(BlockCache, PutsBeyondTheCapAreRefused)
{
  block_cache cache{4 * KiB};
  for (std::size_t i = 0; i < 18; ++i) { handed(cache, i, 256); }
  for (std::size_t i = 0; i < 16; ++i) { ASSERT_TRUE(cached(cache, 1, fake(i), 256)) << i; }
  EXPECT_EQ(cache.put(1, fake(16), 256).status, put_status::refused);
  EXPECT_EQ(cache.put(2, fake(17), 256).status, put_status::refused)
    << "the cap is shared by all streams";
  EXPECT_EQ(cache.bytes(), 4 * KiB);
  EXPECT_EQ(cache.check_invariants(), 4 * KiB);
  EXPECT_EQ(cache.stats().refused_cap, 2U);
  ASSERT_NE(cache.take(1, 256), nullptr);
  handed(cache, 16, 256);  // the refused block came back from the pool
  EXPECT_TRUE(cached(cache, 1, fake(16), 256)) << "room again after a take";
}

TEST(BlockCache, ABlockLargerThanTheRoomLeftIsRefused)
{
  block_cache cache{4 * KiB, 4 * KiB};
  ASSERT_TRUE(cached(cache, 1, handed(cache, 0, 1 * KiB), 1 * KiB));
  EXPECT_EQ(cache.put(1, handed(cache, 1, 4 * KiB), 4 * KiB).status, put_status::refused);
  EXPECT_TRUE(cached(cache, 1, handed(cache, 2, 3 * KiB), 3 * KiB));
  EXPECT_EQ(cache.check_invariants(), 4 * KiB);
}

TEST(BlockCache, IdleCreditOfOneStreamDoesNotStarveAnother)
{
  block_cache cache{64 * KiB};
  for (std::size_t i = 0; i < 128; ++i) { handed(cache, i, 1 * KiB); }
  for (std::size_t i = 0; i < 64; ++i) { ASSERT_TRUE(cached(cache, 1, fake(i), 1 * KiB)); }
  for (std::size_t i = 0; i < 64; ++i) { ASSERT_NE(cache.take(1, 1 * KiB), nullptr); }
  EXPECT_EQ(cache.bytes(), 0U);
  // Stream 1 may still sit on some credit; stream 2 gets the whole cap after a few refusals
  // at most (idle credit is looked for once every few refusals).
  std::size_t ok = 0;
  for (std::size_t i = 0; i < 64 + block_cache::pressure_window; ++i) {
    void* const p = fake(64 + i % 64);
    if (cache.recorded_bytes(p) == 0) { handed(cache, 64 + i % 64, 1 * KiB); }
    ok += cached(cache, 2, p, 1 * KiB) ? 1 : 0;
  }
  EXPECT_EQ(ok, 64U);
  EXPECT_EQ(cache.check_invariants(), 64 * KiB);
}

TEST(BlockCache, AShortLivedStreamHoldsLittleIdleCredit)
{
  block_cache cache{64 * MiB};  // chunk() is 1 MiB
  ASSERT_EQ(cache.chunk(), 1 * MiB);
  ASSERT_TRUE(cached(cache, 1, handed(cache, 0, 4 * KiB), 4 * KiB));
  EXPECT_LE(cache.stats().charged_bytes, 8 * KiB)
    << "one block's first reservation is that block, not a whole chunk";
}

// ---- leaving for the pool --------------------------------------------------------------------

TEST(BlockCacheRelease, ReleaseReturnsExactlyTheBlocksCachedAndEmptiesTheCache)
{
  block_cache cache{1024 * MiB};  // room for all 500 blocks
  std::multiset<block> expected;
  std::mt19937_64 rng{42};
  for (std::size_t i = 0; i < 500; ++i) {
    stream_key const k  = rng() % 5;
    std::size_t const n = 1 + rng() % cache.max_block();
    ASSERT_TRUE(cached(cache, k, handed(cache, i, n), n));
    expected.emplace(k, fake(i), cache.class_size(n));
  }
  EXPECT_EQ(release_all(cache), expected);
  auto const s = cache.stats();
  EXPECT_EQ(s.cached_blocks, 0U);
  EXPECT_EQ(s.parked_blocks, 0U);
  EXPECT_EQ(s.recorded_blocks, 0U) << "every released block left the record";
  EXPECT_EQ(s.charged_bytes, 0U) << "the whole cap is back in the global budget";
  EXPECT_EQ(cache.check_invariants(), 0U);
  for (stream_key k = 0; k < 5; ++k) { EXPECT_EQ(cache.take(k, 256), nullptr); }
  EXPECT_TRUE(release_all(cache).empty()) << "a second release finds nothing";
}

TEST(BlockCacheRelease, ParkedBlocksAreOutOfReachAndStillCharged)
{
  block_cache cache{8 * KiB, 4 * KiB};
  void* const p = handed(cache, 0, 4 * KiB);
  ASSERT_TRUE(cached(cache, 1, p, 4 * KiB));
  EXPECT_EQ(cache.detach_all(), 1U);
  EXPECT_EQ(cache.take(1, 4 * KiB), nullptr) << "a parked block is never handed out";
  auto const s = cache.stats();
  EXPECT_EQ(s.parked_blocks, 1U);
  EXPECT_EQ(s.parked_bytes, 4 * KiB);
  EXPECT_GE(s.charged_bytes, 4 * KiB) << "parked bytes count against the cap";
  EXPECT_EQ(cache.put(1, p, 4 * KiB).status, put_status::already_cached) << "a double free";
}

TEST(BlockCacheRelease, ABlockFreedAfterTheProofBeganIsNotFreedByIt)
{
  // The release race: a block freed into the cache once the release's synchronization has
  // begun may still be in use by its stream's work; only a later proof covers it.
  block_cache cache{1 * MiB};
  ASSERT_TRUE(cached(cache, 1, handed(cache, 0, 4 * KiB), 4 * KiB));
  ASSERT_TRUE(cached(cache, 2, handed(cache, 2, 4 * KiB), 4 * KiB));
  cache.detach_all();
  std::uint64_t const proven = cache.begin_proof();  // the release's synchronization starts
  void* const late           = handed(cache, 1, 4 * KiB);
  ASSERT_TRUE(cached(cache, 1, late, 4 * KiB));  // freed on the stream while it waits
  cache.detach_all();                            // another release tries to park it meanwhile
  std::set<void*> freed;
  cache.free_parked(proven, [&](stream_key, void* p, std::size_t) noexcept { freed.insert(p); });
  EXPECT_EQ(freed.count(late), 0U) << "freed under the proof of a synchronization begun before";
  EXPECT_EQ(freed, (std::set<void*>{fake(0), fake(2)})) << "what was parked before was proven";
  // The late block stayed cached while stream 1's early one waited; the next release frees it.
  cache.detach_all();
  std::uint64_t const later = cache.begin_proof();
  cache.free_parked(later, [&](stream_key, void* p, std::size_t) noexcept { freed.insert(p); });
  EXPECT_EQ(freed, (std::set<void*>{fake(0), fake(2), late}));
  EXPECT_EQ(cache.check_invariants(), 0U);
}

TEST(BlockCacheRelease, ABlockParkedBeforeTheProofIsFreedByItWhateverIsParkedAfter)
{
  // A release parks and begins its proof; before it frees, another thread (the reclaimer, or a
  // second release) parks the same stream's newer block. The release must still free what it
  // parked: it promised the pool that memory back (release_cache, trim_to, out of memory).
  block_cache cache{1 * MiB};
  void* const early = handed(cache, 0, 4 * KiB);
  ASSERT_TRUE(cached(cache, 7, early, 4 * KiB));
  cache.detach_all();
  std::uint64_t const proven = cache.begin_proof();
  void* const late           = handed(cache, 1, 4 * KiB);
  ASSERT_TRUE(cached(cache, 7, late, 4 * KiB));
  cache.detach_all();  // the other thread's park
  std::set<void*> freed;
  std::size_t const n =
    cache.free_parked(proven, [&](stream_key, void* p, std::size_t) noexcept { freed.insert(p); });
  EXPECT_EQ(n, 1U) << "a block parked before the proof was left parked";
  EXPECT_EQ(freed, (std::set<void*>{early}));
  // The late block was never covered by that proof; a later release frees it.
  EXPECT_EQ(release_all(cache), (std::multiset<block>{{7, late, 4 * KiB}}));
  EXPECT_EQ(cache.check_invariants(), 0U);
  EXPECT_EQ(cache.held_blocks(), 0U);
}

TEST(BlockCacheRelease, AReleaseReturnsOnlyOnceEveryBlockParkedBeforeItWasHandedToAFree)
{
  // The owner waits for its release stream after a release, to have the memory back in the
  // pool. That wait covers only frees already queued: so while another thread (the reclaimer)
  // holds parked blocks and has not queued their frees yet, a release must not return, nor
  // leave a stream's blocks cached because that bucket's older ones are still parked.
  block_cache cache{1 * MiB};
  void* const first = handed(cache, 0, 4 * KiB);
  ASSERT_TRUE(cached(cache, 1, first, 4 * KiB));
  std::atomic<bool> in_free{false};
  std::atomic<bool> let_go{false};
  std::thread reclaimer{[&] {
    cache.release([&](stream_key, void*, std::size_t) noexcept {
      in_free.store(true);
      while (!let_go.load()) { std::this_thread::yield(); }
    });
  }};
  while (!in_free.load()) { std::this_thread::yield(); }
  void* const second = handed(cache, 1, 4 * KiB);
  ASSERT_TRUE(cached(cache, 1, second, 4 * KiB));  // the same stream, while `first` is out
  std::atomic<bool> returned{false};
  std::set<void*> freed;
  std::thread releaser{[&] {
    cache.release([&](stream_key, void* p, std::size_t) noexcept { freed.insert(p); });
    returned.store(true);
  }};
  std::this_thread::sleep_for(std::chrono::milliseconds{50});
  EXPECT_FALSE(returned.load()) << "returned while another thread held parked blocks unfreed";
  let_go.store(true);
  reclaimer.join();
  releaser.join();
  EXPECT_EQ(freed, (std::set<void*>{second})) << "the release parks and frees every cached block";
  EXPECT_EQ(cache.held_blocks(), 0U);
  EXPECT_EQ(cache.check_invariants(), 0U);
}

TEST(BlockCacheRelease, ABlockCachedAfterTheDetachStaysCached)
{
  block_cache cache{1 * MiB};
  ASSERT_TRUE(cached(cache, 1, handed(cache, 0, 4 * KiB), 4 * KiB));
  cache.detach_all();
  std::uint64_t const proven = cache.begin_proof();
  void* const late           = handed(cache, 1, 4 * KiB);
  ASSERT_TRUE(cached(cache, 1, late, 4 * KiB));
  std::size_t const n = cache.free_parked(proven, [](stream_key, void*, std::size_t) noexcept {});
  EXPECT_EQ(n, 1U);
  EXPECT_EQ(cache.take(1, 4 * KiB), late) << "the late block is still the stream's";
}

TEST(BlockCacheRelease, DrainStreamFreesOnlyThatStreamsCachedBlocks)
{
  block_cache cache{1 * MiB};
  ASSERT_TRUE(cached(cache, 1, handed(cache, 0, 4 * KiB), 4 * KiB));
  ASSERT_TRUE(cached(cache, 2, handed(cache, 1, 4 * KiB), 4 * KiB));
  ASSERT_TRUE(cached(cache, 1, handed(cache, 2, 256), 256));
  std::multiset<block> got;
  cache.drain_stream(1, [&](stream_key k, void* p, std::size_t n) noexcept {
    got.emplace(k, p, n);
  });
  EXPECT_EQ(got, (std::multiset<block>{{1, fake(0), 4 * KiB}, {1, fake(2), 256}}));
  EXPECT_EQ(cache.recorded_bytes(fake(0)), 0U);
  EXPECT_EQ(cache.bytes(), 4 * KiB);
  EXPECT_EQ(cache.take(2, 4 * KiB), fake(1));
  cache.drain_stream(7, [](stream_key, void*, std::size_t) noexcept { ADD_FAILURE(); });
  EXPECT_EQ(cache.check_invariants(), 0U);
}

TEST(BlockCacheRelease, TheCallbackRunsWithNoLockHeld)
{
  block_cache cache{1 * MiB};
  ASSERT_TRUE(cached(cache, 1, handed(cache, 0, 4 * KiB), 4 * KiB));
  ASSERT_TRUE(cached(cache, 2, handed(cache, 1, 4 * KiB), 4 * KiB));
  bool reput = false;
  cache.drain_stream(1, [&](stream_key k, void* p, std::size_t n) noexcept {
    // The pool hands the address out again at once, and it is freed back: all inside the
    // callback, which therefore holds no lock of the cache.
    reput = cache.record(p, n) && cached(cache, k, p, n) && cache.stats().cached_blocks == 2;
  });
  EXPECT_TRUE(reput);
  EXPECT_EQ(cache.take(1, 4 * KiB), fake(0));
}

// ---- dead and idle streams ---------------------------------------------------------------------

TEST(BlockCacheStale, OnlyBucketsIdleForAWholeEpochAreParked)
{
  block_cache cache{1 * MiB};
  ASSERT_TRUE(cached(cache, 1, handed(cache, 0, 4 * KiB), 4 * KiB));  // stream 1 then dies
  ASSERT_TRUE(cached(cache, 2, handed(cache, 1, 4 * KiB), 4 * KiB));
  EXPECT_EQ(cache.detach_stale(), 0U) << "both were used during the first epoch";
  ASSERT_EQ(cache.take(2, 4 * KiB), fake(1));  // stream 2 lives on
  ASSERT_TRUE(cached(cache, 2, fake(1), 4 * KiB));
  EXPECT_EQ(cache.detach_stale(), 1U) << "stream 1 was idle for a whole epoch";
  auto const s = cache.stats();
  EXPECT_EQ(s.parked_blocks, 1U);
  EXPECT_EQ(s.reclaims, 1U);
  EXPECT_EQ(s.reclaimed_blocks, 1U);
  std::vector<void*> freed;
  cache.free_parked(cache.begin_proof(),
                    [&](stream_key k, void* p, std::size_t) noexcept {
                      EXPECT_EQ(k, 1U);
                      freed.push_back(p);
                    });
  EXPECT_EQ(freed, std::vector<void*>{fake(0)});
  EXPECT_EQ(cache.take(2, 4 * KiB), fake(1)) << "the live stream keeps its block";
}

TEST(BlockCacheStale, BindingABucketWithNoHostMemoryLeftIsARefusalNotATermination)
{
  // A stale bucket becomes spare; binding it to a new stream adds a node to the key map, which
  // allocates. Out of host memory that must be a miss and a refusal (rule 5), the cache as it
  // was, never std::terminate from a noexcept call.
  block_cache cache{1 * MiB};
  ASSERT_EQ(cache.take(1, 4 * KiB), nullptr) << "a miss binds stream 1's bucket";
  cache.detach_stale();
  cache.detach_stale();  // idle for a whole epoch: the bucket is spare
  void* const p = handed(cache, 0, 4 * KiB);
  {
    test::failing_allocations const no_host_memory;
    EXPECT_EQ(cache.take(2, 4 * KiB), nullptr);
    EXPECT_EQ(cache.put(2, p, 4 * KiB).status, put_status::refused);
  }
  EXPECT_EQ(cache.stats().refused_no_memory, 1U) << "counted though no bucket holds it";
  EXPECT_EQ(cache.stats().refused_cap, 0U);
  // The refused block went to the pool (its record with it); the pool's next one is cached.
  void* const q = handed(cache, 1, 4 * KiB);
  EXPECT_TRUE(cached(cache, 2, q, 4 * KiB)) << "with memory again, stream 2 gets a bucket";
  EXPECT_EQ(cache.take(2, 4 * KiB), q);
}

TEST(BlockCacheStale, RefusalsForWantOfHostMemoryAreNoPressureOnTheCap)
{
  // A put into a class whose list is still empty grows the list, which allocates. Refused for
  // want of host memory, it says nothing of the cap (there is room): it must not be counted as
  // the cap's, nor ask for a stale reclaim that would take idle streams' blocks for nothing.
  block_cache cache{1 * MiB};
  ASSERT_TRUE(cached(cache, 1, handed(cache, 0, 4 * KiB), 4 * KiB));  // stream 1's bucket
  constexpr std::size_t puts = 2 * block_cache::pressure_window;
  std::array<void*, puts> blocks{};
  std::array<put_status, puts> status{};
  std::array<bool, puts> asked{};
  for (std::size_t i = 0; i < puts; ++i) {  // classes 256 .. 896 bytes: lists still empty
    blocks[i] = handed(cache, 1 + i, block_cache::class_bytes(i));
  }
  {
    test::failing_allocations const no_host_memory;  // no EXPECT in here: a failure allocates
    for (std::size_t i = 0; i < puts; ++i) {
      status[i] = cache.put(1, blocks[i], block_cache::class_bytes(i)).status;
      asked[i]  = cache.note_pressure();
    }
  }
  for (std::size_t i = 0; i < puts; ++i) {
    EXPECT_EQ(status[i], put_status::refused) << "put " << i << ": the caller frees it to the pool";
    EXPECT_EQ(cache.recorded_bytes(blocks[i]), 0U) << "put " << i << ": its record goes with it";
    EXPECT_FALSE(asked[i]) << "put " << i << " asked for a stale reclaim";
  }
  auto const s = cache.stats();
  EXPECT_EQ(s.refused_cap, 0U) << "refusals for want of host memory counted as the cap's";
  EXPECT_EQ(s.refused_no_memory, puts) << "and counted as what they are";
  EXPECT_FALSE(cache.note_pressure());
  // With memory again, the same classes cache.
  EXPECT_TRUE(cached(cache, 1, handed(cache, 100, 256), 256));
  EXPECT_EQ(cache.check_invariants(), 4 * KiB + 256);
}

TEST(BlockCacheStale, DeadStreamsDoNotStarveALiveOne)
{
  // 2000 streams each free two 4 KiB blocks and die; then a live stream must get hits again once
  // the owner's reclaim (asked for by refused puts) ran.
  block_cache cache{8 * MiB};
  std::size_t next = 0;
  std::size_t reclaims_asked = 0;
  auto reclaim = [&] {
    ++reclaims_asked;
    cache.detach_stale();
    cache.free_parked(cache.begin_proof(), [](stream_key, void*, std::size_t) noexcept {});
  };
  for (stream_key k = 1; k <= 2000; ++k) {
    for (int b = 0; b < 2; ++b) {
      void* const p = handed(cache, next++ % 100000, 4 * KiB);
      if (cache.put(k, p, 4 * KiB).status == put_status::refused && cache.note_pressure()) {
        reclaim();
      }
    }
  }
  stream_key const live = 5000;
  std::size_t hits      = 0;
  for (int i = 0; i < 100; ++i) {
    void* p = cache.take(live, 4 * KiB);
    if (p != nullptr) {
      ++hits;
    } else {
      p = handed(cache, next++ % 100000, 4 * KiB);
    }
    if (cache.put(live, p, 4 * KiB).status == put_status::refused && cache.note_pressure()) {
      reclaim();
    }
  }
  auto const s = cache.stats();
  EXPECT_GE(hits, 90U) << "the live stream starved";
  EXPECT_GE(s.reclaims, 1U);
  EXPECT_LE(s.streams, cache.cap() / (8 * KiB) + 64) << "buckets of dead streams were not reused";
  EXPECT_LE(reclaims_asked, 2000U / block_cache::pressure_window + 100);
  EXPECT_LE(cache.check_invariants(), cache.cap());
}

TEST(BlockCacheStale, PressureAsksForAReclaimOnlyOnceTheEpochIsOldEnough)
{
  // Stream 1 caches a block and waits; stream 2's refusals press on the cap. With a shortest
  // epoch, no number of refusals asks for a reclaim before the epoch is that old, so two
  // requests in a row cannot take stream 1's block the moment it stops freeing.
  auto press = [](block_cache& cache, std::size_t first) {
    std::size_t asked = 0;
    for (std::size_t i = 0; i < 64; ++i) {
      void* const p = handed(cache, first + i, 64 * KiB);
      if (cache.put(2, p, 64 * KiB).status == put_status::refused && cache.note_pressure()) {
        ++asked;
      }
    }
    return asked;
  };
  block_cache aged{1 * MiB, 0, 0, {}, std::uint64_t{3600} * 1'000'000'000};  // an hour
  ASSERT_TRUE(cached(aged, 1, handed(aged, 0, 64 * KiB), 64 * KiB));
  EXPECT_EQ(press(aged, 1), 0U) << "asked for a reclaim in an epoch younger than its bound";
  EXPECT_EQ(aged.stats().refused_cap, 64U - 15U) << "the cap took 15 more blocks, 16 in all";

  block_cache quick{1 * MiB, 0, 0, {}, 1'000'000};  // 1 ms
  ASSERT_TRUE(cached(quick, 1, handed(quick, 0, 64 * KiB), 64 * KiB));
  std::this_thread::sleep_for(std::chrono::milliseconds{5});
  std::size_t const asked = press(quick, 1);
  EXPECT_GE(asked, 1U) << "an epoch older than its bound asks at the first window of refusals";
  EXPECT_EQ(quick.detach_stale(), 0U) << "stream 1 was used in this epoch";
  EXPECT_EQ(quick.take(1, 64 * KiB), fake(0)) << "stream 1 keeps its block";
  ASSERT_TRUE(cached(quick, 1, fake(0), 64 * KiB));

  block_cache untimed{1 * MiB};  // no bound: every window of refusals asks
  ASSERT_TRUE(cached(untimed, 1, handed(untimed, 0, 64 * KiB), 64 * KiB));
  EXPECT_EQ(press(untimed, 1), (64U - 15U) / block_cache::pressure_window);
}

TEST(BlockCacheStale, TwoReclaimsInARowLeaveAStreamUsedInTheFirstsEpoch)
{
  // Two requests made while the epoch was old ran back to back: the second parked every stream
  // not used in the microseconds-old epoch the first began, one merely waiting for a kernel
  // among them. A reclaim in an epoch younger than the bound now parks nothing. (The bound is
  // long enough that no pause of a busy machine between the two reclaims outlasts it.)
  block_cache cache{1 * MiB, 0, 0, {}, 250'000'000};  // 250 ms
  std::this_thread::sleep_for(std::chrono::milliseconds{260});
  ASSERT_TRUE(cached(cache, 2, handed(cache, 0, 64 * KiB), 64 * KiB));  // used in this epoch
  EXPECT_EQ(cache.detach_stale(), 0U) << "the first reclaim: stream 2 was used";
  EXPECT_EQ(cache.detach_stale(), 0U) << "the second, at once: the epoch is new, not idle";
  EXPECT_EQ(cache.take(2, 64 * KiB), fake(0)) << "stream 2 keeps its block";
}

TEST(BlockCacheStale, BucketsOfReclaimedStreamsAreReused)
{
  block_cache cache{1 * MiB};
  for (stream_key k = 1; k <= 100; ++k) {
    ASSERT_TRUE(cached(cache, k, handed(cache, k, 256), 256));
  }
  cache.detach_stale();
  cache.detach_stale();  // a whole epoch later: all stale
  cache.free_parked(cache.begin_proof(), [](stream_key, void*, std::size_t) noexcept {});
  cache.detach_stale();  // now empty: unbound for reuse
  EXPECT_EQ(cache.stats().streams, 0U);
  for (stream_key k = 101; k <= 150; ++k) {
    ASSERT_TRUE(cached(cache, k, handed(cache, k, 256), 256));
  }
  EXPECT_EQ(cache.stats().streams, 50U);
  // The old streams (this thread has stale entries for some) still get only their own blocks.
  for (stream_key k = 1; k <= 100; ++k) { EXPECT_EQ(cache.take(k, 256), nullptr) << k; }
  for (stream_key k = 101; k <= 150; ++k) { EXPECT_EQ(cache.take(k, 256), fake(k)) << k; }
  EXPECT_EQ(cache.check_invariants(), 0U);
}

// ---- markers: each stream's order captured at its puts, the release ordered after it ----------

/// Fake markers over a model of stream order: each stream has a count of work submitted to it; a
/// block's last use is the count when it was freed; a marker holds the stream and count it was
/// set at; ordering the release after a marker raises the release's wait for that stream.
struct fake_markers {
  struct marker {
    stream_key stream;
    std::uint64_t at;
    bool ordered = true;  // false once a capture took the stream's order away
  };
  std::map<stream_key, std::uint64_t> work;    // per stream: work submitted so far
  std::map<stream_key, std::uint64_t> waited;  // per stream: how far the release waits
  std::map<void*, std::uint64_t> last_use;     // per block: its stream's work at its free
  int made = 0, destroyed = 0, remade = 0, marks = 0;
  bool fail_mark = false, fail_order = false, capturing = false;

  stream_markers ops()
  {
    return {this,
            [](void* c, void*& m, void* h) noexcept {
              auto& self = *static_cast<fake_markers*>(c);
              if (self.fail_mark) { return mark_result::unmarkable; }
              // A capture began: the owner's record became the graph's, and the marker holds no
              // order until the stream's next put.
              if (self.capturing) {
                if (m != nullptr) { static_cast<marker*>(m)->ordered = false; }
                return mark_result::capturing;
              }
              ++self.marks;
              auto const k = static_cast<stream_key>(reinterpret_cast<std::uintptr_t>(h));
              auto* mk     = static_cast<marker*>(m);
              if (mk != nullptr && mk->stream != k) {  // a reused bucket: another stream's
                delete mk;
                ++self.destroyed;
                ++self.remade;
                mk = nullptr;
              }
              if (mk == nullptr) {
                mk = new (std::nothrow) marker{k, 0};
                if (mk == nullptr) { return mark_result::unmarkable; }
                ++self.made;
                m = mk;
              }
              mk->at      = self.work[k];
              mk->ordered = true;
              return mark_result::marked;
            },
            [](void* c, void* m) noexcept {
              auto& self = *static_cast<fake_markers*>(c);
              if (self.fail_order || m == nullptr) { return false; }
              auto const* mk = static_cast<marker const*>(m);
              if (!mk->ordered) { return false; }
              auto& w        = self.waited[mk->stream];
              w              = std::max(w, mk->at);
              return true;
            },
            [](void* c, void* m) noexcept {
              delete static_cast<marker*>(m);
              ++static_cast<fake_markers*>(c)->destroyed;
            }};
  }
  static void* handle(stream_key k) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(k)); }
  /// A user frees `p` on `k` after using it there: the use is work on `k`, then the put.
  put_result free(block_cache& cache, stream_key k, void* p, std::size_t bytes)
  {
    last_use[p] = ++work[k];
    return cache.put(k, p, bytes, handle(k));
  }
  /// The owner frees on its release stream: the block's last use must be waited for.
  std::size_t release(block_cache& cache, bool stale = false)
  {
    if (stale) {
      cache.detach_stale();
    } else {
      cache.detach_all();
    }
    std::size_t unsafe = 0;
    cache.free_parked(cache.begin_proof(), [&](stream_key k, void* p, std::size_t) noexcept {
      if (waited[k] < last_use[p]) { ++unsafe; }
    });
    return unsafe;
  }
};

TEST(BlockCacheMarkers, EveryBlockGoesBackAfterTheReleaseWaitedForItsStream)
{
  fake_markers fm;
  block_cache cache{1 * MiB, 0, 0, fm.ops()};
  std::size_t n = 0;
  for (int round = 0; round < 20; ++round) {
    for (stream_key k = 1; k <= 8; ++k) {
      for (int i = 0; i < 3; ++i, ++n) {
        ASSERT_EQ(fm.free(cache, k, handed(cache, n, 4 * KiB), 4 * KiB).status, put_status::cached);
      }
      fm.work[k] += 5;  // more work on the stream after its frees: not waited for, not needed
    }
    EXPECT_EQ(fm.release(cache, round % 2 == 1), 0U) << "a block went back before its last use";
  }
  EXPECT_EQ(fm.release(cache), 0U);
  EXPECT_EQ(cache.check_invariants(), 0U);
}

TEST(BlockCacheMarkers, AReusedBucketMarksItsNewStream)
{
  fake_markers fm;
  block_cache cache{1 * MiB, 0, 0, fm.ops()};
  for (stream_key k = 1; k <= 10; ++k) {
    ASSERT_EQ(fm.free(cache, k, handed(cache, k, 256), 256).status, put_status::cached);
  }
  EXPECT_EQ(fm.release(cache, true), 0U);
  EXPECT_EQ(fm.release(cache, true), 0U);  // a whole epoch idle: parked, freed
  cache.detach_stale();                    // emptied: unbound for reuse
  for (stream_key k = 11; k <= 20; ++k) {
    ASSERT_EQ(fm.free(cache, k, handed(cache, k, 256), 256).status, put_status::cached);
  }
  EXPECT_EQ(fm.remade, 10) << "a reused bucket kept its old stream's marker";
  EXPECT_EQ(fm.release(cache), 0U);
}

TEST(BlockCacheMarkers, APutWhoseStreamCannotBeMarkedIsRefusedAndForgotten)
{
  fake_markers fm;
  block_cache cache{1 * MiB, 0, 0, fm.ops()};
  void* const p = handed(cache, 0, 4 * KiB);
  fm.fail_mark  = true;
  auto const r  = fm.free(cache, 1, p, 4 * KiB);
  EXPECT_EQ(r.status, put_status::refused) << "the caller must free it on its own stream";
  EXPECT_EQ(cache.recorded_bytes(p), 0U) << "a refused block leaves the record";
  EXPECT_EQ(cache.stats().refused_unmarked, 1U);
  EXPECT_EQ(cache.take(1, 4 * KiB), nullptr);
  EXPECT_EQ(cache.check_invariants(), 0U);
}

TEST(BlockCacheMarkers, APutOnAStreamThatBeganCapturingLeavesItsBucketUnorderedUntilTheNextPut)
{
  // A capture may begin on the stream between the owner's look and its record: the record is
  // then the graph's, so neither it nor the older marker orders the block's last use. The block
  // is cached (the driver refuses its free inside the capture) and no release takes the bucket
  // until the stream's next put orders it again.
  fake_markers fm;
  block_cache cache{1 * MiB, 0, 0, fm.ops()};
  void* const a = handed(cache, 0, 4 * KiB);
  void* const b = handed(cache, 1, 4 * KiB);
  void* const c = handed(cache, 2, 4 * KiB);
  ASSERT_EQ(fm.free(cache, 1, a, 4 * KiB).status, put_status::cached);
  fm.capturing = true;
  EXPECT_EQ(fm.free(cache, 1, b, 4 * KiB).status, put_status::cached);
  fm.capturing = false;
  EXPECT_EQ(cache.stats().refused_unmarked, 0U) << "a capture is no unmarkable stream";
  EXPECT_EQ(fm.release(cache), 0U);
  EXPECT_EQ(cache.stats().cached_blocks, 2U) << "released under an order that misses the block";
  ASSERT_EQ(fm.free(cache, 1, c, 4 * KiB).status, put_status::cached);  // ordered again
  EXPECT_EQ(fm.release(cache), 0U) << "a block went back before its last use";
  EXPECT_EQ(cache.stats().cached_blocks, 0U);
  EXPECT_EQ(cache.check_invariants(), 0U);
}

TEST(BlockCacheRelease, ABlockWhoseFreeFailsStaysInTheCacheUntilTheNextRelease)
{
  block_cache cache{1 * MiB};
  void* const p = handed(cache, 0, 4 * KiB);
  void* const q = handed(cache, 1, 4 * KiB);
  ASSERT_EQ(cache.put(1, p, 4 * KiB).status, put_status::cached);
  ASSERT_EQ(cache.put(1, q, 4 * KiB).status, put_status::cached);
  std::set<void*> freed;
  std::size_t const offered = cache.release([&](stream_key, void* b, std::size_t) noexcept {
    if (b == p) { return false; }  // the driver refused this free
    freed.insert(b);
    return true;
  });
  EXPECT_EQ(offered, 2U);
  EXPECT_EQ(freed, std::set<void*>{q});
  auto s = cache.stats();
  EXPECT_EQ(s.parked_blocks, 1U) << "the block whose free failed left the cache";
  EXPECT_EQ(cache.recorded_bytes(p), block_cache::round_to_class(4 * KiB))
    << "the block whose free failed left the record";
  EXPECT_GE(s.charged_bytes, block_cache::round_to_class(4 * KiB)) << "its charge went back";
  EXPECT_EQ(cache.put(1, p, 4 * KiB).status, put_status::already_cached)
    << "a second free of a block the cache still holds";
  EXPECT_EQ(cache.check_invariants(), 0U);
  std::size_t const again =
    cache.release([&](stream_key, void* b, std::size_t) noexcept { freed.insert(b); });
  EXPECT_EQ(again, 1U);
  EXPECT_EQ(freed, (std::set<void*>{p, q}));
  s = cache.stats();
  EXPECT_EQ(s.parked_blocks + s.cached_blocks, 0U);
  EXPECT_EQ(cache.recorded_bytes(p), 0U);
  EXPECT_EQ(cache.check_invariants(), 0U);
}

TEST(BlockCacheRelease, ABlockItsOwnStreamCouldNotFreeIsCachedThereAgain)
{
  block_cache cache{1 * MiB};
  void* const p = handed(cache, 0, 4 * KiB);
  ASSERT_EQ(cache.put(7, p, 4 * KiB).status, put_status::cached);
  EXPECT_EQ(cache.drain_stream(7, [](stream_key, void*, std::size_t) noexcept { return false; }),
            1U);
  EXPECT_EQ(cache.stats().cached_blocks, 1U);
  EXPECT_EQ(cache.take(7, 4 * KiB), p) << "its own stream may use it again";
  EXPECT_EQ(cache.check_invariants(), 0U);
}

TEST(BlockCacheMarkers, RefusalsForUnmarkableStreamsAreNoPressureOnTheCap)
{
  // A stale reclaim takes idle streams' blocks to make room under the cap: puts refused because
  // their stream could not be marked say nothing of the cap, and must not ask for one.
  fake_markers fm;
  block_cache cache{1 * MiB, 0, 0, fm.ops()};
  fm.fail_mark = true;
  for (std::size_t i = 0; i < 4 * block_cache::pressure_window; ++i) {
    ASSERT_EQ(fm.free(cache, 1, handed(cache, i, 4 * KiB), 4 * KiB).status, put_status::refused);
    EXPECT_FALSE(cache.note_pressure()) << "refusal " << i << " asked for a stale reclaim";
  }
  EXPECT_EQ(cache.stats().refused_unmarked, 4 * block_cache::pressure_window);
  EXPECT_EQ(cache.stats().refused_cap, 0U);
}

TEST(BlockCacheMarkers, ABucketWhoseReleaseCannotBeOrderedKeepsItsBlocks)
{
  fake_markers fm;
  block_cache cache{1 * MiB, 0, 0, fm.ops()};
  void* const p = handed(cache, 0, 4 * KiB);
  ASSERT_EQ(fm.free(cache, 1, p, 4 * KiB).status, put_status::cached);
  fm.fail_order = true;
  EXPECT_EQ(cache.detach_all(), 0U);
  EXPECT_EQ(cache.stats().parked_blocks, 0U);
  EXPECT_EQ(cache.take(1, 4 * KiB), p) << "still cached for its own stream";
  EXPECT_EQ(cache.check_invariants(), 0U);
}

TEST(BlockCacheMarkers, TheCacheDestroysEachMarkerOnce)
{
  fake_markers fm;
  {
    block_cache cache{1 * MiB, 0, 0, fm.ops()};
    for (stream_key k = 1; k <= 5; ++k) {
      ASSERT_EQ(fm.free(cache, k, handed(cache, k, 256), 256).status, put_status::cached);
      ASSERT_EQ(fm.free(cache, k, handed(cache, k + 100, 256), 256).status, put_status::cached);
    }
    EXPECT_EQ(fm.made, 5) << "one marker per stream, not per put";
    EXPECT_EQ(fm.release(cache), 0U);
  }
  EXPECT_EQ(fm.destroyed, fm.made);
}

// ---- statistics ------------------------------------------------------------------------------

TEST(BlockCache, StatsCountWhatHappened)
{
  block_cache cache{8 * KiB, 4 * KiB};
  EXPECT_EQ(cache.take(1, 4 * KiB), nullptr);                           // miss
  ASSERT_TRUE(cached(cache, 1, handed(cache, 0, 4 * KiB), 4 * KiB));    // cached
  ASSERT_TRUE(cached(cache, 2, handed(cache, 1, 4 * KiB), 4 * KiB));    // cached: cap full
  EXPECT_EQ(cache.put(2, handed(cache, 2, 256), 256).status, put_status::refused);
  EXPECT_EQ(cache.put(2, fake(3), 8 * KiB).status, put_status::uncacheable);
  EXPECT_EQ(cache.take(1, 4 * KiB), fake(0));  // hit
  EXPECT_EQ(cache.take(1, 4 * KiB), nullptr);  // miss
  auto const s = cache.stats();
  EXPECT_EQ(s.hits, 1U);
  EXPECT_EQ(s.misses, 2U);
  EXPECT_EQ(s.refused_cap, 1U);
  EXPECT_EQ(s.refused_uncacheable, 1U);
  EXPECT_EQ(s.cached_bytes, 4 * KiB);
  EXPECT_EQ(s.cached_blocks, 1U);
  EXPECT_EQ(s.recorded_blocks, 2U);
  EXPECT_EQ(s.streams, 2U);
  EXPECT_GE(s.charged_bytes, s.cached_bytes);
  EXPECT_LE(s.charged_bytes, cache.cap());
  EXPECT_EQ(s.charged_high, 8 * KiB) << "both blocks were charged at once";
}

TEST(BlockCache, ResetPeaksRestartsFromTheChargeNow)
{
  block_cache cache{8 * KiB, 4 * KiB};
  ASSERT_TRUE(cached(cache, 1, handed(cache, 0, 4 * KiB), 4 * KiB));
  ASSERT_TRUE(cached(cache, 1, handed(cache, 1, 4 * KiB), 4 * KiB));
  EXPECT_EQ(cache.stats().charged_high, 8 * KiB);
  EXPECT_EQ(release_all(cache).size(), 2U);
  EXPECT_EQ(cache.stats().charged_high, 8 * KiB) << "a peak outlives the bytes";
  cache.reset_peaks();
  EXPECT_EQ(cache.stats().charged_high, 0U);
  ASSERT_TRUE(cached(cache, 1, handed(cache, 0, 256), 256));
  EXPECT_GE(cache.stats().charged_high, 256U);
  EXPECT_LE(cache.stats().charged_high, 8 * KiB);
}

TEST(BlockCache, EveryCallTheOwnerMakesOnANoexceptPathIsNoexcept)
{
  // The owner frees, releases and reclaims from noexcept paths (a resource's deallocate and
  // destructor): none of these may throw, by declaration.
  block_cache cache{1 * MiB};
  auto const none = [](stream_key, void*, std::size_t) noexcept {};
  static_assert(noexcept(cache.take(1, 1)));
  static_assert(noexcept(cache.record(nullptr, 1)));
  static_assert(noexcept(cache.forget(nullptr)));
  static_assert(noexcept(cache.unrecord(nullptr, 0)));
  static_assert(noexcept(cache.put(1, nullptr, 1)));
  static_assert(noexcept(cache.note_pressure()));
  static_assert(noexcept(cache.detach_all()));
  static_assert(noexcept(cache.detach_stale()));
  static_assert(noexcept(cache.begin_proof()));
  static_assert(noexcept(cache.free_parked(0, none)));
  static_assert(noexcept(cache.drain_stream(1, none)));
  static_assert(noexcept(cache.stats()));
  static_assert(noexcept(cache.held_blocks()));
  SUCCEED();
}

// ---- lifetime of thread-local entries --------------------------------------------------------

TEST(BlockCache, ANewCacheAtADestroyedCachesAddressSharesNoThreadLocalEntry)
{
  alignas(block_cache) std::byte storage[sizeof(block_cache)];
  auto* first = new (storage) block_cache{1 * MiB};
  ASSERT_TRUE(cached(*first, 7, handed(*first, 0, 4 * KiB), 4 * KiB));
  std::uint64_t const first_id = first->id();
  first->~block_cache();  // dropped with a block inside: the bucket is freed

  auto* second = new (storage) block_cache{1 * MiB};
  ASSERT_EQ(static_cast<void*>(second), static_cast<void*>(first));
  EXPECT_NE(second->id(), first_id);
  EXPECT_EQ(second->take(7, 4 * KiB), nullptr) << "the old cache's block must not show up";
  auto const s = second->stats();
  EXPECT_EQ(s.streams, 1U) << "key 7 was registered afresh, not found through a stale entry";
  EXPECT_EQ(s.misses, 1U);
  second->~block_cache();
}

TEST(BlockCache, RecycledBucketsKeepStreamsApart)
{
  block_cache cache{1 * MiB};
  // 64 streams whose buckets are empty again: candidates for reuse.
  for (stream_key k = 1; k <= 64; ++k) {
    ASSERT_TRUE(cached(cache, k, handed(cache, k, 256), 256));
    ASSERT_EQ(cache.take(k, 256), fake(k));
  }
  EXPECT_EQ(cache.stats().streams, 64U);
  ASSERT_TRUE(cached(cache, 1000, handed(cache, 200, 256), 256));  // reuses an empty bucket
  EXPECT_EQ(cache.stats().streams, 64U) << "no new bucket while an empty one was free";
  for (stream_key k = 1; k <= 64; ++k) { ASSERT_TRUE(cached(cache, k, fake(k), 256)) << k; }
  for (stream_key k = 1; k <= 64; ++k) { EXPECT_EQ(cache.take(k, 256), fake(k)) << k; }
  EXPECT_EQ(cache.take(1000, 256), fake(200));
  EXPECT_EQ(cache.check_invariants(), 0U);
}

// ---- the model-based stress test ------------------------------------------------------------------

/// The "pool" and the shadow model: each slot is one fake block whose state is tracked
/// atomically, so any transition the owner's rules forbid is counted.
class shadow {
 public:
  enum state : int { in_pool = 0, live = 1, cached = 2, graph = 3 };

  explicit shadow(std::size_t slots) : slots_(slots)
  {
    for (std::size_t i = slots; i-- > 0;) { free_.push_back(i); }
  }

  /// A block from the pool (at `bytes`): in_pool -> live (or graph-owned).
  void* pool_alloc(std::size_t bytes, state as = live)
  {
    std::size_t i = 0;
    {
      std::lock_guard const g{mutex_};
      if (free_.empty()) {
        ++violations_;  // ran out of slots: a leak
        return nullptr;
      }
      i = free_.back();
      free_.pop_back();
    }
    move(i, in_pool, as);
    slots_[i].bytes.store(bytes, std::memory_order_relaxed);
    return fake(i);
  }
  void pool_free(void* p, state from = live)
  {
    std::size_t const i = index(p);
    move(i, from, in_pool);
    std::lock_guard const g{mutex_};
    free_.push_back(i);
  }
  /// A hit: the block was cached for this stream at this class; now live (never twice).
  void on_take(void* p, stream_key k, std::size_t class_bytes)
  {
    std::size_t const i = index(p);
    if (i >= slots_.size()) {
      ++violations_;
      return;
    }
    if (slots_[i].state.load() == graph) { ++graph_handouts_; }
    move(i, cached, live);
    if (slots_[i].stream.load(std::memory_order_relaxed) != k) { ++wrong_stream_; }
    if (slots_[i].bytes.load(std::memory_order_relaxed) != class_bytes) { ++wrong_class_; }
  }
  /// Before a put: from here the cache may hand the block out.
  void before_put(void* p, stream_key k, std::uint64_t now)
  {
    std::size_t const i = index(p);
    slots_[i].stream.store(k, std::memory_order_relaxed);
    slots_[i].put_time.store(now, std::memory_order_relaxed);
    move(i, live, cached);
  }
  void put_not_taken(void* p) { move(index(p), cached, live); }
  /// Freed by a release or a drain: must be cached (no user holds it), at its class, and (for
  /// a release) put before the release's proof began.
  void on_release(void* p, std::size_t class_bytes, std::uint64_t proof_time) noexcept
  {
    std::size_t const i = index(p);
    if (slots_[i].bytes.load(std::memory_order_relaxed) != class_bytes) { ++wrong_class_; }
    if (slots_[i].put_time.load(std::memory_order_relaxed) > proof_time) { ++unproven_frees_; }
    move(i, cached, live);
    pool_free(p);
  }

  [[nodiscard]] std::size_t count(state s) const
  {
    return static_cast<std::size_t>(
      std::count_if(slots_.begin(), slots_.end(), [&](auto& x) { return x.state.load() == s; }));
  }
  std::atomic<std::uint64_t> violations_{0};
  std::atomic<std::uint64_t> double_handouts_{0};
  std::atomic<std::uint64_t> graph_handouts_{0};
  std::atomic<std::uint64_t> wrong_stream_{0};
  std::atomic<std::uint64_t> wrong_class_{0};
  std::atomic<std::uint64_t> unproven_frees_{0};

 private:
  static std::size_t index(void* p)
  {
    return (reinterpret_cast<std::uintptr_t>(p) - std::uintptr_t{0x100000000}) / 4096;
  }
  void move(std::size_t i, state from, state to) noexcept
  {
    int expected = from;
    if (!slots_[i].state.compare_exchange_strong(expected, to, std::memory_order_acq_rel)) {
      if (from == cached && expected == live) {
        ++double_handouts_;  // handed out while a user held it: two owners
      } else {
        ++violations_;
      }
      slots_[i].state.store(to);
    }
  }
  struct slot {
    std::atomic<int> state{in_pool};
    std::atomic<stream_key> stream{0};
    std::atomic<std::size_t> bytes{0};
    std::atomic<std::uint64_t> put_time{0};
  };
  std::vector<slot> slots_;
  std::mutex mutex_;
  std::vector<std::size_t> free_;
};

struct stress_counts {
  std::uint64_t hits{};
  std::uint64_t foreign_accepted{};
  std::uint64_t double_accepted{};
  std::uint64_t wrong_size_accepted{};
};

std::atomic<std::uint64_t> logical_clock{1};
// A second free right after a first is a double free only while the block stays cached: once a
// release gave it back, the pool may hand the address to another thread, and a late second free
// is indistinguishable from that owner's (no allocator can tell). The stress holds releases off
// for the two statements.
std::shared_mutex release_gate;

/// One thread of the stress test, as the owner (stream_cache) would drive the cache.
void stress_thread(block_cache& cache, shadow& m, stream_key first_key, bool own_streams,
                   std::uint64_t seed, int ops, stress_counts& n)
{
  std::mt19937_64 rng{seed};
  stream_key key = first_key;
  struct held {
    void* p;
    std::size_t bytes;
    bool graph;
  };
  std::vector<held> mine;
  auto const random_size = [&]() -> std::size_t {
    auto const r = rng() % 100;
    if (r < 70) { return 1 + rng() % (4 * KiB); }
    if (r < 95) { return 1 + rng() % cache.max_block(); }
    return cache.max_block() + 1 + rng() % cache.max_block();  // uncacheable
  };
  auto const free_one = [&](std::size_t at) {
    held const b = mine[at];
    mine[at]     = mine.back();
    mine.pop_back();
    if (b.graph) {
      // A graph's allocation, freed outside the graph: never the cache's.
      auto const r = cache.put(key, b.p, b.bytes);
      if (r.status != put_status::graph && r.status != put_status::not_recorded) {
        ++n.foreign_accepted;
      }
      cache.forget(b.p);  // the graph and its note go (the pool may hand the address out)
      m.pool_free(b.p, shadow::graph);
      return;
    }
    if (rng() % 50 == 0 && cache.class_size(b.bytes) != 0) {
      // A wrong size first: refused, nothing changes.
      std::size_t const wrong = cache.class_size(b.bytes) == 256 ? 64 * KiB : 256;
      if (cache.put(key, b.p, wrong).status != put_status::wrong_size &&
          cache.recorded_bytes(b.p) != 0) {
        ++n.wrong_size_accepted;
      }
    }
    if (rng() % 40 == 0) {
      // Freed inside a capture: the owner lets the record go and frees it to the pool itself.
      auto const r = cache.unrecord(b.p, b.bytes);
      if (r.status == put_status::refused || r.status == put_status::not_recorded) {
        m.pool_free(b.p);
      } else {
        ++n.double_accepted;  // the user holds it: only those two answers are possible
        m.pool_free(b.p);
      }
      return;
    }
    bool const twice = own_streams && rng() % 50 == 0;
    std::shared_lock<std::shared_mutex> gate{release_gate, std::defer_lock};
    if (twice) { gate.lock(); }
    m.before_put(b.p, key, logical_clock.fetch_add(1));
    auto const r = cache.put(key, b.p, b.bytes);
    if (r.status == put_status::cached) {
      // (Only on a stream of its own: on a shared one another thread may have taken the block
      // back already, and then a second free is indistinguishable from its owner's.)
      if (twice && (cache.put(key, b.p, b.bytes).status != put_status::already_cached ||
                    cache.unrecord(b.p, b.bytes).status != put_status::already_cached)) {
        ++n.double_accepted;  // a second free of a cached block (outside or inside a capture)
      }
      return;
    }
    if (gate.owns_lock()) { gate.unlock(); }
    m.put_not_taken(b.p);
    m.pool_free(b.p);  // refused, uncacheable or untracked: the owner frees it to the pool
    if (r.status == put_status::refused && cache.note_pressure()) {
      // As the owner's reclaimer: park and free under the cache's release lock.
      std::unique_lock<std::shared_mutex> exclusive{release_gate};
      cache.reclaim_stale([&](stream_key, void* p, std::size_t c) noexcept {
        m.on_release(p, c, ~std::uint64_t{0});
      });
    }
  };
  for (int op = 0; op < ops; ++op) {
    auto const what = rng() % 1000;
    if (what < 5 && own_streams) {
      key = (rng() << 16) | first_key;  // the stream is destroyed; a new one takes its place
    } else if (what < 10) {
      // A pointer the cache never saw (another pool's): refused.
      void* const foreign = fake(1000000 + rng() % 1000);
      if (cache.put(key, foreign, 4 * KiB).status == put_status::cached) { ++n.foreign_accepted; }
    } else if (what < 15) {
      void* const g = m.pool_alloc(1 * KiB, shadow::graph);  // allocated inside a capture
      if (g != nullptr) {
        cache.record_graph(g);
        mine.push_back({g, 1 * KiB, true});
      }
    } else if (what < 17) {
      cache.drain_stream(key, [&](stream_key, void* p, std::size_t c) noexcept {
        m.on_release(p, c, ~std::uint64_t{0});
      });
    } else if (mine.empty() || (mine.size() < 48 && rng() % 2 == 0)) {
      std::size_t const bytes = random_size();
      std::size_t const c     = cache.class_size(bytes);
      void* p                 = nullptr;
      if (c != 0 && (p = cache.take(key, bytes)) != nullptr) {
        ++n.hits;
        m.on_take(p, key, c);
      } else {
        p = m.pool_alloc(c != 0 ? c : bytes);
        if (p != nullptr && c != 0) { static_cast<void>(cache.record(p, bytes)); }
      }
      if (p != nullptr) { mine.push_back({p, bytes, false}); }
    } else {
      free_one(rng() % mine.size());
    }
  }
  while (!mine.empty()) { free_one(mine.size() - 1); }
}

void run_stress(std::size_t threads, int ops)
{
  block_cache cache{256 * KiB};
  shadow m{16384};
  std::vector<stress_counts> counts(threads);
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> cap_violations{0};
  std::atomic<std::uint64_t> releases{0};
  // Releases and invariant checks from another thread while the others run.
  std::thread controller{[&] {
    std::mt19937_64 rng{7};
    while (!done.load()) {
      if (rng() % 3 == 0) {
        // A release as the owner makes it (park and free under the release lock).
        std::unique_lock<std::shared_mutex> gate{release_gate};
        cache.release([&](stream_key, void* p, std::size_t c) noexcept {
          m.on_release(p, c, ~std::uint64_t{0});
        });
        ++releases;
        continue;
      }
      // The steps one by one, with puts between the proof and the frees.
      if (rng() % 4 == 0) {
        cache.detach_all();
      } else {
        cache.detach_stale();
      }
      std::uint64_t const proven = cache.begin_proof();
      std::uint64_t const t      = logical_clock.fetch_add(1);
      std::this_thread::yield();  // "the synchronization": others put meanwhile
      {
        std::unique_lock<std::shared_mutex> gate{release_gate};
        cache.free_parked(proven, [&](stream_key, void* p, std::size_t c) noexcept {
          m.on_release(p, c, t);
        });
      }
      ++releases;
      try {
        if (cache.check_invariants() > cache.cap()) { ++cap_violations; }
      } catch (std::logic_error const&) {
        ++cap_violations;
      }
      std::this_thread::yield();
    }
  }};
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) {
    // The last two threads share a stream (as threads on the legacy stream do) and keep it.
    bool const shared = t + 2 >= threads && threads > 2;
    stream_key const k = shared ? 99 : 11 + t;
    pool.emplace_back([&, t, shared, k] {
      stress_thread(cache, m, k, !shared, 1000 + t, ops, counts[t]);
    });
  }
  for (auto& th : pool) { th.join(); }
  done.store(true);
  controller.join();

  stress_counts total;
  for (auto const& c : counts) {
    total.hits += c.hits;
    total.foreign_accepted += c.foreign_accepted;
    total.double_accepted += c.double_accepted;
    total.wrong_size_accepted += c.wrong_size_accepted;
  }
  EXPECT_EQ(m.double_handouts_.load(), 0U) << "an address was live twice";
  EXPECT_EQ(m.graph_handouts_.load(), 0U) << "a graph's allocation was handed out";
  EXPECT_EQ(m.wrong_stream_.load(), 0U) << "a block went to a stream it was not freed on";
  EXPECT_EQ(m.wrong_class_.load(), 0U);
  EXPECT_EQ(m.unproven_frees_.load(), 0U) << "a block put after a proof began was freed by it";
  EXPECT_EQ(m.violations_.load(), 0U);
  EXPECT_EQ(total.foreign_accepted, 0U);
  EXPECT_EQ(total.double_accepted, 0U);
  EXPECT_EQ(total.wrong_size_accepted, 0U);
  EXPECT_EQ(cap_violations.load(), 0U);
  EXPECT_GT(total.hits, 1000U) << "the stress should hit";
  EXPECT_GT(releases.load(), 0U);
  EXPECT_EQ(m.count(shadow::live), 0U);
  EXPECT_EQ(m.count(shadow::graph), 0U);
  // Everything still cached goes back; then every block is in the pool and the record is empty.
  cache.detach_all();
  cache.free_parked(cache.begin_proof(), [&](stream_key, void* p, std::size_t c) noexcept {
    m.on_release(p, c, ~std::uint64_t{0});
  });
  EXPECT_EQ(m.count(shadow::in_pool), 16384U) << "every block is back in the pool";
  EXPECT_EQ(m.violations_.load(), 0U);
  auto const s = cache.stats();
  EXPECT_EQ(s.charged_bytes, 0U);
  EXPECT_EQ(s.recorded_blocks, 0U) << "the record holds nothing the pool has back";
}

TEST(BlockCacheStress, OneThreadAgainstTheShadowModel) { run_stress(1, 40000); }

TEST(BlockCacheStress, EightThreadsReleasesAndReclaimsAgainstTheShadowModel)
{
  run_stress(8, 30000);
}

}  // namespace
}  // namespace asyncmr::detail

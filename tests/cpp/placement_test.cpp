/*
 * SPDX-License-Identifier: Apache-2.0
 */

// resource_options::prefetch on the GPU: a managed resource sends every allocation, cache hits
// too, to its target on the allocating stream; never on a capturing stream. And the placement
// calls (prefetch, discard, advise) on pool and cudaMallocManaged memory.

#include "test_support.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace asyncmr::test {
namespace {

class PrefetchTest : public GpuTest {};

int last_prefetch(void* ptr, std::size_t bytes)
{
  int where = -2;
  EXPECT_EQ(cudaMemRangeGetAttribute(&where, sizeof where, cudaMemRangeAttributeLastPrefetchLocation,
                                     ptr, bytes),
            cudaSuccess);
  return where;
}

TEST_F(PrefetchTest, EveryAllocationGoesToTheTarget)
{
  for (location const to : {location::device(0), location::host()}) {
    async_managed_memory_resource mr{
      {.source = pool_source::new_pool, .cache = 64 * mib, .prefetch = to}};
    EXPECT_EQ(mr.prefetch_target(), to);
    std::uint64_t const failed = failed_prefetches();
    void* p = mr.allocate(stream_ref(), 2 * mib);
    ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
    EXPECT_EQ(last_prefetch(p, 2 * mib), to.is_host() ? cudaCpuDeviceId : 0);
    mr.deallocate(stream_ref(), p, 2 * mib);  // kept by the cache
    void* q = mr.allocate(stream_ref(), 2 * mib);  // a hit: prefetched again
    EXPECT_EQ(q, p);
    mr.deallocate(stream_ref(), q, 2 * mib);
    ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
    EXPECT_EQ(failed_prefetches(), failed);
  }
}

TEST_F(PrefetchTest, ACapturedAllocationIsNotPrefetchedAndTheCaptureStaysValid)
{
  for (bool const discard : {false, true}) {
    if (discard && !can_discard()) { continue; }  // refused at construction (the test below)
    async_managed_memory_resource mr{
      {.source = pool_source::new_pool, .prefetch = location::device(0), .discard = discard}};
    capture_scope capture{stream(), cudaStreamCaptureModeThreadLocal};
    ASSERT_EQ(capture.begin_status(), cudaSuccess);
    void* g = mr.allocate(stream_ref(), mib);
    mr.deallocate(stream_ref(), g, mib);
    ASSERT_EQ(capture.end(), cudaSuccess)
      << "a prefetch inside the capture invalidated it (discard " << discard << ")";
    EXPECT_EQ(instantiate_and_run(capture.graph(), stream()), cudaSuccess);
  }
}

// discard = true: each allocation's pages are placed at the target with their old contents
// dropped, and a neighbour sharing a page with it keeps every byte (the driver drops only whole
// pages inside the range: ci/probes/discard_facts.cu).
TEST_F(PrefetchTest, DiscardAtAllocationPlacesTheBlockAndKeepsItsNeighboursBytes)
{
  resource_options const options{
    .source = pool_source::new_pool, .prefetch = location::device(0), .discard = true};
  if (!can_discard()) {
    EXPECT_THROW(async_managed_memory_resource{options}, unsupported_error);
    return;
  }
  async_managed_memory_resource mr{options};
  EXPECT_TRUE(mr.prefetch_discards());
  std::uint64_t const failed = failed_prefetches();
  constexpr std::size_t small = 3000;  // blocks 3072 bytes apart: most pages are shared
  auto* const first = static_cast<unsigned char*>(mr.allocate(stream_ref(), small));
  ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
  auto expected = [](std::size_t i) { return static_cast<unsigned char>(i * 7 + 3); };
  for (std::size_t i = 0; i < small; ++i) { first[i] = expected(i); }  // the host writes it
  auto pages_meet = [&](void const* p) {  // do p's 4 KiB pages and the first block's meet?
    auto const a = reinterpret_cast<std::uintptr_t>(first);
    auto const b = reinterpret_cast<std::uintptr_t>(p);
    return b / 4096 <= (a + small - 1) / 4096 && a / 4096 <= (b + small - 1) / 4096;
  };
  std::vector<void*> next;
  bool shares_a_page = false;
  for (int i = 0; i < 8; ++i) {
    next.push_back(mr.allocate(stream_ref(), small));  // each one discarded and prefetched
    shares_a_page = shares_a_page || pages_meet(next.back());
  }
  ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
  EXPECT_TRUE(shares_a_page) << "no block shared a page with the first: the test proves nothing";
  std::size_t changed = 0;
  for (std::size_t i = 0; i < small; ++i) { changed += first[i] != expected(i) ? 1 : 0; }
  EXPECT_EQ(changed, 0U) << "a neighbour's discard dropped bytes of the first block";
  EXPECT_EQ(last_prefetch(next.front(), small), 0);
  // Reused pool memory last touched by the host: placed on the device again.
  void* big = mr.allocate(stream_ref(), 8 * mib);
  ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
  std::memset(big, 1, 8 * mib);
  mr.deallocate(stream_ref(), big, 8 * mib);
  void* again = mr.allocate(stream_ref(), 8 * mib);
  ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
  EXPECT_EQ(last_prefetch(again, 8 * mib), 0);
  EXPECT_EQ(failed_prefetches(), failed);
  mr.deallocate(stream_ref(), again, 8 * mib);
  for (void* p : next) { mr.deallocate(stream_ref(), p, small); }
  mr.deallocate(stream_ref(), first, small);
  EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
}

TEST_F(PrefetchTest, PlacementCallsMoveRangesAndRefuseWhatTheyCannot)
{
  async_managed_memory_resource managed{{.source = pool_source::new_pool}};
  async_device_memory_resource device{{.source = pool_source::new_pool}};
  std::vector<memory_range> ranges;
  for (int i = 0; i < 3; ++i) { ranges.push_back({managed.allocate(stream_ref(), mib), mib}); }
  prefetch(ranges, location::host(), stream_ref());
  ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
  for (auto const& r : ranges) { EXPECT_EQ(last_prefetch(r.ptr, r.bytes), cudaCpuDeviceId); }
  if (can_discard()) {
    discard_and_prefetch(ranges, location::device(0), stream_ref());
    ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
    EXPECT_EQ(last_prefetch(ranges[0].ptr, mib), 0);
  } else {
    EXPECT_THROW(discard(ranges, stream_ref()), unsupported_error);
  }
  void* d = device.allocate(stream_ref(), mib);
  std::vector<memory_range> const not_managed{{d, mib}};
  EXPECT_THROW(prefetch(not_managed, location::device(0), stream_ref()), std::invalid_argument);
  std::vector<memory_range> const null_range{{nullptr, 16}};
  EXPECT_THROW(prefetch(null_range, location::host(), stream_ref()), std::invalid_argument);
  EXPECT_THROW(prefetch(ranges, location::none(), stream_ref()), std::invalid_argument);
  {
    capture_scope capture{stream(), cudaStreamCaptureModeThreadLocal};
    ASSERT_EQ(capture.begin_status(), cudaSuccess);
    EXPECT_THROW(prefetch(ranges, location::host(), stream_ref()), unsupported_error);
    EXPECT_EQ(capture.end(), cudaSuccess) << "the refused prefetch touched the capture";
  }
  device.deallocate(stream_ref(), d, mib);
  for (auto const& r : ranges) { managed.deallocate(stream_ref(), r.ptr, r.bytes); }
  EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
}

TEST(AdviceTest, AnUnknownAdviceOrABadTargetIsRefusedBeforeTheDriver)
{
  // No GPU needed: both are refused before any CUDA call.
  std::vector<memory_range> const none;
  EXPECT_THROW(advise(none, static_cast<memory_advice>(99), location::host()),
               std::invalid_argument);
  EXPECT_THROW(advise(none, memory_advice::set_read_mostly, location::none()),
               std::invalid_argument);
  std::vector<memory_range> const null_range{{nullptr, 16}};
  EXPECT_THROW(advise(null_range, memory_advice::set_read_mostly, location::host()),
               std::invalid_argument);
  // A bad range is refused before a device target is looked up (a driver call).
  EXPECT_THROW(advise(null_range, memory_advice::set_preferred_location, location::device(0)),
               std::invalid_argument);
  EXPECT_THROW(prefetch(null_range, location::device(0), cuda::stream_ref{cudaStreamPerThread}),
               std::invalid_argument);
  EXPECT_STREQ(to_string(memory_advice::unset_accessed_by), "unset_accessed_by");
}

TEST(AdviceTest, ARangePastTheEndOfTheAddressSpaceIsRefusedBeforeTheDriver)
{
  // No GPU needed: refused before any CUDA call, after a good range too (nothing applied).
  auto* const high = reinterpret_cast<void*>(~std::uintptr_t{0} - 4095);
  std::vector<memory_range> const wraps{{reinterpret_cast<void*>(4096), 16}, {high, 8192}};
  auto const says_range_1 = [&](auto&& call) {
    try {
      call();
    } catch (std::invalid_argument const& e) {
      return std::string{e.what()}.find("range 1 runs past the end of the address space") !=
             std::string::npos;
    } catch (...) {
    }
    return false;
  };
  EXPECT_TRUE(says_range_1([&] { prefetch(wraps, location::host(), cuda::stream_ref{cudaStreamPerThread}); }));
  EXPECT_TRUE(says_range_1([&] { discard(wraps, cuda::stream_ref{cudaStreamPerThread}); }));
  EXPECT_TRUE(says_range_1([&] { advise(wraps, memory_advice::set_read_mostly, location::host()); }));
}

TEST_F(PrefetchTest, PoolMemoryTakesNoAdviceAndCudaMallocManagedMemoryTakesAll)
{
  async_managed_memory_resource managed{{.source = pool_source::new_pool}};
  void* p = managed.allocate(stream_ref(), mib);
  ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
  std::vector<memory_range> const pool_range{{p, mib}};
  void* m = nullptr;
  ASSERT_EQ(cudaMallocManaged(&m, 2 * mib), cudaSuccess);
  std::vector<memory_range> const managed_range{{m, 2 * mib}};
  for (int a = 0; a <= static_cast<int>(memory_advice::unset_accessed_by); ++a) {
    auto const advice = static_cast<memory_advice>(a);
    // docs/DRIVER_FACTS.md: driver 580 refuses every kind on pool memory.
    EXPECT_THROW(advise(pool_range, advice, location::device(0)), unsupported_error)
      << to_string(advice);
    EXPECT_NO_THROW(advise(managed_range, advice, location::device(0))) << to_string(advice);
  }
  advise(managed_range, memory_advice::set_preferred_location, location::host());
  int preferred = 0;
  ASSERT_EQ(cudaMemRangeGetAttribute(&preferred, sizeof preferred,
                                     cudaMemRangeAttributePreferredLocation, m, 2 * mib),
            cudaSuccess);
  EXPECT_EQ(preferred, cudaCpuDeviceId);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a refusal left an error behind";
  void* q = managed.allocate(stream_ref(), mib);  // the context is fine
  managed.deallocate(stream_ref(), q, mib);
  managed.deallocate(stream_ref(), p, mib);
  EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
  EXPECT_EQ(cudaFree(m), cudaSuccess);
}

// Managed pools used on a stream made for them, dropped before it, while the main thread goes on
// to prefetch the next pool's memory. A managed pool destroyed soon after it first holds nothing
// there makes later prefetches fail with cudaErrorUnknown and then crashes the driver (SIGSEGV
// in cuMemPoolDestroy): asyncmr keeps such pools instead (docs/DRIVER_FACTS.md).
TEST_F(PrefetchTest, ManagedPoolsRetireWhileTheirNeighboursArePrefetched)
{
  pool_properties props;
  props.type     = allocation_type::managed;
  props.location = location::device(0);
  std::size_t const sizes[] = {4096, 64 << 10, (1 << 20) + 512};
  for (int round = 0; round < 60; ++round) {
    auto pool = mem_pool::create(props);
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    for (std::size_t n : sizes) {
      void* p = pool.allocate_async(n, s);
      std::vector<memory_range> range{{p, n}};
      ASSERT_NO_THROW(prefetch(range, round % 2 ? location::host() : location::device(0),
                               cuda::stream_ref{s}))
        << "round " << round << ", " << n << " bytes";
      ASSERT_EQ(pool.deallocate_async(p, s), cudaSuccess);
    }
    pool = mem_pool{};  // retired: parked behind the queued frees, or destroyed now
    ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds{2};
  while (asyncmr::testing::parked_pools() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds{10});
  }
  EXPECT_EQ(asyncmr::testing::parked_pools(), 0U);
}

}  // namespace
}  // namespace asyncmr::test

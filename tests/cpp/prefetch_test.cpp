/*
 * SPDX-License-Identifier: Apache-2.0
 */

// resource_options::prefetch on the GPU: a managed resource sends every allocation, cache hits
// too, to its target on the allocating stream; never on a capturing stream.

#include "test_support.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
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
  async_managed_memory_resource mr{
    {.source = pool_source::new_pool, .prefetch = location::device(0)}};
  capture_scope capture{stream(), cudaStreamCaptureModeThreadLocal};
  ASSERT_EQ(capture.begin_status(), cudaSuccess);
  void* g = mr.allocate(stream_ref(), mib);
  mr.deallocate(stream_ref(), g, mib);
  ASSERT_EQ(capture.end(), cudaSuccess) << "a prefetch inside the capture invalidated it";
  EXPECT_EQ(instantiate_and_run(capture.graph(), stream()), cudaSuccess);
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

}  // namespace
}  // namespace asyncmr::test

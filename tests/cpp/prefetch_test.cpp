/*
 * SPDX-License-Identifier: Apache-2.0
 */

// resource_options::prefetch on the GPU: a managed resource sends every allocation, cache hits
// too, to its target on the allocating stream; never on a capturing stream.

#include "test_support.hpp"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace asyncmr::test

/*
 * SPDX-License-Identifier: Apache-2.0
 */

// Issue-12 regressions: the runtime's error state belongs to the user, refused frees are
// visible, close() is safe against allocations in flight, foreign pools are judged by the
// driver, and a 13.2 attribute a driver refuses is "unsupported".

#include "test_support.hpp"

#include <asyncmr/pool_resource.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace asyncmr::test {
namespace {

using CorrectnessTest = GpuTest;

// Before: close() and pool destruction called cudaGetLastError() unconditionally.
TEST_F(CorrectnessTest, AUsersPendingErrorSurvivesAsyncmrCalls)
{
  ASSERT_EQ(cudaSetDevice(1 << 20), cudaErrorInvalidDevice);  // the user's own, unrelated error
  {
    auto pool = mem_pool::create(pool_properties{.type     = allocation_type::device,
                                                 .location = location::device(0)});
    async_device_memory_resource mr{pool};
    void* p = mr.allocate(stream_ref(), mib);
    mr.deallocate(stream_ref(), p, mib);
    ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
    static_cast<void>(pool.get<pool_attribute::used_mem_high>());
    pool.close();  // destroys the pool
  }
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidDevice);
  static_cast<void>(cudaGetLastError());
}

TEST_F(CorrectnessTest, AnErrorAsyncmrCausedIsClearedAndOnlyThat)
{
  async_device_memory_resource mr{device_resource_options{.source = pool_source::new_pool}};
  EXPECT_THROW(static_cast<void>(mr.allocate(stream_ref(), std::size_t{1} << 50)),
               rmm::out_of_memory);
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
}

// Before: deallocate swallowed cudaFreeAsync's error.
TEST_F(CorrectnessTest, ARefusedFreeIsCountedLoggedAndDoesNotThrow)
{
#ifndef NDEBUG
  GTEST_SKIP() << "not applicable: debug builds assert on a refused free, as RMM's do";
#endif
  async_device_memory_resource mr{device_resource_options{.source = pool_source::new_pool}};
  int not_from_a_pool = 0;
  auto const before   = failed_deallocations();
  mr.deallocate(stream_ref(), &not_from_a_pool, sizeof not_from_a_pool);
  EXPECT_EQ(failed_deallocations(), before + 1);
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  auto const checked = mr.deallocate_checked(stream_ref(), &not_from_a_pool, sizeof not_from_a_pool);
  EXPECT_EQ(checked.status, free_status::driver_refused);
  EXPECT_NE(checked.error, cudaSuccess);
  EXPECT_EQ(failed_deallocations(), before + 2);
}

// Before: allocate read the handle with nothing stopping close() from destroying the pool
// before the driver call.
TEST_F(CorrectnessTest, CloseWhileOtherThreadsAllocateIsSafe)
{
  for (int round = 0; round < 20; ++round) {
    auto pool = mem_pool::create(pool_properties{.type     = allocation_type::device,
                                                 .location = location::device(0)});
    std::atomic<bool> go{false};
    std::atomic<int> allocated{0};
    std::atomic<int> refused{0};
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, copy = pool] {
        cudaStream_t s = nullptr;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        while (!go.load()) {}
        for (int i = 0; i < 2000; ++i) {
          try {
            void* p = copy.allocate_async(4096, s);
            allocated.fetch_add(1);
            if (copy.deallocate_async(p, s) != cudaSuccess) { wrong.fetch_add(1); }
          } catch (pool_closed_error const&) {
            refused.fetch_add(1);
            break;
          } catch (...) {
            wrong.fetch_add(1);
            break;
          }
        }
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
      });
    }
    go.store(true);
    std::this_thread::sleep_for(std::chrono::microseconds(50 * (round % 5)));
    pool.close();
    for (auto& t : threads) { t.join(); }
    EXPECT_EQ(wrong.load(), 0) << "round " << round;
    EXPECT_GT(allocated.load() + refused.load(), 0);
  }
  // A later create sweeps what was parked, and the context still works.
  async_device_memory_resource mr{device_resource_options{.source = pool_source::new_pool}};
  void* p = mr.allocate(stream_ref(), mib);
  EXPECT_TRUE(kernel_writes_host_reads(p, mib, false, stream()));
  mr.deallocate(stream_ref(), p, mib);
}

// Before: every handle asyncmr had destroyed was refused for good, though the driver hands the
// same values out again to other libraries' pools.
TEST_F(CorrectnessTest, AForeignPoolCreatedAfterACloseIsAdopted)
{
  for (int i = 0; i < 10; ++i) {
    auto owned = mem_pool::create(pool_properties{.type     = allocation_type::device,
                                                  .location = location::device(0)});
    owned.close();
    cudaMemPoolProps props{};
    props.allocType     = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id   = 0;
    cudaMemPool_t foreign = nullptr;
    ASSERT_EQ(cudaMemPoolCreate(&foreign, &props), cudaSuccess);
    {
      auto adopted = mem_pool::from_handle(foreign);
      EXPECT_FALSE(adopted.owned());
      adopted.set<pool_attribute::release_threshold>(mib);
      EXPECT_EQ(driver_threshold(foreign), mib);
    }
    ASSERT_EQ(cudaMemPoolDestroy(foreign), cudaSuccess);
  }
}

TEST_F(CorrectnessTest, AClosedPoolItselfIsStillRefused)
{
  auto owned = mem_pool::create(pool_properties{.type     = allocation_type::device,
                                                .location = location::device(0)});
  auto copy = owned;
  owned.close();
  EXPECT_THROW(static_cast<void>(copy.handle()), pool_closed_error);
  EXPECT_THROW(async_device_memory_resource{copy}, pool_closed_error);
}

// Before: a CUDA 13.2 attribute the driver refused escaped as cuda_error.
TEST_F(CorrectnessTest, A13_2AttributeTheDriverRefusesIsUnsupported)
{
  if (versions().driver >= 13020) {
    GTEST_SKIP() << "not applicable: this driver knows the CUDA 13.2 attributes";
  }
  auto const raw = driver_default_pool(location::device(0), allocation_type::device);
  auto adopted   = mem_pool::from_handle(raw);  // no location known to asyncmr
  testing::set_driver_version(13020);           // as if this driver were 13.2
  EXPECT_THROW(static_cast<void>(adopted.get_attribute(pool_attribute::location_type)),
               unsupported_error);
  EXPECT_FALSE(adopted.location().has_value());
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  testing::set_driver_version(0);
}

}  // namespace
}  // namespace asyncmr::test

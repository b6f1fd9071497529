/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The three resources, each with every pool source: stream-ordered allocation that kernels and
// (for managed and pinned) the host can use, RMM's resource_ref, argument checks, errors, and
// the lifetime of the pool behind a resource.

#include "test_support.hpp"

#include <rmm/error.hpp>
#include <rmm/resource_ref.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>

namespace asyncmr::test {
namespace {

constexpr std::size_t test_bytes = 1 * mib;

template <class Kind>
class ResourceTest : public ResourceKindTest<Kind> {
 protected:
  /// @brief Allocates on the test's stream, has a kernel write and the host read the block,
  /// frees it on the stream.
  template <class Resource>
  void expect_serves_usable_memory(Resource& mr)
  {
    if constexpr (Kind::host_pool) {
      // Without access a kernel faults and the sticky error ends every later test: stop here.
      ASSERT_EQ(mr.pool().access(0), access_mode::read_write);
    }
    void* p = mr.allocate(this->stream_ref(), test_bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(kernel_writes_host_reads(p, test_bytes, Kind::host_accessible, this->stream()));
    mr.deallocate(this->stream_ref(), p, test_bytes);
    EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(this->stream()));
  }
};
TYPED_TEST_SUITE(ResourceTest, resource_kinds, kind_names);

// ---- every pool source serves usable memory --------------------------------------------------

TYPED_TEST(ResourceTest, DefaultPoolServesKernelWrittenMemory)
{
  typename TypeParam::resource_type mr{this->options(pool_source::default_pool)};
  EXPECT_EQ(mr.pool(), mem_pool::default_pool(TypeParam::where(), TypeParam::type));
  EXPECT_FALSE(mr.pool().owned());
  this->expect_serves_usable_memory(mr);
}

TYPED_TEST(ResourceTest, CurrentPoolServesKernelWrittenMemory)
{
  typename TypeParam::resource_type mr{this->options(pool_source::current)};
  EXPECT_EQ(mr.pool().handle(), driver_current_pool(TypeParam::where(), TypeParam::type));
  EXPECT_FALSE(mr.pool().owned());
  this->expect_serves_usable_memory(mr);
}

TYPED_TEST(ResourceTest, OwnedPoolServesKernelWrittenMemory)
{
  typename TypeParam::resource_type mr{this->options(pool_source::new_pool)};
  EXPECT_TRUE(mr.pool().owned());
  EXPECT_NE(mr.pool().handle(), driver_default_pool(TypeParam::where(), TypeParam::type));
  this->expect_serves_usable_memory(mr);
}

TYPED_TEST(ResourceTest, AdoptedPoolServesKernelWrittenMemory)
{
  mem_pool const owner = mem_pool::create(this->properties());
  auto const view =
    mem_pool::from_handle(owner.handle(), false, TypeParam::where(), TypeParam::type);
  typename TypeParam::resource_type mr{view};
  EXPECT_EQ(mr.pool(), owner);
  EXPECT_FALSE(mr.pool().owned());
  this->expect_serves_usable_memory(mr);
}

// ---- RMM and CCCL interfaces -----------------------------------------------------------------

TYPED_TEST(ResourceTest, AllocatesThroughDeviceAsyncResourceRef)
{
  typename TypeParam::resource_type mr{this->options(pool_source::default_pool)};
  rmm::device_async_resource_ref ref{mr};
  void* p = ref.allocate(this->stream_ref(), test_bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(kernel_writes_host_reads(p, test_bytes, TypeParam::host_accessible, this->stream()));
  ref.deallocate(this->stream_ref(), p, test_bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
}

TYPED_TEST(ResourceTest, AllocateSyncReturnsMemoryUsableOnAnyStream)
{
  typename TypeParam::resource_type mr{this->options(pool_source::default_pool)};
  void* p = mr.allocate_sync(test_bytes);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(kernel_writes_host_reads(p, test_bytes, TypeParam::host_accessible, this->stream()));
  mr.deallocate_sync(p, test_bytes);
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(cudaStreamPerThread));
}

TYPED_TEST(ResourceTest, AllocationsAreAlignedTo256Bytes)
{
  typename TypeParam::resource_type mr{this->options(pool_source::default_pool)};
  for (std::size_t const bytes : {std::size_t{1}, std::size_t{100}, std::size_t{4097}}) {
    void* p = mr.allocate(this->stream_ref(), bytes, 256);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u) << bytes << " bytes";
    mr.deallocate(this->stream_ref(), p, bytes, 256);
  }
}

// ---- arguments -------------------------------------------------------------------------------

TYPED_TEST(ResourceTest, ZeroBytesReturnsNullptr)
{
  typename TypeParam::resource_type mr{this->options(pool_source::default_pool)};
  void* p = mr.allocate(this->stream_ref(), 0);
  EXPECT_EQ(p, nullptr);
  mr.deallocate(this->stream_ref(), p, 0);  // freeing nullptr is a no-op
}

TYPED_TEST(ResourceTest, AlignmentAbove256ThrowsInvalidArgument)
{
  typename TypeParam::resource_type mr{this->options(pool_source::default_pool)};
  EXPECT_THROW(static_cast<void>(mr.allocate(this->stream_ref(), 64, 512)), std::invalid_argument);
}

TYPED_TEST(ResourceTest, AlignmentNotAPowerOfTwoThrowsInvalidArgument)
{
  typename TypeParam::resource_type mr{this->options(pool_source::default_pool)};
  EXPECT_THROW(static_cast<void>(mr.allocate(this->stream_ref(), 64, 48)), std::invalid_argument);
}

// ---- identity and lifetime -------------------------------------------------------------------

TYPED_TEST(ResourceTest, ResourcesOnTheSamePoolCompareEqual)
{
  typename TypeParam::resource_type a{this->options(pool_source::default_pool)};
  typename TypeParam::resource_type b{this->options(pool_source::default_pool)};
  EXPECT_TRUE(a == b);
}

TYPED_TEST(ResourceTest, OwnedPoolsOfTwoResourcesDiffer)
{
  typename TypeParam::resource_type a{this->options(pool_source::new_pool)};
  typename TypeParam::resource_type b{this->options(pool_source::new_pool)};
  EXPECT_FALSE(a == b);
}

TYPED_TEST(ResourceTest, CopiesShareTheOwnedPool)
{
  typename TypeParam::resource_type a{this->options(pool_source::new_pool)};
  auto const b = a;
  EXPECT_TRUE(a == b);
  EXPECT_TRUE(b.pool().owned());
  EXPECT_EQ(a.pool().handle(), b.pool().handle());
}

TYPED_TEST(ResourceTest, ClosingTheOwnedPoolThroughAViewStopsTheResource)
{
  typename TypeParam::resource_type mr{this->options(pool_source::new_pool)};
  auto view = mr.pool();
  view.close();
  EXPECT_TRUE(mr.pool().closed());
  EXPECT_THROW(static_cast<void>(mr.allocate(this->stream_ref(), test_bytes)), pool_closed_error);
}

TYPED_TEST(ResourceTest, AdoptedNonOwnedHandleStaysUsableAfterTheResourceIsGone)
{
  mem_pool const owner = mem_pool::create(this->properties());
  {
    auto const view =
      mem_pool::from_handle(owner.handle(), false, TypeParam::where(), TypeParam::type);
    typename TypeParam::resource_type mr{view};
    this->expect_serves_usable_memory(mr);
  }  // the adopting resource and the adopted view are gone; the pool must not be
  EXPECT_FALSE(owner.closed());
  EXPECT_NO_THROW(static_cast<void>(owner.get<pool_attribute::release_threshold>()));
  typename TypeParam::resource_type again{owner};
  this->expect_serves_usable_memory(again);
}

// ---- resource-specific -----------------------------------------------------------------------

class DeviceResourceTest : public GpuTest {};

TEST_F(DeviceResourceTest, ImpossibleAllocationThrowsOutOfMemoryAndTheNextSucceeds)
{
  async_device_memory_resource mr{};
  EXPECT_THROW(static_cast<void>(mr.allocate(stream_ref(), std::size_t{1} << 50)),
               rmm::out_of_memory);
  void* p = mr.allocate(stream_ref(), test_bytes);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(kernel_writes_host_reads(p, test_bytes, false, stream()));
  mr.deallocate(stream_ref(), p, test_bytes);
}

TEST_F(DeviceResourceTest, ImpossibleAllocationThroughResourceRefThrowsOutOfMemory)
{
  async_device_memory_resource mr{};
  rmm::device_async_resource_ref ref{mr};
  EXPECT_THROW(static_cast<void>(
                 ref.allocate(stream_ref(), std::size_t{1} << 50, rmm::CUDA_ALLOCATION_ALIGNMENT)),
               rmm::out_of_memory);
}

TEST_F(DeviceResourceTest, ReportsTheDeviceOfItsPool)
{
  async_device_memory_resource mr{device_resource_options{.device = 0}};
  EXPECT_EQ(mr.device(), 0);
  EXPECT_EQ(mr.pool().location(), location::device(0));
}

TEST_F(DeviceResourceTest, UnknownDeviceThrowsOutOfRange)
{
  EXPECT_THROW(async_device_memory_resource{device_resource_options{.device = device_count()}},
               std::out_of_range);
}

// ---- adopting a pool of the wrong kind ------------------------------------------------------

class AdoptionTest : public GpuTest {};

TEST_F(AdoptionTest, DeviceResourceRejectsAPinnedPool)
{
  ASYNCMR_SKIP_IF(host_pools_unavailable());
  auto const pinned =
    mem_pool::create(pool_properties{.type = allocation_type::pinned, .location = location::host()});
  EXPECT_THROW(async_device_memory_resource{pinned}, std::invalid_argument);
}

TEST_F(AdoptionTest, PinnedResourceRejectsADevicePool)
{
  ASYNCMR_SKIP_IF(host_pools_unavailable());
  auto const device = mem_pool::create(pool_properties{});
  EXPECT_THROW(async_pinned_memory_resource{device}, std::invalid_argument);
}

TEST_F(AdoptionTest, ManagedResourceRejectsADevicePool)
{
  ASYNCMR_SKIP_IF(managed_pools_unavailable());
  auto const device = mem_pool::create(pool_properties{});
  EXPECT_THROW(async_managed_memory_resource{device}, std::invalid_argument);
}

}  // namespace
}  // namespace asyncmr::test

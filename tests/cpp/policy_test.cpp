/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The process-wide policy a resource applies to its pool when it is constructed: the release
// threshold (shared, owned and adopted pools) and device access to host pools. The fixture puts
// the shared pools' thresholds back after each test.

#include "test_support.hpp"

#include <rmm/error.hpp>

#include <stdexcept>
#include <string>
#include <vector>

namespace asyncmr::test {
namespace {

template <class Kind>
class ThresholdPolicyTest : public ResourceKindTest<Kind> {
 protected:
  /// @brief The driver handle of the shared pool `source` names for this kind.
  [[nodiscard]] static cudaMemPool_t shared_pool(pool_source source)
  {
    return source == pool_source::current ? driver_current_pool(Kind::where(), Kind::type)
                                          : driver_default_pool(Kind::where(), Kind::type);
  }
  [[nodiscard]] static typename Kind::options_type with_threshold(pool_source source,
                                                                  std::uint64_t bytes)
  {
    auto o              = ResourceKindTest<Kind>::options(source);
    o.release_threshold = bytes;
    return o;
  }
};
TYPED_TEST_SUITE(ThresholdPolicyTest, resource_kinds, kind_names);

// ---- shared pools (default and current) ------------------------------------------------------

TYPED_TEST(ThresholdPolicyTest, SharedZeroThresholdIsRaisedToMaxWhenNoneIsGiven)
{
  auto const pool = this->shared_pool(pool_source::default_pool);
  set_driver_threshold(pool, 0);
  typename TypeParam::resource_type mr{this->options(pool_source::default_pool)};
  EXPECT_EQ(driver_threshold(pool), max_threshold);
}

TYPED_TEST(ThresholdPolicyTest, SharedNonZeroThresholdIsKeptWhenNoneIsGiven)
{
  auto const pool = this->shared_pool(pool_source::default_pool);
  set_driver_threshold(pool, 5 * mib);
  typename TypeParam::resource_type mr{this->options(pool_source::default_pool)};
  EXPECT_EQ(driver_threshold(pool), 5 * mib);
}

TYPED_TEST(ThresholdPolicyTest, ExplicitZeroThresholdIsAppliedToTheSharedPool)
{
  auto const pool = this->shared_pool(pool_source::default_pool);
  set_driver_threshold(pool, max_threshold);
  typename TypeParam::resource_type mr{this->with_threshold(pool_source::default_pool, 0)};
  EXPECT_EQ(driver_threshold(pool), 0u);
}

TYPED_TEST(ThresholdPolicyTest, ExplicitNonZeroThresholdIsAppliedToTheSharedPool)
{
  auto const pool = this->shared_pool(pool_source::default_pool);
  set_driver_threshold(pool, 5 * mib);
  typename TypeParam::resource_type mr{this->with_threshold(pool_source::default_pool, 7 * mib)};
  EXPECT_EQ(driver_threshold(pool), 7 * mib);
}

TYPED_TEST(ThresholdPolicyTest, CurrentPoolZeroThresholdIsRaisedToMaxWhenNoneIsGiven)
{
  auto const pool = this->shared_pool(pool_source::current);
  set_driver_threshold(pool, 0);
  typename TypeParam::resource_type mr{this->options(pool_source::current)};
  EXPECT_EQ(driver_threshold(pool), max_threshold);
}

TYPED_TEST(ThresholdPolicyTest, CurrentPoolTakesAnExplicitThresholdExactly)
{
  auto const pool = this->shared_pool(pool_source::current);
  set_driver_threshold(pool, max_threshold);
  typename TypeParam::resource_type mr{this->with_threshold(pool_source::current, 0)};
  EXPECT_EQ(driver_threshold(pool), 0u);
}

// ---- owned pools -----------------------------------------------------------------------------

TYPED_TEST(ThresholdPolicyTest, OwnedPoolGetsMaxThresholdWhenNoneIsGiven)
{
  typename TypeParam::resource_type mr{this->options(pool_source::new_pool)};
  EXPECT_EQ(driver_threshold(mr.pool().handle()), max_threshold);
}

TYPED_TEST(ThresholdPolicyTest, OwnedPoolGetsTheGivenThreshold)
{
  typename TypeParam::resource_type zero{this->with_threshold(pool_source::new_pool, 0)};
  EXPECT_EQ(driver_threshold(zero.pool().handle()), 0u);
  typename TypeParam::resource_type some{this->with_threshold(pool_source::new_pool, 3 * mib)};
  EXPECT_EQ(driver_threshold(some.pool().handle()), 3 * mib);
}

TYPED_TEST(ThresholdPolicyTest, OwnedPoolLeavesTheSharedPoolAlone)
{
  auto const shared = this->shared_pool(pool_source::default_pool);
  set_driver_threshold(shared, 0);
  typename TypeParam::resource_type mr{this->options(pool_source::new_pool)};
  EXPECT_EQ(driver_threshold(shared), 0u);
}

// ---- adopted pools ---------------------------------------------------------------------------

TYPED_TEST(ThresholdPolicyTest, AdoptedPoolKeepsItsThresholdWhenNoneIsGiven)
{
  auto props              = this->properties();
  props.release_threshold = 0;
  mem_pool const owner    = mem_pool::create(props);
  typename TypeParam::resource_type mr{owner};
  EXPECT_EQ(driver_threshold(owner.handle()), 0u);
}

TYPED_TEST(ThresholdPolicyTest, AdoptedPoolTakesTheGivenThreshold)
{
  mem_pool const owner = mem_pool::create(this->properties());
  typename TypeParam::resource_type mr{owner, this->with_threshold(pool_source::default_pool, 0)};
  EXPECT_EQ(driver_threshold(owner.handle()), 0u);
}

// ---- growing the pool up front (reserve) -------------------------------------------------------

// True when `make` throws std::invalid_argument whose message holds `text`.
template <class F>
[[nodiscard]] ::testing::AssertionResult refused(F&& make, char const* text)
{
  try {
    make();
  } catch (std::invalid_argument const& e) {
    if (std::string{e.what()}.find(text) != std::string::npos) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "refused with: " << e.what();
  }
  return ::testing::AssertionFailure() << "not refused";
}

class DeviceReserveTest : public GpuTest {};

template <class Kind>
class ReserveTest : public ThresholdPolicyTest<Kind> {};
TYPED_TEST_SUITE(ReserveTest, resource_kinds, kind_names);

TYPED_TEST(ReserveTest, AnOwnedPoolHoldsTheReservationUnusedAndServesAllocationsFromIt)
{
  auto o    = this->options(pool_source::new_pool);
  o.reserve = 64 * mib;
  typename TypeParam::resource_type mr{o};
  auto const& pool = mr.pool();
  auto const held  = pool.template get<pool_attribute::reserved_mem_current>();
  EXPECT_GE(held, 64 * mib);
  EXPECT_EQ(pool.template get<pool_attribute::used_mem_current>(), 0u);
  EXPECT_EQ(pool.template get<pool_attribute::used_mem_high>(), 0u);  // peaks start after it
  // 16 blocks of 2 MiB live at once come out of the reservation: the pool does not grow.
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) { blocks.push_back(mr.allocate(this->stream_ref(), 2 * mib)); }
  EXPECT_EQ(pool.template get<pool_attribute::reserved_mem_current>(), held);
  for (void* p : blocks) { mr.deallocate(this->stream_ref(), p, 2 * mib); }
  ASSERT_EQ(cudaStreamSynchronize(this->stream()), cudaSuccess);
  EXPECT_EQ(pool.template get<pool_attribute::reserved_mem_current>(), held);
}

TYPED_TEST(ReserveTest, ASharedPoolKeepsTheReservationUnderTheThresholdPolicy)
{
  auto const pool = this->shared_pool(pool_source::default_pool);
  set_driver_threshold(pool, 0);
  auto o    = this->options(pool_source::default_pool);
  o.reserve = 8 * mib;
  typename TypeParam::resource_type mr{o};
  EXPECT_EQ(driver_threshold(pool), max_threshold);  // raised from 0, as without a reservation
  EXPECT_GE(mr.pool().template get<pool_attribute::reserved_mem_current>(), 8 * mib);
}

TYPED_TEST(ReserveTest, AReservationAboveTheThresholdIsRefusedBeforeAnythingChanges)
{
  auto const shared = this->shared_pool(pool_source::default_pool);
  set_driver_threshold(shared, 5 * mib);
  auto o    = this->options(pool_source::default_pool);
  o.reserve = 64 * mib;
  EXPECT_TRUE(refused([&] { typename TypeParam::resource_type mr{o}; },
                      "above the pool's release threshold (5242880 bytes)"));
  EXPECT_EQ(driver_threshold(shared), 5 * mib);
  // An explicit threshold below the reservation, on a new pool and on an adopted one.
  auto owned              = this->options(pool_source::new_pool);
  owned.reserve           = 64 * mib;
  owned.release_threshold = mib;
  EXPECT_TRUE(refused([&] { typename TypeParam::resource_type mr{owned}; },
                      "pass release_threshold >= reserve"));
  auto props              = this->properties();
  props.release_threshold = 0;
  mem_pool const adopted  = mem_pool::create(props);
  auto on_adopted         = this->options(pool_source::default_pool);
  on_adopted.reserve      = mib;
  EXPECT_TRUE(refused([&] { typename TypeParam::resource_type mr{adopted, on_adopted}; },
                      "release threshold (0 bytes)"));
  EXPECT_EQ(adopted.template get<pool_attribute::reserved_mem_current>(), 0u);
}

TYPED_TEST(ReserveTest, AReservationABoundedPoolCannotMakeThrowsOutOfMemoryAndChangesNothing)
{
  if constexpr (TypeParam::type == allocation_type::managed) {
    GTEST_SKIP() << "not applicable: the driver refuses max_size for managed pools";
  } else {
    auto props              = this->properties();
    props.max_size          = 64 * mib;
    props.release_threshold = 0;
    mem_pool const bounded  = mem_pool::create(props);
    auto o                  = this->options(pool_source::default_pool);
    o.reserve               = 128 * mib;
    o.release_threshold     = 256 * mib;
    EXPECT_THROW((typename TypeParam::resource_type{bounded, o}), rmm::out_of_memory);
    EXPECT_EQ(driver_threshold(bounded.handle()), 0u);  // put back
    EXPECT_EQ(bounded.template get<pool_attribute::reserved_mem_current>(), 0u);
    EXPECT_EQ(bounded.template get<pool_attribute::used_mem_current>(), 0u);
    // The pool still serves what fits.
    typename TypeParam::resource_type mr{bounded};
    void* p = mr.allocate(this->stream_ref(), mib);
    mr.deallocate(this->stream_ref(), p, mib);
  }
}

TEST_F(DeviceReserveTest, AnImpossibleReservationOnTheSharedPoolPutsItsThresholdBack)
{
  cudaMemPool_t const pool = driver_default_pool(location::device(0), allocation_type::device);
  set_driver_threshold(pool, 0);
  device_resource_options o{};
  o.reserve = std::size_t{1} << 50;  // 1 PiB of device memory
  EXPECT_THROW(async_device_memory_resource{o}, rmm::out_of_memory);
  EXPECT_EQ(driver_threshold(pool), 0u);
  // The context still works.
  async_device_memory_resource mr{};
  void* p = mr.allocate(stream_ref(), mib);
  EXPECT_TRUE(kernel_writes_host_reads(p, mib, false, stream()));
  mr.deallocate(stream_ref(), p, mib);
}

// ---- device access to host pools ---------------------------------------------------------------

class HostPoolAccessTest : public GpuTest {
 protected:
  void SetUp() override
  {
    GpuTest::SetUp();
    if (IsSkipped()) { return; }
    ASYNCMR_SKIP_IF(host_pools_unavailable());
  }
  [[nodiscard]] static pinned_resource_options owned_accessible_from(std::vector<int> devices)
  {
    pinned_resource_options o{};
    o.source          = pool_source::new_pool;
    o.accessible_from = std::move(devices);
    return o;
  }
};

TEST_F(HostPoolAccessTest, PinnedDefaultPoolGrantsReadWriteToEveryDevice)
{
  async_pinned_memory_resource mr{};
  for (int d = 0; d < device_count(); ++d) {
    EXPECT_EQ(mr.pool().access(d), access_mode::read_write) << "device " << d;
  }
}

TEST_F(HostPoolAccessTest, PinnedOwnedPoolGrantsReadWriteToEveryDevice)
{
  async_pinned_memory_resource mr{pinned_resource_options{.source = pool_source::new_pool}};
  for (int d = 0; d < device_count(); ++d) {
    EXPECT_EQ(mr.pool().access(d), access_mode::read_write) << "device " << d;
  }
}

TEST_F(HostPoolAccessTest, PinnedPoolGrantsOnlyTheListedDevices)
{
  async_pinned_memory_resource mr{owned_accessible_from({0})};
  EXPECT_EQ(mr.pool().access(0), access_mode::read_write);
  for (int d = 1; d < device_count(); ++d) {
    EXPECT_EQ(mr.pool().access(d), access_mode::none) << "device " << d << " was not listed";
  }
}

TEST_F(HostPoolAccessTest, PinnedPoolWithAnEmptyListGrantsNothing)
{
  async_pinned_memory_resource mr{owned_accessible_from({})};
  EXPECT_EQ(mr.pool().access(0), access_mode::none);
}

TEST_F(HostPoolAccessTest, AdoptedPinnedPoolIsGrantedReadWrite)
{
  auto const owner =
    mem_pool::create(pool_properties{.type = allocation_type::pinned, .location = location::host()});
  ASSERT_EQ(owner.access(0), access_mode::none) << "created host pools start without access";
  async_pinned_memory_resource mr{owner};
  EXPECT_EQ(owner.access(0), access_mode::read_write);
}

TEST_F(HostPoolAccessTest, AdoptedPinnedPoolIsGrantedOnlyTheListedDevices)
{
  auto const owner =
    mem_pool::create(pool_properties{.type = allocation_type::pinned, .location = location::host()});
  async_pinned_memory_resource mr{owner,
                                  pinned_resource_options{.accessible_from = std::vector<int>{}}};
  EXPECT_EQ(owner.access(0), access_mode::none);
}

TEST_F(HostPoolAccessTest, ManagedHostPoolGrantsReadWriteAndServesKernelWrittenMemory)
{
  ASYNCMR_SKIP_IF(managed_pools_unavailable());
  async_managed_memory_resource mr{managed_resource_options{.location = location::host()}};
  // Without access a kernel faults and the sticky error ends every later test: stop here.
  ASSERT_EQ(mr.pool().access(0), access_mode::read_write);
  void* p = mr.allocate(stream_ref(), mib);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(kernel_writes_host_reads(p, mib, true, stream()));
  mr.deallocate(stream_ref(), p, mib);
}

}  // namespace
}  // namespace asyncmr::test

/*
 * SPDX-License-Identifier: Apache-2.0
 */

// mem_pool: typed attribute access, peaks, trim, the CUDA 13.2 attributes on older drivers,
// routing (make_current) and the lifetime of owned pools and views.

#include "test_kernels.hpp"
#include "test_support.hpp"

#include <atomic>
#include <cstdint>
#include <chrono>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

namespace asyncmr::test {
namespace {

using attr = pool_attribute;

class MemPoolTest : public GpuTest {
 protected:
  /// @brief Allocates `bytes` from `pool` on the test's stream, frees them and waits.
  void allocate_free_sync(mem_pool const& pool, std::size_t bytes)
  {
    void* p = nullptr;
    ASSERT_EQ(cudaSuccess, cudaMallocFromPoolAsync(&p, bytes, pool.handle(), stream()));
    ASSERT_EQ(cudaSuccess, cudaFreeAsync(p, stream()));
    ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream()));
  }
};

// ---- views and owned pools -------------------------------------------------------------------

TEST_F(MemPoolTest, DefaultPoolIsAViewOfTheDriversDefaultPool)
{
  auto const pool = mem_pool::default_pool(location::device(0), allocation_type::device);
  EXPECT_EQ(pool.handle(), driver_default_pool(location::device(0), allocation_type::device));
  EXPECT_FALSE(pool.owned());
  EXPECT_EQ(pool.location(), location::device(0));
  EXPECT_EQ(pool.type(), allocation_type::device);
}

TEST_F(MemPoolTest, CurrentPoolIsTheDriversCurrentPool)
{
  auto const pool = mem_pool::current(location::device(0), allocation_type::device);
  EXPECT_EQ(pool.handle(), driver_current_pool(location::device(0), allocation_type::device));
  EXPECT_FALSE(pool.owned());
}

TEST_F(MemPoolTest, CreatedPoolIsOwnedAndKeepsItsProperties)
{
  pool_properties props{};
  props.max_size  = 32 * mib;
  auto const pool = mem_pool::create(props);
  EXPECT_TRUE(pool.owned());
  EXPECT_NE(pool.handle(), driver_default_pool(location::device(0), allocation_type::device));
  ASSERT_TRUE(pool.properties().has_value());
  EXPECT_EQ(pool.properties()->max_size, 32 * mib);
  EXPECT_EQ(pool.location(), location::device(0));
  EXPECT_EQ(pool.type(), allocation_type::device);
}

TEST_F(MemPoolTest, CreatedPoolKeepsWhatItReservesByDefault)
{
  auto const pool = mem_pool::create(pool_properties{});
  EXPECT_EQ(pool.get<attr::release_threshold>(), max_threshold);
  EXPECT_EQ(driver_threshold(pool.handle()), max_threshold);
}

TEST_F(MemPoolTest, CreatedPoolTakesTheGivenThreshold)
{
  pool_properties props{};
  props.release_threshold = 0;
  auto const pool         = mem_pool::create(props);
  EXPECT_EQ(driver_threshold(pool.handle()), 0u);
}

TEST_F(MemPoolTest, FromHandleRejectsNull)
{ EXPECT_THROW(static_cast<void>(mem_pool::from_handle(nullptr)), std::invalid_argument); }

TEST_F(MemPoolTest, ImpossibleLocationAndTypePairsThrowInvalidArgument)
{
  EXPECT_THROW(static_cast<void>(mem_pool::default_pool(location::host(), allocation_type::device)),
               std::invalid_argument);
  EXPECT_THROW(
    static_cast<void>(mem_pool::default_pool(location::device(0), allocation_type::pinned)),
    std::invalid_argument);
  pool_properties props{};
  props.location = location::host();  // device memory on the host
  EXPECT_THROW(static_cast<void>(mem_pool::create(props)), std::invalid_argument);
}

TEST(MemPoolRules, ExportHandleBitsNoTypeHasAreRefusedBeforeTheDriver)
{
  // No GPU needed: refused before any CUDA call.
  pool_properties props{};
  props.location            = location::host();
  props.type                = allocation_type::pinned;
  props.export_handle_types = 0x7FFFFFFF;
  try {
    static_cast<void>(mem_pool::create(props));
    ADD_FAILURE() << "not refused";
  } catch (std::invalid_argument const& e) {
    EXPECT_STREQ(e.what(),
                 "asyncmr: export_handle_types 0x7fffffff has bits no export handle type has "
                 "(0x7ffffff6); the types are posix_fd = 1, fabric = 8");
  }
  props.export_handle_types = -1;
  EXPECT_THROW(static_cast<void>(mem_pool::create(props)), std::invalid_argument);
}

TEST_F(MemPoolTest, CloseIsIdempotentAndSeenThroughEveryCopy)
{
  auto pool       = mem_pool::create(pool_properties{});
  auto const copy = pool;
  pool.close();
  EXPECT_NO_THROW(pool.close());
  EXPECT_TRUE(pool.closed());
  EXPECT_TRUE(copy.closed());
  EXPECT_EQ(copy.handle_or_null(), nullptr);
}

TEST_F(MemPoolTest, ClosedPoolThrowsPoolClosedErrorOnUse)
{
  auto pool = mem_pool::create(pool_properties{});
  pool.close();
  EXPECT_THROW(static_cast<void>(pool.handle()), pool_closed_error);
  EXPECT_THROW(static_cast<void>(pool.get<attr::release_threshold>()), pool_closed_error);
  EXPECT_THROW(pool.set<attr::release_threshold>(0), pool_closed_error);
  EXPECT_THROW(pool.trim_to(0), pool_closed_error);
  EXPECT_THROW(static_cast<void>(pool.access(0)), pool_closed_error);
  EXPECT_THROW(static_cast<void>(pool.make_current()), pool_closed_error);
}

TEST_F(MemPoolTest, ClosingAViewLeavesTheDriverPoolAlive)
{
  auto view                  = mem_pool::default_pool(location::device(0), allocation_type::device);
  cudaMemPool_t const handle = view.handle();
  view.close();
  EXPECT_TRUE(view.closed());
  // The default pool is never destroyed, so asking the driver about it is safe here.
  std::uint64_t threshold = 0;
  EXPECT_EQ(cudaSuccess,
            cudaMemPoolGetAttribute(handle, cudaMemPoolAttrReleaseThreshold, &threshold));
  EXPECT_EQ(mem_pool::default_pool(location::device(0), allocation_type::device).handle(), handle);
}

TEST_F(MemPoolTest, OwnedPoolIsDestroyedWithItsLastCopy)
{
  // The destroyed handle must not be asked anything. What is observable: an owned pool that is
  // current routes its location back to the default pool when it is destroyed, and not before.
  auto const loc = location::device(0);
  auto const def = driver_default_pool(loc, allocation_type::device);
  std::optional<mem_pool> first{mem_pool::create(pool_properties{})};
  std::optional<mem_pool> second{*first};
  cudaMemPool_t const handle = first->handle();
  static_cast<void>(first->make_current());
  ASSERT_EQ(driver_current_pool(loc, allocation_type::device), handle);

  first.reset();
  EXPECT_FALSE(second->closed());
  EXPECT_EQ(driver_current_pool(loc, allocation_type::device), handle) << "destroyed too early";

  second.reset();
  EXPECT_EQ(driver_current_pool(loc, allocation_type::device), def)
    << "not destroyed, or left current";
}

// A managed pool is never destroyed (detail::retirement says why): an idle one is kept as a
// spare and serves the next create of the same properties, so that creating and dropping
// managed pools does not leave one driver pool per pool ever made.
TEST_F(MemPoolTest, ADroppedManagedPoolServesTheNextCreateOfItsKind)
{
  pool_properties props{};
  props.type = allocation_type::managed;
  std::set<cudaMemPool_t> made;
  for (int round = 0; round < 200; ++round) {
    auto pool = mem_pool::create(props);
    made.insert(pool.handle());
    allocate_free_sync(pool, 64 << 10);
  }
  // A spare serves once it was kept a moment; fast churn makes at most 64 more before waiting.
  EXPECT_LE(made.size(), 66U) << "dropped managed pools did not serve later ones";
  EXPECT_LE(testing::spare_pools(), 66U);
  EXPECT_EQ(testing::parked_pools(), 0U);
  std::this_thread::sleep_for(std::chrono::milliseconds{150});
  auto const again = mem_pool::create(props);
  EXPECT_EQ(made.count(again.handle()), 1U) << "a settled spare did not serve";
  pool_properties elsewhere = props;
  elsewhere.location        = location::host();
  auto const other          = mem_pool::create(elsewhere);
  EXPECT_EQ(made.count(other.handle()), 0U) << "a spare served a pool of another location";
}

TEST_F(MemPoolTest, ASpareReadsAsANewPool)
{
  pool_properties props{};
  props.type            = allocation_type::managed;
  cudaMemPool_t handle  = nullptr;
  {
    auto pool = mem_pool::create(props);
    handle    = pool.handle();
    allocate_free_sync(pool, 4 * mib);
    pool.set<attr::release_threshold>(12345);
    pool.set<attr::reuse_follow_event_dependencies>(false);
    pool.set<attr::reuse_allow_opportunistic>(false);
    pool.set<attr::reuse_allow_internal_dependencies>(false);
  }
  EXPECT_THROW(static_cast<void>(mem_pool::from_handle(handle, false)), std::invalid_argument)
    << "a spare was adopted";
  std::this_thread::sleep_for(std::chrono::milliseconds{150});  // settled: it serves
  props.release_threshold = 0;
  auto const pool         = mem_pool::create(props);
  ASSERT_EQ(pool.handle(), handle) << "the spare did not serve";
  EXPECT_EQ(pool.get<attr::release_threshold>(), 0U);
  EXPECT_TRUE(pool.get<attr::reuse_follow_event_dependencies>());
  EXPECT_TRUE(pool.get<attr::reuse_allow_opportunistic>());
  EXPECT_TRUE(pool.get<attr::reuse_allow_internal_dependencies>());
  EXPECT_EQ(pool.get<attr::used_mem_high>(), 0U);
  EXPECT_EQ(pool.get<attr::reserved_mem_high>(), 0U);
  EXPECT_EQ(pool.get<attr::reserved_mem_current>(), 0U);
}

// ---- typed attributes ------------------------------------------------------------------------

TEST_F(MemPoolTest, ReleaseThresholdRoundTripsThroughTypedAccessors)
{
  auto pool = mem_pool::create(pool_properties{});
  for (std::uint64_t const value :
       {std::uint64_t{0}, std::uint64_t{12345}, 3 * std::uint64_t{mib}, max_threshold}) {
    pool.set<attr::release_threshold>(value);
    EXPECT_EQ(pool.get<attr::release_threshold>(), value);
    EXPECT_EQ(driver_threshold(pool.handle()), value);
  }
}

TEST_F(MemPoolTest, ReuseFlagsRoundTripThroughTypedAccessors)
{
  auto pool = mem_pool::create(pool_properties{});
  for (bool const value : {false, true, false}) {
    pool.set<attr::reuse_follow_event_dependencies>(value);
    pool.set<attr::reuse_allow_opportunistic>(value);
    pool.set<attr::reuse_allow_internal_dependencies>(value);
    EXPECT_EQ(pool.get<attr::reuse_follow_event_dependencies>(), value);
    EXPECT_EQ(pool.get<attr::reuse_allow_opportunistic>(), value);
    EXPECT_EQ(pool.get<attr::reuse_allow_internal_dependencies>(), value);
  }
}

TEST_F(MemPoolTest, ReuseFlagsReadTheDriversValue)
{
  auto pool = mem_pool::create(pool_properties{});
  int on    = 1;
  int off   = 0;
  ASSERT_EQ(cudaSuccess,
            cudaMemPoolSetAttribute(pool.handle(), cudaMemPoolReuseAllowOpportunistic, &on));
  EXPECT_TRUE(pool.get<attr::reuse_allow_opportunistic>());
  ASSERT_EQ(cudaSuccess,
            cudaMemPoolSetAttribute(pool.handle(), cudaMemPoolReuseAllowOpportunistic, &off));
  EXPECT_FALSE(pool.get<attr::reuse_allow_opportunistic>());
}

TEST_F(MemPoolTest, ResetPeaksBringsHighWaterMarksDownToCurrent)
{
  auto pool = mem_pool::create(pool_properties{});
  allocate_free_sync(pool, 4 * mib);
  ASSERT_GE(pool.get<attr::used_mem_high>(), 4 * mib);
  pool.reset_peaks();
  EXPECT_EQ(pool.get<attr::used_mem_high>(), pool.get<attr::used_mem_current>());
  EXPECT_EQ(pool.get<attr::reserved_mem_high>(), pool.get<attr::reserved_mem_current>());
}

TEST_F(MemPoolTest, TrimToZeroAfterFreeAndSyncReleasesReservedMemory)
{
  auto pool = mem_pool::create(pool_properties{});  // threshold max: nothing released on sync
  allocate_free_sync(pool, 64 * mib);
  auto const before = pool.get<attr::reserved_mem_current>();
  ASSERT_GE(before, 64 * mib) << "the pool should keep the freed 64 MiB";
  pool.trim_to(0);
  auto const after = pool.get<attr::reserved_mem_current>();
  EXPECT_LT(after, before) << "trim_to(0) released nothing";
}

TEST_F(MemPoolTest, TrimToKeepsAtLeastTheGivenBytes)
{
  auto pool = mem_pool::create(pool_properties{});
  allocate_free_sync(pool, 64 * mib);
  pool.trim_to(16 * mib);
  EXPECT_GE(pool.get<attr::reserved_mem_current>(), 16 * mib);
}

// ---- CUDA 13.2 attributes --------------------------------------------------------------------

TEST_F(MemPoolTest, OwnedPoolAnswersCuda132AttributesFromItsCreationProperties)
{
  // On a driver older than 13.2 asyncmr answers these itself; on a newer one the driver does.
  // The answers must be the same.
  pool_properties props{};
  props.max_size  = 64 * mib;
  auto const pool = mem_pool::create(props);
  EXPECT_EQ(pool.get<attr::max_pool_size>(), 64 * mib);
  EXPECT_EQ(pool.get<attr::location_type>(), static_cast<int>(cudaMemLocationTypeDevice));
  EXPECT_EQ(pool.get<attr::location_id>(), 0);
  EXPECT_EQ(pool.get<attr::allocation_type>(), static_cast<int>(cudaMemAllocationTypePinned));
  EXPECT_EQ(pool.get<attr::export_handle_types>(), 0);
  EXPECT_FALSE(pool.get<attr::hw_decompress_enabled>());
}

TEST_F(MemPoolTest, DefaultPoolAnswersItsLocationAndAllocationType)
{
  auto const pool = mem_pool::default_pool(location::device(0), allocation_type::device);
  EXPECT_EQ(pool.get<attr::location_type>(), static_cast<int>(cudaMemLocationTypeDevice));
  EXPECT_EQ(pool.get<attr::location_id>(), 0);
  EXPECT_EQ(pool.get<attr::allocation_type>(), static_cast<int>(cudaMemAllocationTypePinned));
}

TEST_F(MemPoolTest, AdoptedHandleWithLocationAnswersItsLocation)
{
  auto const owner = mem_pool::create(pool_properties{});
  auto const view =
    mem_pool::from_handle(owner.handle(), false, location::device(0), allocation_type::device);
  EXPECT_FALSE(view.owned());
  EXPECT_EQ(view.get<attr::location_type>(), static_cast<int>(cudaMemLocationTypeDevice));
  EXPECT_EQ(view.type(), allocation_type::device);
}

namespace {
// A pool handle asyncmr did not obtain itself (the device's default pool, asked for raw), so
// asyncmr knows nothing about it. Handles of pools asyncmr owns share the owner's state.
cudaMemPool_t foreign_device_pool()
{
  cudaMemPool_t handle = nullptr;
  EXPECT_EQ(cudaDeviceGetDefaultMemPool(&handle, 0), cudaSuccess);
  return handle;
}
}  // namespace

TEST_F(MemPoolTest, AdoptedHandleWithoutLocationThrowsUnsupportedOnDriversBefore13_2)
{
  int const driver = versions().driver;
  if (driver >= 13020) {
    GTEST_SKIP() << "not applicable: driver " << version_string(driver)
                 << " answers CUDA 13.2 attributes itself";
  }
  auto const view = mem_pool::from_handle(foreign_device_pool());
  int newer_rows   = 0;
  for (auto const& row : attribute_table) {
    if (row.min_driver <= driver) { continue; }
    ++newer_rows;
    EXPECT_THROW(static_cast<void>(view.get_attribute(row.attribute)), unsupported_error)
      << row.name;
  }
  EXPECT_GT(newer_rows, 0);
  EXPECT_FALSE(view.location().has_value());
  EXPECT_FALSE(view.type().has_value());
}

TEST_F(MemPoolTest, AdoptedHandleWithoutLocationCannotMakeCurrentOnDriversBefore13_2)
{
  int const driver = versions().driver;
  if (driver >= 13020) {
    GTEST_SKIP() << "not applicable: driver " << version_string(driver)
                 << " reports a pool's location itself";
  }
  auto const view = mem_pool::from_handle(foreign_device_pool());
  EXPECT_THROW(static_cast<void>(view.make_current()), unsupported_error);
}

TEST_F(MemPoolTest, AdoptedHandleWithoutLocationAsksDrivers13_2AndLater)
{
  int const driver = versions().driver;
  if (driver < 13020) {
    GTEST_SKIP() << "not applicable: driver " << version_string(driver)
                 << " cannot report a pool's location";
  }
  auto const view = mem_pool::from_handle(foreign_device_pool());
  EXPECT_EQ(view.location(), location::device(0));
  EXPECT_EQ(view.type(), allocation_type::device);
}

// ---- routing ---------------------------------------------------------------------------------

TEST_F(MemPoolTest, MakeCurrentReturnsThePreviousPoolAndRoutesMemGetMemPool)
{
  auto const loc    = location::device(0);
  auto const before = driver_current_pool(loc, allocation_type::device);
  auto const pool   = mem_pool::create(pool_properties{});

  auto const previous = pool.make_current();
  EXPECT_EQ(previous.handle(), before);
  EXPECT_FALSE(previous.owned());
  EXPECT_EQ(driver_current_pool(loc, allocation_type::device), pool.handle());
  EXPECT_EQ(mem_pool::current(loc, allocation_type::device), pool);

  auto const replaced = previous.make_current();
  EXPECT_EQ(replaced.handle(), pool.handle());
  EXPECT_EQ(driver_current_pool(loc, allocation_type::device), before);
}

TEST_F(MemPoolTest, MakeCurrentRoutesCudaMallocAsync)
{
  auto const pool     = mem_pool::create(pool_properties{});
  auto const previous = pool.make_current();
  void* p             = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocAsync(&p, 2 * mib, stream()));
  EXPECT_GE(pool.get<attr::used_mem_current>(), 2 * mib);
  EXPECT_EQ(cudaSuccess, cudaFreeAsync(p, stream()));
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream()));
  static_cast<void>(previous.make_current());
}

TEST_F(MemPoolTest, ClosingTheCurrentOwnedPoolRoutesItsLocationBackToTheDefault)
{
  auto const loc = location::device(0);
  auto pool      = mem_pool::create(pool_properties{});
  static_cast<void>(pool.make_current());
  ASSERT_EQ(driver_current_pool(loc, allocation_type::device), pool.handle());
  pool.close();
  EXPECT_EQ(driver_current_pool(loc, allocation_type::device),
            driver_default_pool(loc, allocation_type::device));
}

// ---- races between close and the other calls -------------------------------------------------

namespace {
// Runs `a` and `b` on two threads released together, and waits for both.
template <class A, class B>
void at_once(A&& a, B&& b)
{
  std::atomic<int> ready{0};
  auto start = [&ready] {
    ready.fetch_add(1);
    while (ready.load() < 2) {}
  };
  std::thread ta{[&] { start(); a(); }};
  std::thread tb{[&] { start(); b(); }};
  ta.join();
  tb.join();
}
}  // namespace

TEST_F(MemPoolTest, MakeCurrentRacingCloseNeverLeavesTheClosedPoolCurrent)
{
  // make_current read the handle, then asked several questions, then set it current; a close
  // in between found the pool not current yet (no reroute) and destroyed it: every later
  // cudaMallocAsync of the process would use a destroyed pool.
  auto const loc = location::device(0);
  auto const t   = allocation_type::device;
  for (int round = 0; round < 300; ++round) {
    auto pool             = mem_pool::create(pool_properties{});
    cudaMemPool_t const h = pool.handle();
    mem_pool const other  = pool;  // the same pool, through another copy
    at_once(
      [&] {
        try {
          static_cast<void>(other.make_current());
        } catch (pool_closed_error const&) {  // closed first: refused, as it must be
        }
      },
      [&] { pool.close(); });
    ASSERT_NE(driver_current_pool(loc, t), h) << "round " << round;
    static_cast<void>(mem_pool::default_pool(loc, t).make_current());
  }
}

TEST_F(MemPoolTest, AdoptingOneHandleAsOwnedTwiceAtOnceMakesOneOwner)
{
  // Two adoptions each registered a state of their own: closing one left the other open on a
  // destroyed pool, and both would destroy it.
  for (int round = 0; round < 100; ++round) {
    cudaMemPoolProps props{};
    props.allocType     = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id   = 0;
    cudaMemPool_t h     = nullptr;
    ASSERT_EQ(cudaSuccess, cudaMemPoolCreate(&h, &props));
    std::optional<mem_pool> a, b;
    at_once([&] { a.emplace(mem_pool::from_handle(h, true)); },
            [&] { b.emplace(mem_pool::from_handle(h, true)); });
    a->close();
    ASSERT_TRUE(b->closed()) << "round " << round << ": two owners of one pool";
  }
}

namespace {
std::atomic<std::thread::id> paused_thread{};
std::atomic<int> pause_state{0};  // 1: the paused thread holds a handle; 2: it may go on

void pause_while_holding_a_handle() noexcept
{
  if (std::this_thread::get_id() != paused_thread.load()) { return; }
  pause_state.store(1);
  while (pause_state.load() != 2) { std::this_thread::yield(); }
}
}  // namespace

TEST_F(MemPoolTest, APoolClosedDuringAnAttributeReadIsParkedUntilTheReadEnds)
{
  // Only allocations were counted in flight: a close between another call's reading of the
  // handle and its driver call destroyed the pool under that call.
  auto const before = testing::parked_pools();
  auto pool         = mem_pool::create(pool_properties{});
  mem_pool const reader = pool;
  pause_state.store(0);
  testing::set_pool_use_hook(&pause_while_holding_a_handle);  // pauses only the reader's thread
  std::uint64_t used = 1;
  std::thread t{[&] {
    paused_thread.store(std::this_thread::get_id());
    used = reader.get<attr::used_mem_current>();
  }};
  while (pause_state.load() != 1) { std::this_thread::yield(); }
  pool.close();
  EXPECT_EQ(testing::parked_pools(), before + 1) << "destroyed while a call held its handle";
  pause_state.store(2);
  t.join();
  testing::set_pool_use_hook(nullptr);
  paused_thread.store(std::thread::id{});
  EXPECT_EQ(used, 0U);
  EXPECT_EQ(testing::parked_pools(), before) << "not destroyed once the call ended";
  EXPECT_THROW(static_cast<void>(reader.get<attr::used_mem_current>()), pool_closed_error);
}

// ---- access ----------------------------------------------------------------------------------

TEST_F(MemPoolTest, CreatedHostPoolStartsWithoutDeviceAccessUntilGranted)
{
  ASYNCMR_SKIP_IF(host_pools_unavailable());
  pool_properties props{};
  props.type  = allocation_type::pinned;
  props.location = location::host();
  auto pool   = mem_pool::create(props);
  EXPECT_EQ(pool.access(0), access_mode::none);
  pool.set_access({0}, access_mode::read_write);
  EXPECT_EQ(pool.access(0), access_mode::read_write);
}

// The driver answers a device pool's own device given "none" with cudaErrorInvalidDevice and
// takes the last of a device named twice (docs/DRIVER_FACTS.md, "Access"): both are refused
// first, and the access stays read-write.
TEST_F(MemPoolTest, OwnDeviceKeepsReadWriteAccessAndADeviceNamedTwiceIsRefused)
{
  auto const pool = mem_pool::create(pool_properties{});
  EXPECT_THROW(pool.set_access({0}, access_mode::none), std::invalid_argument);
  EXPECT_THROW(pool.set_access({0}, access_mode::read), std::invalid_argument);
  EXPECT_THROW(pool.set_access({0, 0}, access_mode::read_write), std::invalid_argument);
  EXPECT_EQ(pool.access(0), access_mode::read_write);
  EXPECT_NO_THROW(pool.set_access({0}, access_mode::read_write));
  try {
    pool.set_access({0}, access_mode::none);
    ADD_FAILURE() << "not refused";
  } catch (std::invalid_argument const& e) {
    EXPECT_NE(std::string{e.what()}.find("device 0 holds this pool's memory"), std::string::npos)
      << e.what();
  }
}

// A managed pool's own device reads "none" until granted, and a kernel on that device writes
// its memory all the same: its requests are the driver's to judge, a device named twice aside.
TEST_F(MemPoolTest, ManagedPoolServesItsDeviceWhateverItsAccessReads)
{
  pool_properties props{};
  props.type      = allocation_type::managed;
  auto const pool = mem_pool::create(props);
  EXPECT_EQ(pool.access(0), access_mode::none);
  EXPECT_THROW(pool.set_access({0, 0}, access_mode::read_write), std::invalid_argument);
  std::size_t const count = 1024;
  auto* words = static_cast<std::uint32_t*>(pool.allocate_async(count * 4, cudaStreamPerThread));
  ASSERT_EQ(cudaSuccess, launch_fill(words, count, test_seed, cudaStreamPerThread));
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(cudaStreamPerThread));
  EXPECT_TRUE(holds_pattern(words, count * 4));
  EXPECT_EQ(cudaSuccess, pool.deallocate_async(words, cudaStreamPerThread));
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(cudaStreamPerThread));
}

// Driver 580 refuses read-only access on every pool (cudaErrorNotSupported); a driver that grants
// it must then report it.
TEST_F(MemPoolTest, ReadOnlyAccessIsGrantedOrRefusedAsUnsupportedLeavingNoError)
{
  ASYNCMR_SKIP_IF(host_pools_unavailable());
  pool_properties props{};
  props.type      = allocation_type::pinned;
  props.location  = location::host();
  auto const pool = mem_pool::create(props);
  try {
    pool.set_access({0}, access_mode::read);
    EXPECT_EQ(pool.access(0), access_mode::read);
  } catch (unsupported_error const& e) {
    EXPECT_NE(std::string{e.what()}.find("read-only access"), std::string::npos) << e.what();
    EXPECT_EQ(pool.access(0), access_mode::none);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the refusal was left in the last-error slot";
}

TEST_F(MemPoolTest, AccessOfAnUnknownDeviceThrowsOutOfRange)
{
  auto const pool = mem_pool::create(pool_properties{});
  EXPECT_THROW(static_cast<void>(pool.access(device_count())), std::out_of_range);
  EXPECT_THROW(static_cast<void>(pool.access(-1)), std::out_of_range);
}

}  // namespace
}  // namespace asyncmr::test

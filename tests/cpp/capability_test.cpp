/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The one support decision (capability.hpp), checked for builds, drivers and devices this
// machine does not have: it is a pure function of its platform argument, so no GPU is needed.

#include <asyncmr/capability.hpp>

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace asyncmr::test {
namespace {

constexpr int cuda12_build = 12090;
constexpr int cuda13_build = 13000;

platform make_platform(int driver, int build)
{
  platform p;
  p.driver = driver;
  p.build  = build;
  p.device = device_facts{.memory_pools              = true,
                          .concurrent_managed_access = true,
                          .host_memory_pools         = true,
                          .host_numa_memory_pools    = true};
  return p;
}

std::optional<pool_path> path_of(platform const& p,
                                 location where,
                                 allocation_type type,
                                 pool_source source)
{
  return decide_pool_support(p, where, type, source).path;
}

TEST(CapabilityTest, Cuda13BuildReachesEveryPoolThroughItsRuntime)
{
  auto const p = make_platform(13000, cuda13_build);
  for (auto source : {pool_source::default_pool, pool_source::current, pool_source::new_pool}) {
    EXPECT_EQ(path_of(p, location::device(0), allocation_type::device, source), pool_path::runtime);
    EXPECT_EQ(path_of(p, location::host(), allocation_type::pinned, source), pool_path::runtime);
    EXPECT_EQ(path_of(p, location::device(0), allocation_type::managed, source),
              pool_path::runtime);
  }
  EXPECT_EQ(decide_routing_support(p, allocation_type::pinned).path, pool_path::runtime);
}

TEST(CapabilityTest, Cuda12BuildOnACuda13DriverUsesTheDriverEntryPoints)
{
  auto const p = make_platform(13000, cuda12_build);
  for (auto source : {pool_source::default_pool, pool_source::current, pool_source::new_pool}) {
    EXPECT_EQ(path_of(p, location::device(0), allocation_type::managed, source),
              pool_path::driver_entry_point);
  }
  EXPECT_EQ(path_of(p, location::host(), allocation_type::pinned, pool_source::default_pool),
            pool_path::driver_entry_point);
  EXPECT_EQ(path_of(p, location::host(), allocation_type::pinned, pool_source::current),
            pool_path::driver_entry_point);
  EXPECT_EQ(path_of(p, location::host(), allocation_type::pinned, pool_source::new_pool),
            pool_path::runtime);
  EXPECT_EQ(path_of(p, location::device(0), allocation_type::device, pool_source::current),
            pool_path::runtime);
  EXPECT_EQ(decide_routing_support(p, allocation_type::managed).path,
            pool_path::driver_entry_point);
}

TEST(CapabilityTest, Cuda12BuildOnACuda12DriverStandsInForTheDefaultHostPool)
{
  auto const p = make_platform(12090, cuda12_build);
  EXPECT_EQ(path_of(p, location::host(), allocation_type::pinned, pool_source::default_pool),
            pool_path::stand_in);
  EXPECT_EQ(path_of(p, location::host_numa(0), allocation_type::pinned, pool_source::default_pool),
            pool_path::stand_in);
  EXPECT_EQ(path_of(p, location::host(), allocation_type::pinned, pool_source::new_pool),
            pool_path::runtime);
  auto const current =
    decide_pool_support(p, location::host(), allocation_type::pinned, pool_source::current);
  EXPECT_FALSE(current);
  EXPECT_NE(current.reason.find("CUDA 13 driver feature"), std::string::npos) << current.reason;
  EXPECT_NE(current.reason.find("pool='new'"), std::string::npos) << current.reason;
  auto const routing = decide_routing_support(p, allocation_type::pinned);
  EXPECT_FALSE(routing);
  EXPECT_EQ(decide_routing_support(p, allocation_type::device).path, pool_path::runtime);
}

TEST(CapabilityTest, ManagedPoolsOnACuda12DriverNameTheDriverNeeded)
{
  for (int const build : {cuda12_build, cuda13_build}) {
    auto const p = make_platform(12080, build);
    auto const s = decide_pool_support(p, location::device(0), allocation_type::managed,
                                       pool_source::default_pool);
    EXPECT_FALSE(s);
    EXPECT_NE(s.reason.find("CUDA 13 driver"), std::string::npos) << s.reason;
    EXPECT_NE(s.reason.find("12.8"), std::string::npos) << s.reason;
  }
}

TEST(CapabilityTest, HostPoolsNeedADriverOf12_6)
{
  auto const p = make_platform(12050, cuda12_build);
  for (auto source : {pool_source::default_pool, pool_source::current, pool_source::new_pool}) {
    auto const s = decide_pool_support(p, location::host(), allocation_type::pinned, source);
    EXPECT_FALSE(s);
    EXPECT_NE(s.reason.find("12.6"), std::string::npos) << s.reason;
    EXPECT_NE(s.reason.find("12.5"), std::string::npos) << s.reason;
  }
  // Device pools are older than that.
  EXPECT_EQ(path_of(p, location::device(0), allocation_type::device, pool_source::default_pool),
            pool_path::runtime);
}

TEST(CapabilityTest, DeviceFactsDecide)
{
  auto p                      = make_platform(13000, cuda13_build);
  p.device.host_memory_pools  = false;
  EXPECT_FALSE(decide_pool_support(p, location::host(), allocation_type::pinned,
                                   pool_source::default_pool));
  EXPECT_TRUE(decide_pool_support(p, location::host_numa(0), allocation_type::pinned,
                                  pool_source::default_pool));
  p.device.concurrent_managed_access = false;
  auto const managed = decide_pool_support(p, location::device(0), allocation_type::managed,
                                           pool_source::new_pool);
  EXPECT_FALSE(managed);
  EXPECT_NE(managed.reason.find("concurrent managed access"), std::string::npos);
  p.device.memory_pools = false;
  EXPECT_FALSE(decide_pool_support(p, location::device(0), allocation_type::device,
                                   pool_source::default_pool));
}

TEST(CapabilityTest, EveryAnswerIsAPathOrAReason)
{
  for (int const build : {cuda12_build, cuda13_build}) {
    for (int const driver : {12000, 12060, 12090, 13000, 13020}) {
      auto const p = make_platform(driver, build);
      for (auto where : {location::device(0), location::host(), location::host_numa(0),
                         location::none()}) {
        for (auto type :
             {allocation_type::device, allocation_type::pinned, allocation_type::managed}) {
          for (auto source :
               {pool_source::default_pool, pool_source::current, pool_source::new_pool}) {
            auto const s = decide_pool_support(p, where, type, source);
            EXPECT_NE(s.path.has_value(), !s.reason.empty())
              << "build " << build << " driver " << driver << " " << where.to_string();
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace asyncmr::test

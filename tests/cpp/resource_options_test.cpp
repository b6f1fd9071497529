/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The resources' options (resource_options.hpp): one struct for the three resources, and every
// field checked by check_fields before anything is asked of CUDA, so none of these needs a GPU.

#include <asyncmr/asyncmr.hpp>

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace asyncmr::test {
namespace {

// A field a resource does not use is refused by name before anything else happens: these need
// no GPU (nothing is asked of CUDA before the options are checked).
TEST(ResourceOptions, AFieldTheResourceDoesNotUseIsRefusedByName)
{
  auto refused = [](auto make, char const* field) {
    try {
      make();
    } catch (std::invalid_argument const& e) {
      return std::string{e.what()}.find(field) != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused([] { async_pinned_memory_resource{{.device = 0}}; }, "takes no device"));
  EXPECT_TRUE(refused([] { async_pinned_memory_resource{{.location = location::host()}}; },
                      "takes no location"));
  EXPECT_TRUE(refused([] { async_device_memory_resource{{.numa_node = 0}}; }, "takes no numa_node"));
  EXPECT_TRUE(refused([] { async_device_memory_resource{{.accessible_from = std::vector<int>{0}}}; },
                      "takes no accessible_from"));
  EXPECT_TRUE(refused([] { async_managed_memory_resource{{.numa_node = 1}}; }, "takes no numa_node"));
  EXPECT_TRUE(refused([] { async_device_memory_resource{{.cache = 100}}; }, "cache must be 0"));
  EXPECT_TRUE(refused([] { async_pinned_memory_resource{{.prefetch = location::host()}}; },
                      "takes no prefetch"));
  EXPECT_TRUE(refused([] { async_device_memory_resource{{.prefetch = location::device(0)}}; },
                      "takes no prefetch"));
  EXPECT_TRUE(refused([] { async_managed_memory_resource{{.prefetch = location::none()}}; },
                      "prefetch must be a device or the host"));
  EXPECT_TRUE(refused([] { async_pinned_memory_resource{{.discard = true}}; }, "takes no discard"));
  EXPECT_TRUE(refused([] { async_device_memory_resource{{.discard = true}}; }, "takes no discard"));
  EXPECT_TRUE(refused([] { async_managed_memory_resource{{.discard = true}}; },
                      "discard needs a prefetch target"));
}

// The sign of every ordinal is C++'s rule alone (Python checks only that a value fits an int):
// refused by name, before the driver is looked for, so no GPU is needed.
TEST(ResourceOptions, NegativeOrdinalsAreRefusedByNameBeforeTheDriver)
{
  auto const says = [](auto&& make) -> std::string {
    try {
      make();
    } catch (std::invalid_argument const& e) {
      return e.what();
    } catch (...) {
      return "another exception";
    }
    return "not refused";
  };
  EXPECT_EQ(says([] { async_managed_memory_resource{{.device = -1}}; }),
            "asyncmr: device must be in [0, 2**31), got -1");
  EXPECT_EQ(says([] { async_pinned_memory_resource{{.accessible_from = std::vector<int>{0, -2}}}; }),
            "asyncmr: accessible_from device must be in [0, 2**31), got -2");
  EXPECT_EQ(says([] { async_managed_memory_resource{{.prefetch = location::device(-1)}}; }),
            "asyncmr: prefetch must be in [0, 2**31), got -1");
  EXPECT_EQ(says([] { async_managed_memory_resource{{.prefetch = location::none()}}; }),
            "asyncmr: prefetch must be a device or the host, got none");
  EXPECT_EQ(says([] { async_pinned_memory_resource{{.numa_node = -1}}; }),
            "asyncmr: numa_node: NUMA node must be in [0, 2**31), got -1");
  std::vector<memory_range> const none;
  EXPECT_EQ(says([&] { prefetch(none, location::device(-3), cuda::stream_ref{cudaStreamPerThread}); }),
            "asyncmr: to must be in [0, 2**31), got -3");
  EXPECT_EQ(says([&] { advise(none, memory_advice::set_read_mostly, location::none()); }),
            "asyncmr: to must be a device or the host, got none");
  EXPECT_EQ(says([] { static_cast<void>(mem_pool::from_handle(nullptr)); }),
            "asyncmr: pool handle must be a non-zero 64-bit address, got 0");
}

TEST(ResourceOptions, TheThreeOptionNamesAreOneStruct)
{
  static_assert(std::is_same_v<managed_resource_options, resource_options>);
  static_assert(std::is_same_v<pinned_resource_options, resource_options>);
  static_assert(std::is_same_v<device_resource_options, resource_options>);
  // One field order: every resource's designated initializers read alike.
  [[maybe_unused]] resource_options const o{.device            = 0,
                                            .source            = pool_source::new_pool,
                                            .location          = location::device(0),
                                            .numa_node         = 0,
                                            .release_threshold = 0,
                                            .accessible_from   = std::vector<int>{0},
                                            .cache             = 0,
                                            .prefetch          = location::host(),
                                            .discard           = true};
  SUCCEED();
}

}  // namespace
}  // namespace asyncmr::test

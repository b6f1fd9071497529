/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The C++ example of README.md, kept compiling and working here.

#include "test_support.hpp"

#include <asyncmr/asyncmr.hpp>

#include <rmm/cuda_stream_view.hpp>
#include <rmm/device_buffer.hpp>

namespace asyncmr::test {
namespace {

using ReadmeExampleTest = GpuTest;

TEST_F(ReadmeExampleTest, CppExampleRuns)
{
  // --- as in README.md ---
  asyncmr::async_pinned_memory_resource pinned{};  // default host pool
  asyncmr::async_managed_memory_resource managed{{.source = asyncmr::pool_source::new_pool}};
  rmm::device_async_resource_ref ref{managed};
  rmm::device_buffer buf{1 << 20, rmm::cuda_stream_view{}, ref};
  managed.pool().set<asyncmr::pool_attribute::release_threshold>(0);
  managed.pool().trim_to(64 << 20);  // release unused memory down to 64 MiB reserved
  // ---
  EXPECT_NE(buf.data(), nullptr);
  EXPECT_EQ(managed.pool().get<pool_attribute::release_threshold>(), 0U);
  EXPECT_EQ(pinned.pool().access(0), access_mode::read_write);
}

}  // namespace
}  // namespace asyncmr::test

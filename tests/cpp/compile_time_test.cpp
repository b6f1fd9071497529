/*
 * SPDX-License-Identifier: Apache-2.0
 */

// Contracts the compiler checks on every build, GPU or not: which memory each resource hands
// out (its properties), that RMM can hold each one by reference, and how the attribute table
// types its values. A violation fails the build, not a test run.

#include <asyncmr/asyncmr.hpp>

#include <rmm/resource_ref.hpp>

#include <gtest/gtest.h>

#include <cuda/memory_resource>

#include <cstdint>
#include <set>
#include <string_view>
#include <type_traits>

namespace {

using asyncmr::async_device_memory_resource;
using asyncmr::async_managed_memory_resource;
using asyncmr::async_pinned_memory_resource;
using cuda::mr::device_accessible;
using cuda::mr::host_accessible;

// ---- properties ----------------------------------------------------------------------------
static_assert(cuda::mr::resource_with<async_managed_memory_resource, device_accessible>);
static_assert(cuda::mr::resource_with<async_pinned_memory_resource, device_accessible>);
static_assert(cuda::mr::resource_with<async_device_memory_resource, device_accessible>);

static_assert(cuda::mr::resource_with<async_managed_memory_resource, host_accessible>);
static_assert(cuda::mr::resource_with<async_pinned_memory_resource, host_accessible>);
static_assert(!cuda::mr::resource_with<async_device_memory_resource, host_accessible>);

// ---- RMM holds each resource by reference --------------------------------------------------
static_assert(
  std::is_constructible_v<rmm::device_async_resource_ref, async_managed_memory_resource&>);
static_assert(
  std::is_constructible_v<rmm::device_async_resource_ref, async_pinned_memory_resource&>);
static_assert(
  std::is_constructible_v<rmm::device_async_resource_ref, async_device_memory_resource&>);

static_assert(
  std::is_constructible_v<rmm::host_device_async_resource_ref, async_managed_memory_resource&>);
static_assert(
  std::is_constructible_v<rmm::host_device_async_resource_ref, async_pinned_memory_resource&>);
static_assert(
  !std::is_constructible_v<rmm::host_device_async_resource_ref, async_device_memory_resource&>);
static_assert(
  !std::is_constructible_v<rmm::host_async_resource_ref, async_device_memory_resource&>);

// Resources are values: copies share the pool (RMM and CCCL copy them into `any_resource`).
static_assert(std::is_copy_constructible_v<async_managed_memory_resource>);
static_assert(std::is_copy_constructible_v<async_pinned_memory_resource>);
static_assert(std::is_copy_constructible_v<async_device_memory_resource>);

// ---- value types the attribute table gives the typed accessors -----------------------------
using asyncmr::attribute_value_t;
using asyncmr::pool_attribute;
static_assert(std::is_same_v<attribute_value_t<pool_attribute::release_threshold>, std::uint64_t>);
static_assert(
  std::is_same_v<attribute_value_t<pool_attribute::reserved_mem_current>, std::uint64_t>);
static_assert(std::is_same_v<attribute_value_t<pool_attribute::used_mem_high>, std::uint64_t>);
static_assert(
  std::is_same_v<attribute_value_t<pool_attribute::reuse_follow_event_dependencies>, bool>);
static_assert(std::is_same_v<attribute_value_t<pool_attribute::reuse_allow_opportunistic>, bool>);
static_assert(
  std::is_same_v<attribute_value_t<pool_attribute::reuse_allow_internal_dependencies>, bool>);
static_assert(std::is_same_v<attribute_value_t<pool_attribute::location_type>, int>);
static_assert(std::is_same_v<attribute_value_t<pool_attribute::max_pool_size>, std::uint64_t>);

// The table's rows are the driver's: spot-check the values CUDA 13.0 headers name.
static_assert(asyncmr::info(pool_attribute::release_threshold).cuda_value ==
              cudaMemPoolAttrReleaseThreshold);
static_assert(asyncmr::info(pool_attribute::reuse_follow_event_dependencies).cuda_value ==
              cudaMemPoolReuseFollowEventDependencies);
static_assert(asyncmr::info(pool_attribute::reuse_allow_opportunistic).cuda_value ==
              cudaMemPoolReuseAllowOpportunistic);
static_assert(asyncmr::info(pool_attribute::reuse_allow_internal_dependencies).cuda_value ==
              cudaMemPoolReuseAllowInternalDependencies);
static_assert(asyncmr::info(pool_attribute::reserved_mem_current).cuda_value ==
              cudaMemPoolAttrReservedMemCurrent);
static_assert(asyncmr::info(pool_attribute::reserved_mem_high).cuda_value ==
              cudaMemPoolAttrReservedMemHigh);
static_assert(asyncmr::info(pool_attribute::used_mem_current).cuda_value ==
              cudaMemPoolAttrUsedMemCurrent);
static_assert(asyncmr::info(pool_attribute::used_mem_high).cuda_value ==
              cudaMemPoolAttrUsedMemHigh);

// What the static_asserts above cannot say, checked when the tests run: the table is dense
// (row i describes enumerator i, so the X-macro's order is the enum's) and names each
// attribute once, and every settable row is a bytes or boolean attribute the driver can set.
TEST(CompileTimeContracts, AttributeTableRowsAreTheEnumInOrder)
{
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < asyncmr::attribute_table.size(); ++i) {
    auto const& row = asyncmr::attribute_table[i];
    EXPECT_EQ(static_cast<std::size_t>(row.attribute), i) << row.name;
    EXPECT_TRUE(names.insert(row.name).second) << row.name << " is in the table twice";
    EXPECT_EQ(&asyncmr::info(row.attribute), &row);
    if (row.access == asyncmr::attribute_access::read_write) {
      EXPECT_NE(row.kind, asyncmr::attribute_kind::integer) << row.name;
    }
  }
  EXPECT_EQ(names.size(), 14u);
}

}  // namespace

/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The attribute table, as data (no GPU needed), and the write rules mem_pool derives from it
// (on an owned device pool, so no shared pool is touched).

#include "test_support.hpp"

#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>

namespace asyncmr::test {
namespace {

// ---- the table as data -----------------------------------------------------------------------

TEST(AttributeTable, NamesAreUnique)
{
  std::set<std::string_view> names;
  for (auto const& row : attribute_table) {
    EXPECT_TRUE(names.insert(row.name).second) << "duplicate name " << row.name;
  }
}

TEST(AttributeTable, CudaValueIsEnumPositionPlusOne)
{
  for (std::size_t i = 0; i < attribute_table.size(); ++i) {
    EXPECT_EQ(attribute_table[i].cuda_value, static_cast<int>(i) + 1) << attribute_table[i].name;
  }
}

TEST(AttributeTable, RowsAreInEnumOrderAndInfoFindsThem)
{
  for (std::size_t i = 0; i < attribute_table.size(); ++i) {
    auto const& row = attribute_table[i];
    EXPECT_EQ(static_cast<std::size_t>(row.attribute), i) << row.name;
    EXPECT_EQ(&info(row.attribute), &row) << row.name;
  }
}

TEST(AttributeTable, WatermarksAreResetOnlyAndCurrentsReadOnly)
{
  EXPECT_EQ(info(pool_attribute::reserved_mem_high).access, attribute_access::reset_only);
  EXPECT_EQ(info(pool_attribute::used_mem_high).access, attribute_access::reset_only);
  EXPECT_EQ(info(pool_attribute::reserved_mem_current).access, attribute_access::read_only);
  EXPECT_EQ(info(pool_attribute::used_mem_current).access, attribute_access::read_only);
  EXPECT_EQ(info(pool_attribute::release_threshold).access, attribute_access::read_write);
}

TEST(AttributeTable, Cuda132RowsNeedDriver13020)
{
  for (auto const& row : attribute_table) {
    if (row.cuda_value >= 9) {
      EXPECT_EQ(row.min_driver, 13020) << row.name;
      EXPECT_EQ(row.access, attribute_access::read_only) << row.name;
    } else {
      EXPECT_LT(row.min_driver, 13000) << row.name;
    }
  }
}

// ---- write rules on a live pool ----------------------------------------------------------

class AttributeRulesTest : public GpuTest {
 protected:
  void SetUp() override
  {
    GpuTest::SetUp();
    if (IsSkipped()) { return; }
    pool_.emplace(mem_pool::create(pool_properties{}));  // device memory on device 0, owned
  }
  void TearDown() override
  {
    pool_.reset();
    GpuTest::TearDown();
  }
  [[nodiscard]] mem_pool& pool() { return *pool_; }

  /// @brief Allocates and frees `bytes` on the pool so its high-water marks are above zero.
  void raise_watermarks(std::size_t bytes)
  {
    void* p = nullptr;
    ASSERT_EQ(cudaSuccess, cudaMallocFromPoolAsync(&p, bytes, pool().handle(), stream()));
    ASSERT_EQ(cudaSuccess, cudaFreeAsync(p, stream()));
    ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream()));
  }

 private:
  std::optional<mem_pool> pool_{};
};

TEST_F(AttributeRulesTest, ReadOnlyRowsThrowInvalidArgumentOnSet)
{
  for (auto const& row : attribute_table) {
    if (row.access != attribute_access::read_only) { continue; }
    EXPECT_THROW(pool().set_attribute(row.attribute, 0), std::invalid_argument) << row.name;
    EXPECT_THROW(pool().set_attribute(row.attribute, 1), std::invalid_argument) << row.name;
  }
}

TEST_F(AttributeRulesTest, ResetOnlyRowsAcceptZero)
{
  raise_watermarks(2 * mib);
  for (auto const& row : attribute_table) {
    if (row.access != attribute_access::reset_only) { continue; }
    EXPECT_NO_THROW(pool().set_attribute(row.attribute, 0)) << row.name;
  }
}

TEST_F(AttributeRulesTest, ResetOnlyRowsThrowOnNonZeroAndKeepTheirValue)
{
  raise_watermarks(2 * mib);
  for (auto const& row : attribute_table) {
    if (row.access != attribute_access::reset_only) { continue; }
    auto const before = pool().get_attribute(row.attribute);
    ASSERT_GE(before, 2 * mib) << row.name << ": the allocation should have raised the mark";
    EXPECT_THROW(pool().set_attribute(row.attribute, 1), std::invalid_argument) << row.name;
    EXPECT_THROW(pool().set_attribute(row.attribute, before), std::invalid_argument) << row.name;
    EXPECT_EQ(pool().get_attribute(row.attribute), before) << row.name;
  }
}

TEST_F(AttributeRulesTest, BooleanRowsThrowOnValuesAboveOne)
{
  for (auto const& row : attribute_table) {
    if (row.kind != attribute_kind::boolean || row.access != attribute_access::read_write) {
      continue;
    }
    auto const before = pool().get_attribute(row.attribute);
    EXPECT_THROW(pool().set_attribute(row.attribute, 2), std::invalid_argument) << row.name;
    EXPECT_EQ(pool().get_attribute(row.attribute), before) << row.name;
  }
}

TEST_F(AttributeRulesTest, OwnedPoolReadsEveryRow)
{
  // Rows newer than the driver are answered from the creation properties of an owned pool.
  for (auto const& row : attribute_table) {
    EXPECT_NO_THROW(static_cast<void>(pool().get_attribute(row.attribute))) << row.name;
  }
}

}  // namespace
}  // namespace asyncmr::test

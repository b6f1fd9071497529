/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file pool_attributes.hpp
 * @brief The table of memory-pool attributes. Everything about one attribute is written here,
 * once: its driver enum, value type, whether and how it may be set, and the first driver that
 * knows it. The C++ accessors, the Python properties and the tests are generated from it.
 */

#include <array>
#include <cstdint>
#include <string_view>

namespace asyncmr {

/// @brief How an attribute may be written.
enum class attribute_access : int {
  read_only,   ///< never
  read_write,  ///< any value of its type
  reset_only,  ///< only 0, which resets a high-water mark
};

/// @brief How an attribute's value is typed.
enum class attribute_kind : int { boolean, integer, bytes };

// X(name, driver enum value, kind, access, first driver version)
// The driver values 9-14 arrived with CUDA 13.2 and are spelled as numbers because 13.0
// headers do not name them; they match `cudaMemPoolAttr` in 13.2 and later.
#define ASYNCMR_POOL_ATTRIBUTES(X)                                                  \
  X(reuse_follow_event_dependencies, 1, boolean, read_write, 11020)                 \
  X(reuse_allow_opportunistic, 2, boolean, read_write, 11020)                       \
  X(reuse_allow_internal_dependencies, 3, boolean, read_write, 11020)               \
  X(release_threshold, 4, bytes, read_write, 11020)                                 \
  X(reserved_mem_current, 5, bytes, read_only, 11030)                               \
  X(reserved_mem_high, 6, bytes, reset_only, 11030)                                 \
  X(used_mem_current, 7, bytes, read_only, 11030)                                   \
  X(used_mem_high, 8, bytes, reset_only, 11030)                                     \
  X(allocation_type, 9, integer, read_only, 13020)                                  \
  X(export_handle_types, 10, integer, read_only, 13020)                             \
  X(location_id, 11, integer, read_only, 13020)                                     \
  X(location_type, 12, integer, read_only, 13020)                                   \
  X(max_pool_size, 13, bytes, read_only, 13020)                                     \
  X(hw_decompress_enabled, 14, boolean, read_only, 13020)

/// @brief One enumerator per row of the table, in table order.
enum class pool_attribute : int {
#define ASYNCMR_X(name, cuda_value, kind, access, min_driver) name,
  ASYNCMR_POOL_ATTRIBUTES(ASYNCMR_X)
#undef ASYNCMR_X
};

/// @brief A row of the table, as data.
struct attribute_info {
  pool_attribute attribute;
  std::string_view name;
  int cuda_value;  ///< the `cudaMemPoolAttr` value
  attribute_kind kind;
  attribute_access access;
  int min_driver;  ///< first driver version (`cudaDriverGetVersion` units) that knows it
};

/// @brief Every row of the table, in order.
inline constexpr std::array attribute_table{
#define ASYNCMR_X(name, cuda_value, kind, access, min_driver)                            \
  attribute_info{pool_attribute::name, #name, cuda_value, attribute_kind::kind, \
                 attribute_access::access, min_driver},
  ASYNCMR_POOL_ATTRIBUTES(ASYNCMR_X)
#undef ASYNCMR_X
};

/// @brief The row for `attribute`.
[[nodiscard]] constexpr attribute_info const& info(pool_attribute attribute) noexcept
{
  return attribute_table[static_cast<std::size_t>(attribute)];
}

/// @brief The C++ value type of an attribute kind.
template <attribute_kind K>
struct attribute_value;
template <>
struct attribute_value<attribute_kind::boolean> {
  using type = bool;
};
template <>
struct attribute_value<attribute_kind::integer> {
  using type = int;
};
template <>
struct attribute_value<attribute_kind::bytes> {
  using type = std::uint64_t;
};

/// @brief The C++ value type of `A` (bool, int or std::uint64_t).
template <pool_attribute A>
using attribute_value_t = typename attribute_value<info(A).kind>::type;

}  // namespace asyncmr

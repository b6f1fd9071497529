/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Glue between Cython and the C++ API, for what Cython cannot say itself: the construction of
// any resource from its options (one template for the three resources), and calls that take a
// stream, a pointer or a handle as an integer. Stateless: every module may compile it (the GIL
// hooks are runtime.hpp's, installed by one module).

#include <asyncmr/asyncmr.hpp>

#include <rmm/aligned.hpp>

#include <cuda/stream>

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace asyncmr_py {

using namespace asyncmr;

// ---- resources --------------------------------------------------------------------------------

/// Builds resource `R` from its options, on `adopt` when given (one path for the three).
template <class R, class Options>
std::shared_ptr<R> make_resource(mem_pool const* adopt, Options const& options)
{
  return adopt != nullptr ? std::make_shared<R>(*adopt, options) : std::make_shared<R>(options);
}

inline cudaStream_t as_stream(std::uintptr_t stream) noexcept
{
  return reinterpret_cast<cudaStream_t>(stream);
}

// ---- placement (asyncmr/placement.hpp), from a vector of ranges and a raw stream ---------------

inline void prefetch_ranges(std::vector<memory_range> const& r, location to, std::uintptr_t s)
{
  asyncmr::prefetch(std::span<memory_range const>{r.data(), r.size()}, to,
                    cuda::stream_ref{as_stream(s)});
}

inline void discard_ranges(std::vector<memory_range> const& r, std::uintptr_t s)
{
  asyncmr::discard(std::span<memory_range const>{r.data(), r.size()}, cuda::stream_ref{as_stream(s)});
}

inline void discard_and_prefetch_ranges(std::vector<memory_range> const& r, location to,
                                        std::uintptr_t s)
{
  asyncmr::discard_and_prefetch(std::span<memory_range const>{r.data(), r.size()}, to,
                                cuda::stream_ref{as_stream(s)});
}

// `advice`: the index of an asyncmr::memory_advice (checked there).
inline void advise_ranges(std::vector<memory_range> const& r, int advice, location to)
{
  asyncmr::advise(std::span<memory_range const>{r.data(), r.size()},
                  static_cast<asyncmr::memory_advice>(advice), to);
}

inline std::uintptr_t allocate(pool_resource& mr, std::uintptr_t stream, std::size_t bytes)
{
  return reinterpret_cast<std::uintptr_t>(
    mr.allocate(cuda::stream_ref{as_stream(stream)}, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT));
}

/// What the free did, for Python to raise on (C++'s deallocate only logs it).
inline free_result deallocate(pool_resource& mr,
                                      std::uintptr_t stream,
                                      std::uintptr_t ptr,
                                      std::size_t bytes) noexcept
{
  return mr.deallocate_checked(cuda::stream_ref{as_stream(stream)}, reinterpret_cast<void*>(ptr),
                               bytes);
}

/// The message of a free that was not made (see `free_status`).
inline std::string free_failure(free_result const& result, std::uintptr_t ptr, std::size_t bytes)
{
  return describe_free_failure(result, reinterpret_cast<void const*>(ptr), bytes);
}

// ---- pools ------------------------------------------------------------------------------------

inline std::uintptr_t handle_of(mem_pool const& pool)
{
  return reinterpret_cast<std::uintptr_t>(pool.handle());
}

inline mem_pool adopt_handle(std::uintptr_t handle,
                             bool owned,
                             std::optional<location> where,
                             std::optional<allocation_type> type)
{
  return mem_pool::from_handle(reinterpret_cast<cudaMemPool_t>(handle), owned, where, type);
}

/// The attribute in row `index` of the table (table order is the enum's order); an index
/// outside the table is refused (std::out_of_range, a ValueError in Python).
inline pool_attribute attribute_at(std::size_t index)
{
  if (index >= attribute_table.size()) {
    throw std::out_of_range{"asyncmr: pool attribute index " + std::to_string(index) +
                            " is outside the table (" + std::to_string(attribute_table.size()) +
                            " attributes)"};
  }
  return static_cast<pool_attribute>(index);
}
inline std::uint64_t get_attribute(mem_pool const& pool, std::size_t index)
{
  return pool.get_attribute(attribute_at(index));
}
inline void set_attribute(mem_pool const& pool, std::size_t index, std::uint64_t value)
{
  pool.set_attribute(attribute_at(index), value);
}

// ---- imported allocations ---------------------------------------------------------------------

inline std::unique_ptr<imported_allocation> import_pointer(mem_pool const& pool,
                                                           exported_pointer const& data)
{
  return std::make_unique<imported_allocation>(pool.import_pointer(data));
}

inline void release_import(imported_allocation& imported, std::uintptr_t stream)
{
  imported.release(as_stream(stream));
}

inline void release_import_on_own_stream(imported_allocation& imported) { imported.release(); }

inline std::uintptr_t import_address(imported_allocation const& imported) noexcept
{
  return reinterpret_cast<std::uintptr_t>(imported.get());
}

// The attribute table, row by row (its names are null-terminated string literals).
inline std::size_t attribute_count() noexcept { return attribute_table.size(); }
inline attribute_info const& attribute_row(std::size_t i) { return attribute_table.at(i); }
inline char const* attribute_name(std::size_t i) { return attribute_table.at(i).name.data(); }

/// The location kind a driver `cudaMemLocationType` value names.
inline location_kind kind_from_cuda(int value)
{
  cudaMemLocation loc{};
  loc.type = static_cast<cudaMemLocationType>(value);
  return location::from_cuda(loc).kind;
}

}  // namespace asyncmr_py

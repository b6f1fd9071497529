/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Private to src/: the state every copy of a mem_pool shares, and the process-wide registry of
// the pools asyncmr owns (src/pool_registry.cpp).

#include <asyncmr/location.hpp>
#include <asyncmr/mem_pool.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

namespace asyncmr::detail {

struct pool_state {
  std::atomic<cudaMemPool_t> handle{nullptr};
  // Allocations between reading `handle` and the driver's return. close() parks the pool
  // instead of destroying it while this is non-zero (or anything is allocated from it).
  std::atomic<std::int64_t> in_flight{0};
  // Allocations of another process mapped into this one (imported pools only): the import is
  // not destroyed while any is live.
  std::atomic<std::int64_t> live_imports{0};
  bool owned{false};
  bool imported{false};
  std::optional<location> where{};
  std::optional<allocation_type> type{};
  std::optional<pool_properties> props{};
  std::mutex close_mutex{};

  pool_state() = default;
  pool_state(pool_state const&)            = delete;
  pool_state& operator=(pool_state const&) = delete;
  ~pool_state();

  /**
   * Clears the handle and, for an owned pool that is current, routes its location back to its
   * default pool. Returns the handle for `retire`, or nullptr for a view or a closed pool.
   * Callers other than the destructor hold `close_mutex`.
   */
  [[nodiscard]] cudaMemPool_t detach() noexcept;
};

// ---- the registry of owned pools (src/pool_registry.cpp) ------------------------------------

/// True if nothing is allocated from `handle` and nothing stays reserved in it after a trim to 0
/// (no free still queued), no allocation is in flight and no import is live (what `state`
/// knows; a null `state` is being destroyed, so nothing can be in flight).
[[nodiscard]] bool idle(cudaMemPool_t handle, pool_state const* state, bool imported) noexcept;

/// Records a pool asyncmr owns, so that adopting its handle elsewhere shares `state`.
void register_owned(std::shared_ptr<pool_state> const& state);

/// The live state of an owned pool with this handle, or nullptr.
[[nodiscard]] std::shared_ptr<pool_state> find_owned(cudaMemPool_t handle);

/// True if asyncmr closed this pool and will destroy it once it is `idle`.
[[nodiscard]] bool is_parked(cudaMemPool_t handle);

/**
 * Destroys `handle` (closed by `state`) now if it is `idle`, else trims and parks it; then
 * destroys every parked pool that became idle.
 * `state` may be null when the state is being destroyed (nothing can then be in flight).
 */
void retire(cudaMemPool_t handle, std::shared_ptr<pool_state> const& state, bool imported) noexcept;

/**
 * The process-wide pool asyncmr creates for `type` at `where` and never destroys, standing in
 * for CUDA 13's default pool where a CUDA 12 build runs on a 12.x driver.
 */
[[nodiscard]] cudaMemPool_t stand_in_pool(location const& where, allocation_type type);

/// True for a pool `stand_in_pool` made.
[[nodiscard]] bool is_stand_in(cudaMemPool_t handle);

/**
 * Whether the process can read the first bytes at `address` (src/address_probe.cpp), found
 * without touching them. The driver dereferences a pool handle without checking it.
 */
[[nodiscard]] bool address_is_mapped(void const* address) noexcept;

}  // namespace asyncmr::detail

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Private to src/: the state every copy of a mem_pool shares, and the process-wide registry of
// the pools asyncmr owns (src/pool_registry.cpp).

#include <asyncmr/location.hpp>
#include <asyncmr/mem_pool.hpp>

#include <cuda_runtime_api.h>

#include <asyncmr/error.hpp>

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
  // Allocations of another process mapped into this one (imported pools only, null for the
  // rest): the import is not destroyed while any is live. Shared with the registry's parked
  // entry, because it outlives this state: a release whose wait failed keeps its import counted
  // for good (the free may not have run), and the pool must then never be destroyed.
  std::shared_ptr<std::atomic<std::int64_t>> live_imports{};
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

  /// What `retire` does with this pool once it holds nothing.
  [[nodiscard]] struct retirement after_retirement() const noexcept;
};

/**
 * What becomes of a retired pool once it holds nothing. A device or pinned pool is destroyed. A
 * managed pool (or an adopted one of unknown type) is kept, never destroyed: the driver can say
 * a managed pool holds nothing while a prefetch of its memory, queued on a stream destroyed
 * before it ran, is still being torn down, and destroying the pool then breaks the driver
 * (later prefetches fail with cudaErrorUnknown, then cuMemPoolDestroy crashes; no stream or
 * synchronization tells when it is safe: docs/DRIVER_FACTS.md). A kept pool that asyncmr
 * created (`reuse_as`) is a spare: a later `mem_pool::create` of the same properties takes it
 * instead of a new one, so creating and dropping managed pools keeps a bounded number alive,
 * not one per pool ever made (src/pool_registry.cpp: when a spare serves).
 */
struct retirement {
  bool keep{false};
  std::optional<pool_properties> reuse_as{};
};

inline retirement pool_state::after_retirement() const noexcept
{
  if (type.value_or(allocation_type::managed) != allocation_type::managed) { return {}; }
  return {true, props};
}

/// The test hook `pool_use` calls once it holds a handle (`testing::set_pool_use_hook`).
extern std::atomic<void (*)() noexcept> testing_pool_use_hook;

/**
 * One driver call on a pool's handle, counted in `in_flight` from before the handle is read to
 * after the call: close() then parks the pool instead of destroying it under the call (the
 * driver does not check a handle; a destroyed one is read as freed memory). Throws
 * `pool_closed_error` when the pool is closed already.
 */
class pool_use {
 public:
  explicit pool_use(pool_state& state, char const* closed_message = nullptr);
  ~pool_use() { state_.in_flight.fetch_sub(1, std::memory_order_release); }
  pool_use(pool_use const&)            = delete;
  pool_use& operator=(pool_use const&) = delete;
  [[nodiscard]] cudaMemPool_t handle() const noexcept { return handle_; }

 private:
  pool_state& state_;
  cudaMemPool_t handle_{nullptr};
};

/**
 * Serializes what reads or changes which pool is current (`cudaMemGetMemPool` then a lookup or
 * `cudaMemSetMemPool`): `mem_pool::current`, `make_current` and a closing pool's reroute. Lock
 * order: a pool's `close_mutex`, then this, then the registry's. Recursive: a pool whose last
 * owner is a `mem_pool` released under it (a `make_current` that throws) reroutes under it.
 */
[[nodiscard]] std::unique_lock<std::recursive_mutex> routing_lock();

// ---- the registry of owned pools (src/pool_registry.cpp) ------------------------------------

/// What asyncmr knows of a handle now (`lookup`).
enum class handle_status {
  unknown,   ///< not a pool asyncmr owns
  owned,     ///< a live owned pool (`state` is its state)
  closing,   ///< an owned pool whose last owner is being destroyed: about to be retired
  parked,    ///< closed by asyncmr, destroyed once idle
  spare,     ///< closed by asyncmr, kept for a later create (`retirement`)
  stand_in,  ///< asyncmr's process-wide default host pool of a CUDA 12 build
};

struct handle_lookup {
  handle_status status{handle_status::unknown};
  std::shared_ptr<pool_state> state{};
};

/// Sorts `handle` in one look at the registry (one lock: no window between the questions).
[[nodiscard]] handle_lookup lookup(cudaMemPool_t handle);

/// The live imports of an imported pool (`pool_state::live_imports`); null for any other pool.
using import_count = std::shared_ptr<std::atomic<std::int64_t> const>;

/// True if no allocation is in flight (what `state` knows; a null `state` is being destroyed,
/// so nothing can be), and: for an imported pool (`imports` not null), no import is live; for
/// any other, nothing is allocated from `handle` and nothing stays reserved in it after a trim
/// to 0 (no free still queued).
[[nodiscard]] bool idle(cudaMemPool_t handle,
                        pool_state const* state,
                        std::atomic<std::int64_t> const* imports) noexcept;

/**
 * Records a pool asyncmr owns, so that adopting its handle elsewhere shares `state`. When
 * another live state owns the handle already (two adoptions racing), records nothing and returns
 * that state, which the caller uses instead; nullptr when `state` was recorded.
 * @throws pool_closed_error when the handle's owner is closing it or asyncmr parked it
 */
[[nodiscard]] std::shared_ptr<pool_state> register_owned(std::shared_ptr<pool_state> const& state);

/// Called by `mem_pool::close` with the handle it closes, before the pool is retired: gives the
/// pool the blocks that front caches hold of it (src/front_cache.cpp installs it).
using pool_closing_hook = void (*)(cudaMemPool_t handle) noexcept;
void set_pool_closing_hook(pool_closing_hook hook) noexcept;
void run_pool_closing_hook(cudaMemPool_t handle) noexcept;

/**
 * Destroys `handle` (closed by `state`) now if it is `idle`, else trims and parks it; then
 * destroys every parked pool that became idle. A pool left parked is destroyed by a background
 * sweeper as soon as it is idle, whatever else the process does. A pool that `after` keeps is
 * kept as a spare instead of destroyed.
 * `state` may be null when the state is being destroyed (nothing can then be in flight);
 * `imports` is the pool's `live_imports` (null unless imported).
 */
void retire(cudaMemPool_t handle,
            std::shared_ptr<pool_state> const& state,
            import_count imports,
            retirement after) noexcept;

/**
 * A spare pool (`retirement`) created with `props` (its release threshold aside) and kept a
 * moment, taken out of the registry for the caller to own; nullptr when there is none. Waits
 * for the oldest spare of the kind to settle when many were kept a moment ago (fast churn).
 */
[[nodiscard]] cudaMemPool_t take_spare(pool_properties const& props) noexcept;

/// Sets what a spare's last owner may have changed back to a new pool's values: the reuse
/// policies on, the high watermarks reset, no device granted access.
void reset_spare(cudaMemPool_t handle) noexcept;

/**
 * The process-wide pool asyncmr creates for `type` at `where` and never destroys, standing in
 * for CUDA 13's default pool where a CUDA 12 build runs on a 12.x driver.
 */
[[nodiscard]] cudaMemPool_t stand_in_pool(location const& where, allocation_type type);

/**
 * The bytes from `address` to the end of the range [`start`, `start + size`), or 0 when the
 * range does not hold `address` (what the driver says of an imported pointer's mapping).
 */
[[nodiscard]] std::size_t bytes_from(std::uint64_t start, std::uint64_t size,
                                     std::uint64_t address) noexcept;

/**
 * Whether the process can read the first bytes at `address` (src/address_probe.cpp), found
 * without touching them. The driver dereferences a pool handle without checking it.
 */
[[nodiscard]] bool address_is_mapped(void const* address) noexcept;

}  // namespace asyncmr::detail

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file pool_resource.hpp
 * @brief What the three resources share: stream-ordered allocation from one `mem_pool`, and the
 * optional parts a resource composes in front of it.
 *
 * A `pool_resource` allocates with `cudaMallocFromPoolAsync` and frees with `cudaFreeAsync`. Its
 * parts, each its own header, source and tests, are held, not inherited:
 * - a front cache (`resource_options::cache` > 0): freed blocks kept per stream and handed back
 *   to the same stream (src/detail/front_cache.hpp; its rules: docs/user_guide/front_cache.md);
 * - a history recorder (`start_history`): every allocation and free into a bounded ring
 *   (src/detail/history_recorder.hpp, asyncmr/history.hpp);
 * - a placement (`resource_options::prefetch`): every managed allocation prefetched on its stream
 *   (asyncmr/placement.hpp).
 * An allocation goes to the cache or the pool, is recorded, then placed; a free is recorded, then
 * goes to the cache or the pool. Copies share the pool and every part; two resources are equal
 * (memory of one may be freed through the other) when they share the pool and the cache, or
 * have none.
 */

#include <asyncmr/front_cache_stats.hpp>
#include <asyncmr/history.hpp>
#include <asyncmr/location.hpp>
#include <asyncmr/mem_pool.hpp>
#include <asyncmr/placement.hpp>
#include <asyncmr/resource_options.hpp>

#include <rmm/aligned.hpp>

#include <cuda/stream>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace asyncmr {

/**
 * @brief How many stream-ordered frees through asyncmr's resources the driver refused since the
 * process started (each one is also logged through RMM's logger).
 */
[[nodiscard]] std::uint64_t failed_deallocations() noexcept;

/// @brief What a checked free (`pool_resource::deallocate_checked`) did.
enum class free_status {
  freed,              ///< cached, or freed to the pool in stream order
  not_this_resource,  ///< the driver says the block belongs to another pool; nothing changed
  wrong_size,         ///< the cache handed the block out at another size; nothing changed
  already_free,       ///< the block is in the cache already (a double free); nothing changed
  driver_refused,     ///< `cudaFreeAsync` refused it (`error`); nothing changed
};

/// @brief A checked free's answer.
struct free_result {
  free_status status{free_status::freed};
  cudaError_t error{cudaSuccess};   ///< for `driver_refused`
  std::size_t recorded_bytes{0};    ///< for `wrong_size` and `already_free`: the class recorded
  bool cached{false};               ///< `freed` into the front cache (not to the pool)
  [[nodiscard]] bool ok() const noexcept { return status == free_status::freed; }
};

/// @brief The message that explains a free that was not made, naming the block and the size.
[[nodiscard]] std::string describe_free_failure(free_result const& result,
                                                void const* ptr,
                                                std::size_t bytes);

namespace detail {

class front_cache;
class history_recorder;

/// @brief What a resource constructor decided: its pool, its device, its parts' settings.
struct resolved_pool {
  mem_pool pool;
  std::optional<int> device;  ///< managed and device resources
  std::size_t cache{0};
  std::optional<location> prefetch;  ///< managed resources: where allocations migrate
  bool discard{false};  ///< managed resources: their old contents dropped as they do
};

/**
 * @brief Checks `options` for a resource handing out `type` memory and obtains its pool: a new
 * or shared one, or `adopt` when given, with the release threshold and access policy applied.
 * Every argument is checked before the first change to a (possibly shared) pool, so a refused
 * construction leaves every pool as it was.
 */
[[nodiscard]] resolved_pool resolve_pool(allocation_type type,
                                         resource_options const& options,
                                         mem_pool const* adopt);

}  // namespace detail

/**
 * @brief The base of `async_managed_memory_resource`, `async_pinned_memory_resource` and
 * `async_device_memory_resource` (see the file comment).
 */
class pool_resource {
 public:
  /**
   * @brief Allocates `bytes` bytes in stream order on `stream`. Zero bytes returns nullptr.
   * @throws rmm::out_of_memory when the pool cannot grow; `unsupported_error` when CUDA refuses
   * the allocation inside a stream capture (host pools); `pool_closed_error` after close.
   */
  [[nodiscard]] void* allocate(cuda::stream_ref stream,
                               std::size_t bytes,
                               std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT);
  /**
   * @brief Frees `ptr` in stream order on `stream`. Never throws: a free that is not made (see
   * `deallocate_checked`) is logged through RMM's logger, counted in `failed_deallocations()`,
   * and asserted in debug builds, as RMM does.
   */
  void deallocate(cuda::stream_ref stream,
                  void* ptr,
                  std::size_t bytes,
                  std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept;
  /**
   * @brief Frees like `deallocate`, and returns what happened instead of logging a refusal
   * (refusals still count in `failed_deallocations()`); for callers that can raise. Nothing is
   * changed unless the result is `free_status::freed`: a block of another pool (asked of the
   * driver, with a cache), a size other than the cache recorded, a second free of a cached
   * block, a pointer the driver refuses.
   */
  [[nodiscard]] free_result deallocate_checked(cuda::stream_ref stream,
                                               void* ptr,
                                               std::size_t bytes) noexcept;
  /**
   * @brief Allocates on the per-thread default stream and waits until the memory is usable from
   * the host and any stream. Throws `unsupported_error`, allocating nothing, on a thread that
   * captures its per-thread stream (the wait would invalidate the capture); beside any other
   * capture it waits in relaxed capture mode, which leaves that capture valid.
   */
  [[nodiscard]] void* allocate_sync(std::size_t bytes,
                                    std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT);
  /// @brief Frees memory no stream still uses.
  void deallocate_sync(void* ptr,
                       std::size_t bytes,
                       std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept;

  /// @brief The pool this resource allocates from.
  [[nodiscard]] mem_pool const& pool() const noexcept { return pool_; }
  /// @brief The pool's driver handle.
  [[nodiscard]] cudaMemPool_t pool_handle() const { return pool_.handle(); }
  /// @brief True if the pool ends with the resource (`pool_source::new_pool`; see
  /// `mem_pool::owned`).
  [[nodiscard]] bool owns_pool() const noexcept { return pool_.owned(); }

  // ---- the front cache ----------------------------------------------------------------------
  /// @brief The front cache's byte cap; 0 without a cache.
  [[nodiscard]] std::size_t cache_capacity() const noexcept;
  /// @brief The front cache's counters (cached bytes and blocks, hits, ...); none without one.
  [[nodiscard]] std::optional<front_cache_stats> cache_stats() const;
  /**
   * @brief Empties the front cache: every cached block goes back to the pool in the order of the
   * stream it was freed on, and the call returns once it is the pool's; a block freed into the
   * cache meanwhile stays cached. Safe while other streams capture (nothing device-wide). The
   * wait releases the GIL when called from Python.
   * @throws cuda_error when the wait failed
   */
  void release_cache();
  /**
   * @brief Empties the front cache (`release_cache`), then releases the pool's unused reserved
   * memory down to `min_bytes_to_keep` bytes (`mem_pool::trim_to`).
   */
  void trim_to(std::size_t min_bytes_to_keep = 0);

  // ---- allocation history -------------------------------------------------------------------
  /**
   * @brief Starts recording this resource's (and its copies') allocations, frees, cache hits and
   * puts, pool growth and trims, and allocation failures, into a new ring of `max_events`
   * events that drops the oldest when full. Each allocation or free the pool serves also moves
   * the pool's known used bytes, which are read from the driver now and then; hits and puts
   * leave the pool as it is. Safe during captures and from any thread. One recording at a time.
   * @throws std::invalid_argument for 0 or too many events; std::logic_error while one runs
   */
  void start_history(std::size_t max_events);
  /// @brief Stops the recording: its events, oldest first; `dropped` gets how many were lost.
  /// @throws std::logic_error when none runs
  [[nodiscard]] std::vector<history_event> stop_history(std::uint64_t& dropped);
  /// @brief The events recorded so far, oldest first, without stopping.
  /// @throws std::logic_error when none runs
  [[nodiscard]] std::vector<history_event> read_history(std::uint64_t& dropped) const;
  /// @brief True while a recording runs.
  [[nodiscard]] bool recording_history() const noexcept;

  // ---- placement ----------------------------------------------------------------------------
  /// @brief Where allocations are prefetched to (`resource_options::prefetch`); none if not.
  [[nodiscard]] std::optional<location> prefetch_target() const noexcept;
  /// @brief Whether a prefetch at allocation drops the old contents (`resource_options::discard`).
  [[nodiscard]] bool prefetch_discards() const noexcept;

 protected:
  /// @brief A resource on `resolved.pool`, with a front cache when `resolved.cache` > 0 (its
  /// frees run in the context of `resolved.device`, the pool's device; unset for host pools).
  explicit pool_resource(detail::resolved_pool resolved);
  ~pool_resource();
  pool_resource(pool_resource const&)                = default;
  pool_resource& operator=(pool_resource const&)     = default;
  pool_resource(pool_resource&&) noexcept            = default;
  pool_resource& operator=(pool_resource&&) noexcept = default;

  /// @brief Same pool and same cache (or none): memory of one may be freed through the other.
  [[nodiscard]] bool same_pool(pool_resource const& other) const noexcept
  {
    return pool_ == other.pool_ && cache_ == other.cache_;
  }

  /// @brief The device the resource is for (managed and device resources).
  [[nodiscard]] std::optional<int> resource_device() const noexcept { return device_; }

 private:
  mem_pool pool_;
  std::optional<int> device_;
  std::shared_ptr<detail::front_cache> cache_;          // null: no cache
  std::shared_ptr<detail::history_recorder> history_;  // null only in a moved-from resource
  std::optional<allocation_placement> placement_;      // managed resources with `prefetch`
};

}  // namespace asyncmr

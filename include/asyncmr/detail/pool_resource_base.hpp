/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <asyncmr/detail/history.hpp>
#include <asyncmr/front_cache_stats.hpp>
#include <asyncmr/location.hpp>
#include <asyncmr/mem_pool.hpp>
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

/**
 * @brief How many prefetches of new allocations (`resource_options::prefetch`) the driver
 * refused since the process started; each left its allocation as it was.
 */
[[nodiscard]] std::uint64_t failed_prefetches() noexcept;

namespace detail {

struct history_state;

/// @brief What a resource constructor decided: its pool, its device, its cache's cap.
struct resolved_pool {
  mem_pool pool;
  std::optional<int> device;  ///< managed and device resources
  std::size_t cache{0};
  std::optional<location> prefetch;  ///< managed resources: where allocations migrate
  bool discard{false};  ///< managed resources: their old contents dropped as they do
};

/**
 * @brief The checks of `options` for a resource handing out `type` memory that need no driver
 * (fields the resource takes no, sizes, a managed location, NUMA nodes, `discard` without a
 * prefetch target): bindings call it before they ask the driver anything (the current device,
 * a pool handle's pool). `prefetch_given`: a prefetch target will be set once resolved.
 * `resolve_pool` makes them again, with the checks that ask the driver.
 * @throws std::invalid_argument naming the first bad field
 */
void check_fields(allocation_type type, resource_options const& options, bool prefetch_given);

/**
 * @brief Checks `options` for a resource handing out `type` memory and obtains its pool: a new
 * or shared one, or `adopt` when given, with the release threshold and access policy applied.
 * Every argument is checked before the first change to a (possibly shared) pool, so a refused
 * construction leaves every pool as it was.
 */
[[nodiscard]] resolved_pool resolve_pool(allocation_type type,
                                         resource_options const& options,
                                         mem_pool const* adopt);

class stream_cache;

/// @brief What a checked free (`pool_resource_base::deallocate_checked`) did.
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

/**
 * @brief What the three resources share: stream-ordered allocation from one `mem_pool`
 * (`cudaMallocFromPoolAsync` / `cudaFreeAsync`), optionally behind a per-stream front cache,
 * and the pool itself. Copies share the pool and the cache; two resources are equal (memory of
 * one may be freed through the other) when they share the pool and the cache, or have none.
 *
 * The front cache (`cache` bytes > 0; rules in `detail/front_cache.hpp`) keeps freed blocks per
 * stream, in size classes, and hands a block freed on stream S only to a later allocation on S
 * (stream order makes that safe with no event). It takes back only blocks it handed out itself,
 * at the size it handed them out (an ownership record), never a block allocated inside a stream
 * capture; a pointer of another pool is refused. Blocks leave it for the pool only in their own
 * stream's order or on the cache's release stream after it waited for their stream's event
 * (recorded at each free into the cache), never with a device-wide synchronization (which would
 * break any capture on the device), and blocks of streams idle for a while are reclaimed that
 * way by a background thread when the cap is under pressure. An allocation the pool cannot serve first gets the cached memory back. Cached
 * blocks count as used in the pool's attributes; `cache_stats()` reports them on their own.
 */
class pool_resource_base {
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
  /// @brief True if the pool is destroyed with the resource (`pool_source::new_pool`).
  [[nodiscard]] bool owns_pool() const noexcept { return pool_.owned(); }

  /// @brief The front cache's byte cap; 0 without a cache.
  [[nodiscard]] std::size_t cache_capacity() const noexcept;
  /// @brief The front cache's counters (cached bytes and blocks, hits, ...); none without one.
  [[nodiscard]] std::optional<front_cache_stats> cache_stats() const;
  /**
   * @brief Empties the front cache: takes every cached block out of reach, frees them to the pool
   * on the cache's release stream behind the events of the streams they were freed on, and waits
   * for that stream, so the memory is the pool's on return; a block freed into the cache
   * meanwhile stays cached. Safe while other streams capture (nothing device-wide). The wait
   * releases the GIL when called from Python.
   * @throws cuda_error when the wait failed
   */
  void release_cache();
  /**
   * @brief Empties the front cache (`release_cache`), then releases the pool's unused reserved
   * memory down to `min_bytes_to_keep` bytes (`mem_pool::trim_to`).
   */
  void trim_to(std::size_t min_bytes_to_keep = 0);

  // ---- allocation history ----------------------------------------------------------------------
  /**
   * @brief Starts recording this resource's (and its copies') allocations, frees, cache hits and
   * puts, pool growth and trims, and allocation failures, into a new ring of `max_events`
   * events that drops the oldest when full (`detail/history.hpp`). Each allocation or free the
   * pool serves also reads the pool's reserved and used bytes; hits and puts do not (they leave
   * the pool as it is). Safe during captures and from any thread. One recording at a time.
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

  /// @brief Where allocations are prefetched to (`resource_options::prefetch`); none if not.
  [[nodiscard]] std::optional<location> prefetch_target() const noexcept { return prefetch_; }
  /// @brief Whether a prefetch at allocation drops the old contents (`resource_options::discard`).
  [[nodiscard]] bool prefetch_discards() const noexcept { return discard_; }

 protected:
  /// @brief A resource on `resolved.pool`, with a front cache when `resolved.cache` > 0 (its
  /// frees run in the context of `resolved.device`, the pool's device; unset for host pools).
  explicit pool_resource_base(resolved_pool resolved);
  ~pool_resource_base();
  pool_resource_base(pool_resource_base const&)            = default;
  pool_resource_base& operator=(pool_resource_base const&) = default;
  pool_resource_base(pool_resource_base&&) noexcept        = default;
  pool_resource_base& operator=(pool_resource_base&&) noexcept = default;

  /// @brief Same pool and same cache (or none): memory of one may be freed through the other.
  [[nodiscard]] bool same_pool(pool_resource_base const& other) const noexcept
  {
    return pool_ == other.pool_ && cache_ == other.cache_;
  }

  /// @brief The device the resource is for (managed and device resources).
  [[nodiscard]] std::optional<int> resource_device() const noexcept { return device_; }

 private:
  mem_pool pool_;
  std::optional<int> device_;
  // Shared by copies; the last copy empties the cache.
  std::shared_ptr<stream_cache> cache_;
  // The recording, shared by copies (null only in a moved-from resource).
  std::shared_ptr<history_state> history_;
  std::optional<location> prefetch_;
  bool discard_{false};

  void prefetch(void* ptr, std::size_t bytes, cudaStream_t stream) const noexcept;

  // An event of a pair (alloc, free, cache_hit, cache_put), inline on the path of the call, at
  // stamp `now`: the pool's known state, `used` moved by the event's bytes; note_read when the
  // pool is due for a read, or an allocation may have grown it. An allocation is stamped after
  // it returns, a free before it is made: once a block is back, another thread may get it and
  // record its allocation, which must come later in time.
  void note_event(history_ring& ring, history_action action, void const* ptr, std::size_t bytes,
                  cudaStream_t stream, std::uint64_t now) noexcept;
  // An oom or a trim (`bytes`: the allocation that failed, or 0): the pool read now.
  void note_pool(history_ring& ring, history_action action, std::size_t bytes,
                 cudaStream_t stream) noexcept;
  // Records `e` (a trim records nothing itself), after a grow or trim event if a read of the
  // pool (`forced`, or when it is due) finds its reserved bytes changed.
  void note_read(history_ring& ring, history_event e, bool forced) noexcept;
};

}  // namespace detail
}  // namespace asyncmr

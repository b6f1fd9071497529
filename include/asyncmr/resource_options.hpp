/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/// @file resource_options.hpp
/// @brief The construction options of the three resources: one struct, checked in one place.

#include <asyncmr/location.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace asyncmr {

/**
 * @brief How a resource obtains its pool and what it puts in front of it.
 *
 * One struct for the three resources. A field the resource does not use must stay unset: its
 * constructor refuses it by name (`std::invalid_argument`) before any pool is touched, as it
 * refuses every other bad value (a device that does not exist, a cache cap out of range). The
 * fields are in one order, so designated initializers read the same for every resource:
 * `async_pinned_memory_resource{{.source = pool_source::new_pool, .cache = 64 << 20}}`.
 */
struct resource_options {
  /// Managed and device resources: the device they are for; unset = the current device.
  std::optional<int> device{};
  /// Which pool: the location's default pool, its current pool, or a new one the resource owns.
  pool_source source{pool_source::default_pool};
  /// Managed resources: where the pool's memory lives; unset = `location::device(device)`.
  std::optional<asyncmr::location> location{};
  /// Pinned resources: take memory from this host NUMA node; unset = any host memory.
  std::optional<int> numa_node{};
  /// Bytes the pool keeps reserved across synchronizations. Unset: a shared pool whose threshold
  /// is 0 is raised to the maximum (process-wide), an owned pool gets the maximum. Set (0 too):
  /// applied exactly.
  std::optional<std::uint64_t> release_threshold{};
  /// Pinned resources and host-located managed pools: devices granted read-write access; unset =
  /// every visible device, empty = none (nothing is granted; the driver is not asked). Ignored for
  /// device-located managed pools (their device has access).
  std::optional<std::vector<int>> accessible_from{};
  /// Bytes the pool is grown by before the constructor returns, as RMM's `initial_pool_size`:
  /// one allocation of `reserve` bytes, freed at once on a stream of the resource's own and
  /// synchronized, so the pool holds that memory (reserved, not used) from the start and later
  /// allocations are carved from it instead of growing the pool (what a first pass saves:
  /// docs/DRIVER_FACTS.md and benchmark section 4). The pool keeps it while its release
  /// threshold is at least `reserve`: a smaller threshold (the one asked, or a shared pool's
  /// own) is refused before any pool changes. Managed and device pools back the memory on the
  /// device at once. 0 = none. A reservation the pool cannot make throws `rmm::out_of_memory`,
  /// gives back what the pool grew by and leaves a shared pool's threshold as it was.
  std::size_t reserve{0};
  /// Byte cap of the per-stream front cache; 0 = no cache, else in [256 B, 1 PiB].
  std::size_t cache{0};
  /// Managed resources: where every allocation (cache hits too) is prefetched, on its own
  /// stream, in stream order, right after it is made: `location::device(n)` or
  /// `location::host()`; unset = no prefetch. Skipped on a capturing stream (the driver would
  /// invalidate the capture); a prefetch the driver refuses leaves the allocation as it is and
  /// is counted (`failed_prefetches()`).
  std::optional<asyncmr::location> prefetch{};
  /// Managed resources with `prefetch` set: each allocation's previous contents are discarded
  /// as it is prefetched (one `cudaMemDiscardAndPrefetchBatchAsync`), so its pages are placed at
  /// the target without migrating what they held. A new allocation's contents are undefined
  /// anyway, so only the copy is saved: 256 MiB of reused host-touched pool memory is placed
  /// on the device in ~2 ms instead of ~5.5 ms (docs/DRIVER_FACTS.md). Only whole pages inside
  /// the allocation are dropped: the driver keeps every page it shares with a neighbour. Host
  /// writes made before the stream reaches the allocation (which the stream-ordered contract
  /// forbids anyway) would be lost. CUDA 13 build only (`can_discard()`).
  bool discard{false};
};

/**
 * @brief The checks of `options` for a resource handing out `type` memory that need no driver:
 * fields such a resource takes no (a device for pinned memory, a location for device memory,
 * ...), sizes, a managed location, NUMA nodes, `discard` without a prefetch target. The
 * resources' constructors make them first; a binding calls this before it asks the driver
 * anything of its own (the current device, a pool handle's pool). `prefetch_given`: a prefetch
 * target will be set once resolved.
 * @throws std::invalid_argument naming the first bad field
 */
void check_resource_options(allocation_type type,
                            resource_options const& options,
                            bool prefetch_given);

/// @brief The options of `async_managed_memory_resource` (the one struct).
using managed_resource_options = resource_options;
/// @brief The options of `async_pinned_memory_resource` (the one struct).
using pinned_resource_options = resource_options;
/// @brief The options of `async_device_memory_resource` (the one struct).
using device_resource_options = resource_options;

}  // namespace asyncmr

/*
 * SPDX-License-Identifier: Apache-2.0
 */

// How a resource gets its pool: the one check of `resource_options` for each kind of memory,
// then the pool (shared, new or adopted) with the threshold and access policy applied. Nothing
// is changed before every argument was checked.

#include <asyncmr/capability.hpp>
#include <asyncmr/detail/blocking.hpp>
#include <asyncmr/detail/capture_mode.hpp>
#include <asyncmr/detail/block_cache.hpp>
#include <asyncmr/pool_resource.hpp>
#include <asyncmr/error.hpp>
#include <asyncmr/placement.hpp>

#include "detail/device_sync.hpp"
#include "detail/placement.hpp"
#include "detail/front_cache.hpp"

#include <limits>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace asyncmr::detail {
namespace {

char const* resource_name(allocation_type type) noexcept
{
  switch (type) {
    case allocation_type::managed: return "AsyncManagedMR";
    case allocation_type::pinned: return "AsyncPinnedMR";
    case allocation_type::device: break;
  }
  return "AsyncDeviceMR";
}

[[noreturn]] void refuse_field(allocation_type type, char const* field, char const* why)
{
  throw std::invalid_argument{std::string{"asyncmr: "} + resource_name(type) + " takes no " +
                              field + " (" + why + ")"};
}

// A reservation the threshold would give back at the next synchronization is refused, naming
// what decides, before anything changes. The threshold bounds all the pool reserves, in use or
// not: a pool holding `in_use` bytes keeps at most `threshold - in_use` of them unused.
void check_reserve(std::size_t reserve, std::uint64_t threshold, std::uint64_t in_use)
{
  if (reserve == 0) { return; }
  if (threshold < reserve) {
    throw std::invalid_argument{
      "asyncmr: reserve (" + std::to_string(reserve) + " bytes) is above the pool's release "
      "threshold (" + std::to_string(threshold) + " bytes): the pool would give the "
      "reservation back at the next synchronization; pass release_threshold >= reserve"};
  }
  if (threshold - reserve < in_use) {
    throw std::invalid_argument{
      "asyncmr: reserve (" + std::to_string(reserve) + " bytes) and the " +
      std::to_string(in_use) + " bytes the pool has in use are above its release threshold (" +
      std::to_string(threshold) + " bytes): the pool would give part of the reservation back "
      "at the next synchronization; pass a release_threshold of at least their sum"};
  }
}

}  // namespace

void check_fields(allocation_type type, resource_options const& o, bool prefetch_given)
{
  // An explicit threshold below the reservation needs no pool (nor a GPU) to be judged.
  if (o.release_threshold) { check_reserve(o.reserve, *o.release_threshold, 0); }
  if (type == allocation_type::pinned && o.device) {
    refuse_field(type, "device", "pinned memory belongs to the host; accessible_from names the "
                                 "devices that use it");
  }
  if (type != allocation_type::managed && o.location) {
    refuse_field(type, "location", type == allocation_type::pinned
                                     ? "its pool is on the host; numa_node picks a NUMA node"
                                     : "its pool is on its device");
  }
  if (o.location) { validate_combination(*o.location, type, o.source == pool_source::new_pool); }
  if (type != allocation_type::pinned && o.numa_node) {
    refuse_field(type, "numa_node", "only pinned pools are placed on a host NUMA node");
  }
  if (type == allocation_type::device && o.accessible_from) {
    refuse_field(type, "accessible_from", "device pools are accessible from their device");
  }
  if (o.device) { detail::check_device_ordinal(*o.device, "device"); }
  if (o.accessible_from) {
    for (int const d : *o.accessible_from) {
      detail::check_device_ordinal(d, "accessible_from device");
    }
    require_distinct_devices(*o.accessible_from, "accessible_from");
  }
  if (o.cache != 0 && (o.cache < block_cache::min_class_bytes || o.cache > block_cache::max_cap)) {
    throw std::invalid_argument{"asyncmr: cache must be 0 (no cache) or a cap in [256 B, 1 PiB], "
                                "got " + std::to_string(o.cache) + " bytes"};
  }
  if (o.numa_node) { detail::check_host_numa_node(*o.numa_node, "numa_node"); }
  if ((o.prefetch || prefetch_given) && type != allocation_type::managed) {
    refuse_field(type, "prefetch", "only managed memory migrates");
  }
  if (o.prefetch) { detail::check_target_kind(*o.prefetch, "prefetch"); }
  if (o.discard) {
    if (type != allocation_type::managed) {
      refuse_field(type, "discard", "only managed memory migrates");
    }
    if (!o.prefetch && !prefetch_given) {
      throw std::invalid_argument{
        "asyncmr: AsyncManagedMR's discard needs a prefetch target: it drops the old contents as "
        "an allocation is prefetched (a discard alone makes the next access fault its pages in)"};
    }
  }
}

namespace {

// Every field, for the kind of memory the resource hands out; throws naming the first bad one:
// first what needs no driver (check_fields), then the devices and targets named.
void check_options(allocation_type type, resource_options const& o)
{
  check_fields(type, o, false);
  if (o.accessible_from) {
    for (int const d : *o.accessible_from) { require_device(d); }
  }
  if (o.prefetch) { check_prefetch_target(*o.prefetch); }
  if (o.discard && !can_discard()) {
    throw unsupported_error{"asyncmr: AsyncManagedMR's discard needs the CUDA 13 build of "
                            "asyncmr (asyncmr-cu13) on a CUDA 13 driver; this build is for "
                            "CUDA " + version_string(versions().runtime)};
  }
}

int resolve_device(std::optional<int> device)
{
  if (device) {
    require_device(*device);
    return *device;
  }
  return current_device();
}

std::vector<int> all_devices()
{
  std::vector<int> devices(static_cast<std::size_t>(require_cuda()));
  std::iota(devices.begin(), devices.end(), 0);
  return devices;
}

void grant_access(mem_pool& pool, std::optional<std::vector<int>> const& accessible_from)
{
  pool.set_access(accessible_from ? *accessible_from : all_devices(), access_mode::read_write);
}

void require_type(mem_pool const& pool, allocation_type expected)
{
  auto const t = pool.type();
  if (t && *t != expected) {
    throw std::invalid_argument{std::string{"asyncmr: "} + resource_name(expected) + " needs a " +
                                to_string(expected) + " pool; this pool hands out " +
                                to_string(*t) + " memory"};
  }
}

// The release threshold a pool whose threshold is `now` will have once the resource is built:
// exactly what was asked; else a shared pool's 0 (a default pool's) raised to the maximum so it
// keeps memory across synchronizations, a non-zero value someone set kept, an owned pool's own.
std::uint64_t threshold_to_be(std::uint64_t now, resource_options const& o, bool shared) noexcept
{
  if (o.release_threshold) { return *o.release_threshold; }
  return (shared && now == 0) ? std::numeric_limits<std::uint64_t>::max() : now;
}

// Grows `pool` by `bytes`: one allocation on a stream of its own (on `device` when the memory
// is a device's), freed at once and synchronized, so the pool keeps the memory unused. The
// capture mode is relaxed for these calls (the stream is nobody's capture), and the allocation
// (which maps memory, up to seconds for pinned) and the wait are blocking regions.
std::uint64_t reserve_in(mem_pool const& pool, std::size_t bytes, std::optional<int> device)
{
  relaxed_capture_guard const relaxed;
  // The stream in the device's context, the thread's own current again after (no cudaSetDevice
  // round trip: it would make device 0's context on a thread that had none). A host pool's is
  // made in a context the process uses already, when the thread has none current.
  std::optional<primary_context_scope> on_device;
  std::optional<active_context_scope> in_use;
  if (device) {
    on_device.emplace(*device);
  } else if (current_context() == nullptr) {
    in_use.emplace(std::nullopt);
  }
  scratch_stream const own;
  cudaStream_t const stream = own.get();
  void* ptr = nullptr;
  {
    blocking_region const wait;
    ptr = allocate_giving_caches_back(pool, bytes, stream);
  }
  // What the pool reserves with the reservation in it (the allocation maps its memory before
  // it returns): the synchronization below must leave it all there.
  std::uint64_t grown = 0;
  try {
    grown = pool.get<pool_attribute::reserved_mem_current>();
  } catch (...) {
    clear_own_error(pool.deallocate_async(ptr, stream));
    throw;
  }
  cudaError_t status = pool.deallocate_async(ptr, stream);
  if (status == cudaSuccess) {
    blocking_region const wait;
    status = cudaStreamSynchronize(stream);
    clear_own_error(status);
  }
  if (status != cudaSuccess) {
    throw_cuda_error(status, "reserving the pool's memory (freeing the reservation on the "
                             "resource's own stream and waiting for it)");
  }
  return grown;
}

// Applies `threshold` to a pool that had `before`, grows it by `o.reserve` and, when that
// fails, trims it back to what it held and puts `before` back (a shared pool's threshold is
// everyone's).
void apply_threshold_and_reserve(mem_pool& pool,
                                 std::optional<std::uint64_t> threshold,
                                 std::uint64_t before,
                                 resource_options const& o,
                                 std::optional<int> device)
{
  if (threshold && *threshold != before) {
    pool.set<pool_attribute::release_threshold>(*threshold);
  }
  if (o.reserve == 0) { return; }
  auto const held = pool.get<pool_attribute::reserved_mem_current>();
  try {
    auto const grown = reserve_in(pool, o.reserve, device);
    // The pool grows in chunks: a threshold the checks let through may still be below what
    // it grew to, and then the synchronization gave part of the reservation back. Refused only
    // when the synchronization trimmed the pool and what it kept unused is short of the
    // reservation: a trim of memory the pool held before (a shared pool's old free blocks
    // above a lower threshold) keeps the reservation whole, and another thread's use of it
    // after the synchronization trims nothing.
    auto const kept = pool.get<pool_attribute::reserved_mem_current>();
    auto const used = pool.get<pool_attribute::used_mem_current>();
    if (kept < grown && (kept < used || kept - used < o.reserve)) {
      throw std::invalid_argument{
        "asyncmr: reserve (" + std::to_string(o.reserve) + " bytes): the pool grew to " +
        std::to_string(grown) + " bytes to hold it (it grows in whole chunks) and its release "
        "threshold (" + std::to_string(threshold.value_or(before)) + " bytes) gave back " +
        std::to_string(grown - kept) + " of them at the next synchronization; pass a "
        "release_threshold of at least " + std::to_string(grown) + " bytes"};
    }
  } catch (...) {
    // A reservation the pool cannot make may still have grown it (a bounded pool grows to its
    // max_size before it refuses): what it grew by goes back, and so does a
    // shared pool's threshold, unless someone changed it since (the reservation can take
    // seconds; a threshold set meanwhile through mem_pool, or by another library, is theirs).
    try {
      pool.trim_to(held);
      if (threshold && *threshold != before &&
          pool.get<pool_attribute::release_threshold>() == *threshold) {
        pool.set<pool_attribute::release_threshold>(before);
      }
    } catch (...) {  // NOLINT(bugprone-empty-catch): the reservation's error is the one to tell
    }
    throw;
  }
}

// Resources made at once on a pool others share take turns with its threshold and reservation:
// a failed reservation puts back the threshold and the reserved bytes it read first, which must
// not undo another resource's change made meanwhile. Waited for in a blocking region: the
// holder may be waiting for the device with the GIL let go, and wants it back.
std::unique_lock<std::mutex> shared_pool_turn()
{
  static std::mutex turns;
  std::unique_lock<std::mutex> turn{turns, std::try_to_lock};
  if (!turn.owns_lock()) {
    blocking_region const wait;
    turn.lock();
  }
  return turn;
}

mem_pool obtain(allocation_type type, location const& where, resource_options const& o)
{
  switch (o.source) {
    case pool_source::current: return mem_pool::current(where, type);
    case pool_source::new_pool:
      return mem_pool::create(pool_properties{
        .type = type, .location = where, .release_threshold = o.release_threshold});
    case pool_source::default_pool: break;
  }
  return mem_pool::default_pool(where, type);
}

}  // namespace

resolved_pool resolve_pool(allocation_type type, resource_options const& o, mem_pool const* adopt)
{
  check_options(type, o);
  std::optional<int> device;
  if (adopt != nullptr) {
    mem_pool pool = *adopt;
    static_cast<void>(pool.handle());  // a closed pool is refused here, not at first use
    require_type(pool, type);
    if (pool.imported() && (o.release_threshold || o.reserve != 0)) {
      // Asked of an import, the driver answers no attribute: refused by name instead.
      throw std::invalid_argument{
        std::string{"asyncmr: "} + (o.release_threshold ? "release_threshold" : "reserve") +
        " cannot be set on an imported pool: its memory and threshold are the exporting "
        "process's"};
    }
    bool remote = false;  // does the pool need access grants?
    switch (type) {
      case allocation_type::pinned: {
        remote = true;
        if (o.numa_node) {
          // An adopted pool stays where it is: a NUMA node it is not on is refused, not ignored.
          auto const w = pool.location();
          if (!w || w->kind != location_kind::host_numa || w->id != *o.numa_node) {
            throw std::invalid_argument{
              "asyncmr: numa_node=" + std::to_string(*o.numa_node) + ": the adopted pool's "
              "memory is " + (w ? "at " + w->to_string() : std::string{"where the driver "
              "cannot say"}) + " (an adopted pool stays where it is; drop numa_node)"};
          }
        }
        break;
      }
      case allocation_type::managed: {
        auto const w = pool.location();
        if (o.location && w && *o.location != *w) {
          throw std::invalid_argument{"asyncmr: the pool is located at " + w->to_string() +
                                      "; location=" + o.location->to_string() +
                                      " names another (an adopted pool stays where it is)"};
        }
        device = resolve_device(o.device);
        // A host-located managed pool starts with no device access. When the driver cannot say
        // where an adopted pool lives, its answer to "can the resource's device access it"
        // decides.
        remote       = w ? w->is_host() : pool.access(*device) == access_mode::none;
        break;
      }
      case allocation_type::device: {
        auto const w = pool.location();
        if (w && w->kind == location_kind::device) {
          if (o.device && *o.device != w->id) {
            throw std::invalid_argument{"asyncmr: the pool lives on device " +
                                        std::to_string(w->id) + "; device=" +
                                        std::to_string(*o.device) + " names another"};
          }
          device = w->id;
        } else {
          device = resolve_device(o.device);
        }
        break;
      }
    }
    auto const turn = shared_pool_turn();
    std::uint64_t before = 0;
    if (o.reserve != 0) {  // (nothing read otherwise: an imported pool answers no attribute)
      before = pool.get<pool_attribute::release_threshold>();
      check_reserve(o.reserve, o.release_threshold.value_or(before),
                    pool.get<pool_attribute::used_mem_current>());
    }
    // Access before the threshold and the reservation: a grant the driver refuses then leaves
    // those as they were (a failed reservation leaves the access, as asked, granted).
    if (remote) { grant_access(pool, o.accessible_from); }
    if (o.reserve == 0) {
      if (o.release_threshold) { pool.set<pool_attribute::release_threshold>(*o.release_threshold); }
    } else {
      apply_threshold_and_reserve(pool, o.release_threshold, before, o, device);
    }
    return {std::move(pool), device, o.cache, o.prefetch, o.discard};
  }
  location where = location::host();
  switch (type) {
    case allocation_type::pinned:
      where = o.numa_node ? location::host_numa(*o.numa_node) : location::host();
      break;
    case allocation_type::managed:
      device = resolve_device(o.device);
      where  = o.location.value_or(location::device(*device));
      break;
    case allocation_type::device:
      device = resolve_device(o.device);
      where  = location::device(*device);
      break;
  }
  bool const shared = o.source != pool_source::new_pool;
  std::unique_lock<std::mutex> turn;
  if (shared) { turn = shared_pool_turn(); }
  mem_pool pool      = obtain(type, where, o);
  auto const before  = pool.get<pool_attribute::release_threshold>();
  auto const planned = threshold_to_be(before, o, shared);
  check_reserve(o.reserve, planned,
                shared && o.reserve != 0 ? pool.get<pool_attribute::used_mem_current>() : 0);
  if (where.is_host()) { grant_access(pool, o.accessible_from); }  // first, as above
  apply_threshold_and_reserve(pool, shared ? std::optional{planned} : std::nullopt, before, o,
                              device);
  // A new pool's peaks start after its reservation, as a fresh pool's do (a shared pool's peaks
  // are everyone's and stay).
  if (!shared && o.reserve != 0) { pool.reset_peaks(); }
  return {std::move(pool), device, o.cache, o.prefetch, o.discard};
}

}  // namespace asyncmr::detail

void asyncmr::check_resource_options(allocation_type type,
                                     resource_options const& options,
                                     bool prefetch_given)
{
  detail::check_fields(type, options, prefetch_given);
}

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include <asyncmr/async_device_memory_resource.hpp>
#include <asyncmr/async_managed_memory_resource.hpp>
#include <asyncmr/async_pinned_memory_resource.hpp>
#include <asyncmr/capability.hpp>
#include <asyncmr/error.hpp>

#include "detail/stream_cache.hpp"

#include <asyncmr/detail/blocking.hpp>

#include <rmm/logger.hpp>

#include <utility>

#include <atomic>
#include <cassert>
#include <cstdio>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

namespace asyncmr {
namespace detail {
namespace {

std::vector<int> all_devices()
{
  std::vector<int> devices(static_cast<std::size_t>(require_cuda()));
  std::iota(devices.begin(), devices.end(), 0);
  return devices;
}

void apply_shared_threshold_policy(mem_pool& pool, std::optional<std::uint64_t> threshold)
{
  if (threshold) {
    pool.set<pool_attribute::release_threshold>(*threshold);
  } else if (pool.get<pool_attribute::release_threshold>() == 0) {
    pool.set<pool_attribute::release_threshold>(std::numeric_limits<std::uint64_t>::max());
  }
}

void grant_access(mem_pool& pool, std::optional<std::vector<int>> const& accessible_from)
{
  pool.set_access(accessible_from ? *accessible_from : all_devices(), access_mode::read_write);
}

int resolve_device(std::optional<int> device)
{
  if (device) {
    require_device(*device);
    return *device;
  }
  return current_device();
}

void require_type(mem_pool const& pool, allocation_type expected, char const* resource)
{
  auto const t = pool.type();
  if (t && *t != expected) {
    throw std::invalid_argument{std::string{"asyncmr: "} + resource + " needs a " +
                                to_string(expected) + " pool; this pool hands out " +
                                to_string(*t) + " memory"};
  }
}

}  // namespace

void require_devices(std::optional<std::vector<int>> const& devices)
{
  if (devices) {
    for (int const d : *devices) { require_device(d); }
  }
}

void require_cache_cap(std::size_t cap)
{
  if (cap != 0 && (cap < front_cache::min_class_bytes || cap > front_cache::max_cap)) {
    throw std::invalid_argument{"asyncmr: cache must be 0 (no cache) or a cap in [256 B, 1 PiB], "
                                "got " + std::to_string(cap) + " bytes"};
  }
}

// What the managed and device constructors check before any pool is touched: the cache cap,
// then the device (`options.device`, or the current one). The device it returns is the
// resource's.
template <class Options>
int checked_device(Options const& o)
{
  require_cache_cap(o.cache);
  return resolve_device(o.device);
}

mem_pool acquire_pool(pool_request const& request)
{
  // Every argument is checked before the first change to a (possibly shared) pool, so a
  // refused construction leaves every pool as it was.
  require_devices(request.accessible_from);
  mem_pool pool = [&] {
    switch (request.source) {
      case pool_source::current: return mem_pool::current(request.location, request.type);
      case pool_source::new_pool:
        return mem_pool::create(pool_properties{.type              = request.type,
                                                .location          = request.location,
                                                .release_threshold = request.release_threshold});
      case pool_source::default_pool: break;
    }
    return mem_pool::default_pool(request.location, request.type);
  }();
  if (request.source != pool_source::new_pool) {
    apply_shared_threshold_policy(pool, request.release_threshold);
  }
  if (request.location.is_host()) { grant_access(pool, request.accessible_from); }
  return pool;
}

void configure_adopted_pool(mem_pool& pool,
                            std::optional<std::uint64_t> release_threshold,
                            std::optional<std::vector<int>> const& accessible_from,
                            bool host_pool)
{
  static_cast<void>(pool.handle());  // a closed pool is refused here, not at first use
  require_devices(accessible_from);
  if (release_threshold) { pool.set<pool_attribute::release_threshold>(*release_threshold); }
  if (host_pool) { grant_access(pool, accessible_from); }
}

// ---- allocation -------------------------------------------------------------------------

namespace {

std::atomic<std::uint64_t> refused_frees{0};

std::string address(void const* ptr)
{
  char text[32];
  std::snprintf(text, sizeof text, "%p", ptr);
  return text;
}

}  // namespace

std::string describe_free_failure(free_result const& result, void const* ptr, std::size_t bytes)
{
  std::string const block = address(ptr) + " (" + std::to_string(bytes) + " bytes)";
  switch (result.status) {
    case free_status::freed: return {};
    case free_status::not_this_resource:
      return "asyncmr: " + block + " was not allocated by this resource: the driver says it "
             "belongs to another pool; nothing was freed";
    case free_status::wrong_size:
      return "asyncmr: " + address(ptr) + " was handed out as a " +
             std::to_string(result.recorded_bytes) + "-byte block, but deallocate was given " +
             std::to_string(bytes) + " bytes (another size class); nothing was freed";
    case free_status::already_free:
      return "asyncmr: double free of " + block +
             ": the block is in the front cache already; nothing was freed";
    case free_status::driver_refused: break;
  }
  return "asyncmr: cudaFreeAsync(" + block + ") failed: " + cudaGetErrorName(result.error) +
         " (" + cudaGetErrorString(result.error) + "); a double free, or a pointer this "
         "resource did not allocate?";
}

pool_resource_base::pool_resource_base(mem_pool pool) : pool_{std::move(pool)} {}

pool_resource_base::pool_resource_base(mem_pool pool,
                                       std::size_t cache_bytes,
                                       std::optional<int> device)
  : pool_{std::move(pool)},
    cache_{cache_bytes != 0 ? stream_cache::make(pool_, cache_bytes, device) : nullptr}
{
}

pool_resource_base::~pool_resource_base() = default;

std::size_t pool_resource_base::cache_capacity() const noexcept
{
  return cache_ ? cache_->cap() : 0;
}

std::optional<front_cache_stats> pool_resource_base::cache_stats() const
{
  if (!cache_) { return std::nullopt; }
  return cache_->stats();
}

void pool_resource_base::release_cache()
{
  if (!cache_) { return; }
  if (auto const status = cache_->release(); status != cudaSuccess) {
    throw_cuda_error(status, "synchronizing the devices before freeing the front cache's blocks "
                             "(they stay allocated)");
  }
}

void pool_resource_base::trim_to(std::size_t min_bytes_to_keep)
{
  release_cache();
  pool_.trim_to(min_bytes_to_keep);
}

void* pool_resource_base::allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
{
  if (alignment > rmm::CUDA_ALLOCATION_ALIGNMENT || !rmm::is_pow2(alignment)) {
    throw std::invalid_argument{"asyncmr: alignment " + std::to_string(alignment) +
                                " is not a power of two <= 256"};
  }
  if (bytes == 0) { return nullptr; }
  cudaStream_t const s = stream.get();
  if (cache_) { return cache_->allocate(s, bytes); }
  try {
    return pool_.allocate_async(bytes, s);
  } catch (rmm::out_of_memory const&) {
    // Caches of other resources on this pool may hold what this allocation needs.
    if (release_caches_of(pool_.handle_or_null(), nullptr) == 0) { throw; }
  }
  return pool_.allocate_async(bytes, s);
}

free_result pool_resource_base::deallocate_checked(cuda::stream_ref stream,
                                                   void* ptr,
                                                   std::size_t bytes) noexcept
{
  if (ptr == nullptr) { return {}; }
  free_result result{};
  if (cache_) {
    result = cache_->deallocate(stream.get(), ptr, bytes);
  } else if (auto const status = mem_pool::deallocate_async(ptr, stream.get());
             status != cudaSuccess) {
    result = {free_status::driver_refused, status, 0};
  }
  if (!result.ok()) { refused_frees.fetch_add(1, std::memory_order_relaxed); }
  return result;
}

void pool_resource_base::deallocate(cuda::stream_ref stream,
                                    void* ptr,
                                    std::size_t bytes,
                                    std::size_t) noexcept
{
  auto const result = deallocate_checked(stream, ptr, bytes);
  if (result.ok()) { return; }
  try {
    RMM_LOG_ERROR("%s", describe_free_failure(result, ptr, bytes).c_str());
  } catch (...) {  // NOLINT(bugprone-empty-catch): no host memory for the message
  }
  assert(result.ok());  // NOLINT: debug builds stop here, as RMM's resources do
}

void* pool_resource_base::allocate_sync(std::size_t bytes, std::size_t alignment)
{
  void* ptr = allocate(cuda::stream_ref{cudaStreamPerThread}, bytes, alignment);
  blocking_region wait;
  ASYNCMR_CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread));
  return ptr;
}

void pool_resource_base::deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept
{
  deallocate(cuda::stream_ref{cudaStreamPerThread}, ptr, bytes, alignment);
}

}  // namespace detail

std::uint64_t failed_deallocations() noexcept
{
  return detail::refused_frees.load(std::memory_order_relaxed);
}

// ---- the three resources ----------------------------------------------------------------

namespace {

location managed_location(managed_resource_options const& o, int device)
{
  return o.location.value_or(location::device(device));
}

}  // namespace

async_managed_memory_resource::async_managed_memory_resource(managed_resource_options const& o)
  : async_managed_memory_resource{o, detail::checked_device(o)}
{
}

async_managed_memory_resource::async_managed_memory_resource(managed_resource_options const& o,
                                                             int device)
  : pool_resource_base{detail::acquire_pool({.type              = allocation_type::managed,
                                             .location          = managed_location(o, device),
                                             .source            = o.source,
                                             .release_threshold = o.release_threshold,
                                             .accessible_from   = o.accessible_from,
                                             .device            = device}),
                       o.cache, device},
    device_{device}
{
}

async_managed_memory_resource::async_managed_memory_resource(mem_pool pool,
                                                             managed_resource_options const& o)
  : async_managed_memory_resource{std::move(pool), o, detail::checked_device(o)}
{
}

async_managed_memory_resource::async_managed_memory_resource(mem_pool pool,
                                                             managed_resource_options const& o,
                                                             int device)
  : pool_resource_base{[&] {
      static_cast<void>(pool.handle());
      detail::require_type(pool, allocation_type::managed, "AsyncManagedMR");
      // A host-located managed pool starts with no device access. When the driver cannot
      // say where an adopted pool lives, its answer to "can the resource's device access
      // it" decides: a pool the device cannot reach gets the grants.
      auto const w      = pool.location();
      bool const remote = w ? w->is_host() : pool.access(device) == access_mode::none;
      detail::configure_adopted_pool(pool, o.release_threshold, o.accessible_from, remote);
      return pool;
    }(), o.cache, device},
    device_{device}
{
}

async_pinned_memory_resource::async_pinned_memory_resource(pinned_resource_options const& o)
  : pool_resource_base{[&] {
      detail::require_cache_cap(o.cache);  // before any pool is touched
      auto const where = o.numa_node ? location::host_numa(*o.numa_node) : location::host();
      return detail::acquire_pool({.type              = allocation_type::pinned,
                                   .location          = where,
                                   .source            = o.source,
                                   .release_threshold = o.release_threshold,
                                   .accessible_from   = o.accessible_from,
                                   .device            = current_device()});
    }(), o.cache, std::nullopt}
{
}

async_pinned_memory_resource::async_pinned_memory_resource(mem_pool pool,
                                                           pinned_resource_options const& o)
  : pool_resource_base{[&] {
      detail::require_cache_cap(o.cache);  // before any pool is touched
      detail::require_type(pool, allocation_type::pinned, "AsyncPinnedMR");
      detail::configure_adopted_pool(pool, o.release_threshold, o.accessible_from, true);
      return pool;
    }(), o.cache, std::nullopt}
{
}

async_device_memory_resource::async_device_memory_resource(device_resource_options const& o)
  : async_device_memory_resource{o, detail::checked_device(o)}
{
}

async_device_memory_resource::async_device_memory_resource(device_resource_options const& o,
                                                           int device)
  : pool_resource_base{detail::acquire_pool({.type              = allocation_type::device,
                                             .location          = location::device(device),
                                             .source            = o.source,
                                             .release_threshold = o.release_threshold,
                                             .device            = device}),
                       o.cache, device},
    device_{device}
{
}

async_device_memory_resource::async_device_memory_resource(mem_pool pool,
                                                           device_resource_options const& o)
  : async_device_memory_resource{[&] {
      detail::require_cache_cap(o.cache);  // before any pool is touched
      detail::require_type(pool, allocation_type::device, "AsyncDeviceMR");
      detail::configure_adopted_pool(pool, o.release_threshold, std::nullopt, false);
      return pool;
    }(), o, adopted_tag{}}
{
}

async_device_memory_resource::async_device_memory_resource(mem_pool pool,
                                                           device_resource_options const& o,
                                                           adopted_tag)
  : async_device_memory_resource{pool, o, [&] {
      auto const w = pool.location();
      return (w && w->kind == location_kind::device) ? w->id : detail::resolve_device(o.device);
    }()}
{
}

async_device_memory_resource::async_device_memory_resource(mem_pool pool,
                                                           device_resource_options const& o,
                                                           int device)
  : pool_resource_base{std::move(pool), o.cache, device}, device_{device}
{
}

}  // namespace asyncmr

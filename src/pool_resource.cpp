/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include <asyncmr/async_device_memory_resource.hpp>
#include <asyncmr/async_managed_memory_resource.hpp>
#include <asyncmr/async_pinned_memory_resource.hpp>
#include <asyncmr/capability.hpp>
#include <asyncmr/detail/capture_mode.hpp>
#include <asyncmr/error.hpp>

#include "detail/driver_api.hpp"

#include <rmm/logger.hpp>

#include <mutex>
#include <type_traits>
#include <unordered_set>
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

// ---- the front cache --------------------------------------------------------------------

namespace {

std::atomic<std::uint64_t> refused_frees{0};

// The two questions a cache hit asks of the stream, asked of the driver directly: through the
// runtime each costs ~47 ns on the H200 with driver 580 (cache_bench), twice the budget a hit
// pair has for both, most of it the runtime's own checks. The runtime's special handles are
// the driver's (cudaStreamLegacy = CU_STREAM_LEGACY, cudaStreamPerThread =
// CU_STREAM_PER_THREAD, 0 = the legacy stream in code not built for per-thread default
// streams). The driver needs a current context for those; without one it refuses, and the
// runtime answers (and makes the context current for the next time).
struct stream_queries {
  int (*is_capturing)(cudaStream_t, int*)            = nullptr;  // cuStreamIsCapturing
  int (*get_id)(cudaStream_t, unsigned long long*)   = nullptr;  // cuStreamGetId
};

stream_queries const& driver_queries() noexcept
{
  static stream_queries const queries = [] {
    stream_queries q;
    auto find = [](char const* symbol, int version, auto& fn) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
        detail::driver_entry_point(symbol, version));
    };
    find("cuStreamIsCapturing", 10000, q.is_capturing);
    find("cuStreamGetId", 12000, q.get_id);
    return q;
  }();
  return queries;
}

// True when `stream` is capturing, or when that cannot be told (then the cache stays out).
bool capturing(cudaStream_t stream) noexcept
{
  if (auto* const is_capturing = driver_queries().is_capturing) {
    int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
    if (is_capturing(stream, &status) == 0) { return status != 0; }
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  auto const e                   = cudaStreamIsCapturing(stream, &status);
  clear_own_error(e);
  return e != cudaSuccess || status != cudaStreamCaptureStatusNone;
}

// The stream's id, unique for the life of the process (special handles resolve to the calling
// thread's or device's stream); false when neither the driver nor the runtime can say.
bool key_of(cudaStream_t stream, stream_key& key) noexcept
{
  unsigned long long id = 0;
  if (auto* const get_id = driver_queries().get_id; get_id != nullptr && get_id(stream, &id) == 0) {
    key = id;
    return true;
  }
  auto const e = cudaStreamGetId(stream, &id);
  clear_own_error(e);
  key = id;
  return e == cudaSuccess;
}

// Waits for every visible device, so no stream still uses any cached block.
void synchronize_devices() noexcept
{
  relaxed_capture_guard guard;
  int count = 0;
  int current = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || cudaGetDevice(&current) != cudaSuccess) {
    clear_own_error(cudaErrorInvalidValue);
    return;
  }
  for (int d = 0; d < count; ++d) {
    if (cudaSetDevice(d) == cudaSuccess) { clear_own_error(cudaDeviceSynchronize()); }
  }
  clear_own_error(cudaSetDevice(current));
}

}  // namespace

struct pool_resource_base::cache_state {
  front_cache cache;
  // Blocks allocated inside a capture belong to the graph and must never enter the cache.
  std::mutex captured_mutex;
  std::unordered_set<void*> captured;
  std::atomic<std::size_t> captured_count{0};

  explicit cache_state(std::size_t cap) : cache{cap} {}
  cache_state(cache_state const&)            = delete;
  cache_state& operator=(cache_state const&) = delete;
  ~cache_state() { release(); }

  void remember_captured(void* ptr)
  {
    std::lock_guard<std::mutex> lock{captured_mutex};
    captured.insert(ptr);
    captured_count.store(captured.size(), std::memory_order_release);
  }

  bool forget_captured(void* ptr) noexcept
  {
    if (captured_count.load(std::memory_order_acquire) == 0) { return false; }
    std::lock_guard<std::mutex> lock{captured_mutex};
    bool const found = captured.erase(ptr) != 0;
    captured_count.store(captured.size(), std::memory_order_release);
    return found;
  }

  void release() noexcept
  {
    if (cache.stats().cached_blocks == 0) { return; }
    synchronize_devices();
    cache.drain([](stream_key, void* ptr, std::size_t) noexcept {
      clear_own_error(cudaFreeAsync(ptr, cudaStreamPerThread));
    });
    clear_own_error(cudaStreamSynchronize(cudaStreamPerThread));
  }
};

pool_resource_base::pool_resource_base(mem_pool pool, std::size_t cache_bytes)
  : pool_{std::move(pool)},
    cache_{cache_bytes != 0 ? std::make_shared<cache_state>(cache_bytes) : nullptr}
{
}

pool_resource_base::~pool_resource_base() = default;

std::size_t pool_resource_base::cache_capacity() const noexcept
{
  return cache_ ? cache_->cache.cap() : 0;
}

std::optional<front_cache_stats> pool_resource_base::cache_stats() const
{
  if (!cache_) { return std::nullopt; }
  return cache_->cache.stats();
}

void pool_resource_base::release_cache()
{
  if (cache_) { cache_->release(); }
}

void pool_resource_base::trim_to(std::size_t min_bytes_to_keep)
{
  release_cache();
  pool_.trim_to(min_bytes_to_keep);
}

// ---- allocation -------------------------------------------------------------------------

void* pool_resource_base::allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
{
  if (alignment > rmm::CUDA_ALLOCATION_ALIGNMENT || !rmm::is_pow2(alignment)) {
    throw std::invalid_argument{"asyncmr: alignment " + std::to_string(alignment) +
                                " is not a power of two <= 256"};
  }
  if (bytes == 0) { return nullptr; }
  cudaStream_t const s = stream.get();
  if (cache_) {
    auto& c               = *cache_;
    std::size_t const cls = c.cache.class_size(bytes);
    if (cls != 0) {
      if (capturing(s)) {
        void* ptr = pool_.allocate_async(cls, s);
        c.remember_captured(ptr);
        return ptr;
      }
      stream_key key{};
      if (key_of(s, key)) {
        if (pool_.closed()) {
          throw pool_closed_error{"asyncmr: allocating from a memory pool that was closed"};
        }
        if (void* ptr = c.cache.take(key, bytes)) { return ptr; }
      }
      // Every cacheable block has its class size, so any block of the class can serve a later
      // request of the class.
      return pool_.allocate_async(cls, s);
    }
  }
  return pool_.allocate_async(bytes, s);
}

cudaError_t pool_resource_base::deallocate_checked(cuda::stream_ref stream,
                                                   void* ptr,
                                                   std::size_t bytes) noexcept
{
  if (ptr == nullptr) { return cudaSuccess; }
  cudaStream_t const s = stream.get();
  if (cache_ && cache_->cache.class_size(bytes) != 0 && !cache_->forget_captured(ptr) &&
      !capturing(s)) {
    stream_key key{};
    if (key_of(s, key) && cache_->cache.put(key, ptr, bytes)) { return cudaSuccess; }
  }
  auto const status = mem_pool::deallocate_async(ptr, s);
  if (status != cudaSuccess) { refused_frees.fetch_add(1, std::memory_order_relaxed); }
  return status;
}

void pool_resource_base::deallocate(cuda::stream_ref stream,
                                    void* ptr,
                                    std::size_t bytes,
                                    std::size_t) noexcept
{
  auto const status = deallocate_checked(stream, ptr, bytes);
  if (status == cudaSuccess) { return; }
  char text[32];
  std::snprintf(text, sizeof text, "%p", ptr);
  RMM_LOG_ERROR("asyncmr: cudaFreeAsync(%s, %zu bytes) failed: %s (%s); a double free, or a "
                "pointer this resource did not allocate?",
                text, bytes, cudaGetErrorName(status), cudaGetErrorString(status));
  assert(status == cudaSuccess);  // NOLINT: debug builds stop here, as RMM's resources do
}

void* pool_resource_base::allocate_sync(std::size_t bytes, std::size_t alignment)
{
  void* ptr = allocate(cuda::stream_ref{cudaStreamPerThread}, bytes, alignment);
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
                       o.cache},
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
    }(), o.cache},
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
    }(), o.cache}
{
}

async_pinned_memory_resource::async_pinned_memory_resource(mem_pool pool,
                                                           pinned_resource_options const& o)
  : pool_resource_base{[&] {
      detail::require_cache_cap(o.cache);  // before any pool is touched
      detail::require_type(pool, allocation_type::pinned, "AsyncPinnedMR");
      detail::configure_adopted_pool(pool, o.release_threshold, o.accessible_from, true);
      return pool;
    }(), o.cache}
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
                       o.cache},
    device_{device}
{
}

async_device_memory_resource::async_device_memory_resource(mem_pool pool,
                                                           device_resource_options const& o)
  : pool_resource_base{[&] {
      detail::require_cache_cap(o.cache);  // before any pool is touched
      detail::require_type(pool, allocation_type::device, "AsyncDeviceMR");
      detail::configure_adopted_pool(pool, o.release_threshold, std::nullopt, false);
      return pool;
    }(), o.cache},
    device_{[&] {
      auto const w = this->pool().location();
      return (w && w->kind == location_kind::device) ? w->id : detail::resolve_device(o.device);
    }()}
{
}

}  // namespace asyncmr

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include <asyncmr/async_device_memory_resource.hpp>
#include <asyncmr/async_managed_memory_resource.hpp>
#include <asyncmr/async_pinned_memory_resource.hpp>
#include <asyncmr/capability.hpp>
#include <asyncmr/error.hpp>

#include "detail/history_state.hpp"
#include "detail/placement.hpp"
#include "detail/stream_cache.hpp"
#include "detail/stream_queries.hpp"

#include <asyncmr/detail/blocking.hpp>
#include <asyncmr/detail/capture_mode.hpp>

#include <rmm/logger.hpp>

#include <atomic>
#include <cassert>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

namespace asyncmr {
namespace detail {

// ---- allocation -------------------------------------------------------------------------

namespace {

std::atomic<std::uint64_t> refused_frees{0};
std::atomic<std::uint64_t> refused_prefetches{0};

std::string address(void const* ptr)
{
  char text[32];
  std::snprintf(text, sizeof text, "%p", ptr);
  return text;
}

// An event's own part (when, which block, how large, which stream, the cache's bytes), in one
// place for note_event() and note_pool(); the pool's part and the action are theirs to fill.
history_event event_at(std::uint64_t now,
                       void const* ptr,
                       std::size_t bytes,
                       cudaStream_t stream,
                       std::size_t cached) noexcept
{
  history_event e{};
  e.time_ns = now;
  e.address = reinterpret_cast<std::uintptr_t>(ptr);
  e.bytes   = bytes;
  e.stream  = reinterpret_cast<std::uintptr_t>(stream);
  e.cached  = cached;
  return e;
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
  if (result.error == cudaErrorStreamCaptureImplicit) {
    return "asyncmr: cannot free " + block + " on the legacy default stream now: CUDA refuses "
           "any call there while a blocking stream captures (cudaErrorStreamCaptureImplicit). "
           "The block is still yours: free it once the capture has ended. Every capture is "
           "still valid.";
  }
  return "asyncmr: cudaFreeAsync(" + block + ") failed: " + cudaGetErrorName(result.error) +
         " (" + cudaGetErrorString(result.error) + "); a double free, or a pointer this "
         "resource did not allocate?";
}

pool_resource_base::pool_resource_base(resolved_pool resolved)
  : pool_{std::move(resolved.pool)},
    device_{resolved.device},
    cache_{resolved.cache != 0 ? stream_cache::make(pool_, resolved.cache, device_) : nullptr},
    history_{std::make_shared<history_state>()},
    prefetch_{resolved.prefetch},
    discard_{resolved.discard}
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
    throw_cuda_error(status, "waiting for the front cache's release stream (the blocks were "
                             "freed in its order, behind the streams that used them)");
  }
}

// Stamps from `then` to `now`, 0 when `then` is the later: a free is stamped before it is made,
// so another thread's read of the pool may come after its stamp (the difference must not wrap).
[[gnu::always_inline]] inline std::uint64_t stamps_since(std::uint64_t now,
                                                         std::uint64_t then) noexcept
{
  return now > then ? now - then : 0;
}

// The events of a pair (alloc, free, cache_hit, cache_put) are stamped inline by note_event;
// what asks the driver is out of line here: a read of the pool when it is due, when an
// allocation may have grown it, and for every oom and trim_to (straight from their callers).
//
// How a recording follows the pool's reserved and used bytes without asking the driver on every
// event (two attribute reads cost several times an uncached pair: benchmark section 11):
// `used` moves by each allocation's and free's bytes; the pool itself is read when an
// allocation may grow it (fewer known unused reserved bytes than it asks for), when the last
// read is older than history_pool_read_ns, and on every oom and trim_to. Each read sets both
// values exactly. A grow or trim event is stamped a tick before the event whose read sees the
// change.
void pool_resource_base::note_read(history_ring& ring,
                                   history_event e,
                                   bool forced) noexcept
{
  history_state& h   = *history_;
  std::uint64_t last = h.last_reserved.load(std::memory_order_relaxed);
  bool read_pool     = forced;
  if (read_pool) {
    h.last_read.store(e.time_ns, std::memory_order_relaxed);
  } else if (std::uint64_t read_at = h.last_read.load(std::memory_order_relaxed);
             stamps_since(e.time_ns, read_at) >= h.read_period.load(std::memory_order_relaxed)) {
    // One thread reads for all of them; the others record the known state.
    read_pool = h.last_read.compare_exchange_strong(read_at, e.time_ns, std::memory_order_relaxed);
  }
  if (read_pool && !h.period_settled.load(std::memory_order_relaxed)) [[unlikely]] {
    h.measure_read_period();  // the process's first moments: the rate is measured over longer now
  }
  if (read_pool) {
    // Relaxed capture mode inside get_attribute: safe while any stream captures.
    try {
      e.reserved = pool_.get_attribute(pool_attribute::reserved_mem_current);
      e.used     = pool_.get_attribute(pool_attribute::used_mem_current);
      h.last_used.store(e.used, std::memory_order_relaxed);
    } catch (...) {  // NOLINT(bugprone-empty-catch): the last known state stands
      read_pool = false;
    }
  }
  if (read_pool && e.reserved != last &&
      h.last_reserved.compare_exchange_strong(last, e.reserved, std::memory_order_relaxed)) {
    history_event change = e;
    change.action        = e.reserved > last ? history_action::grow : history_action::trim;
    change.address       = 0;
    change.bytes         = e.reserved > last ? e.reserved - last : last - e.reserved;
    // A tick before the event that found it (the growth served that allocation; a trim came
    // before the read): read back in time order, events of one stamp fall back to their numbers,
    // which do not always rise in a thread's order (a thread may continue a chunk another let go).
    change.time_ns = e.time_ns > 0 ? e.time_ns - 1 : 0;
    ring.record(change, &h.recordings);
  }
  if (e.action == history_action::trim) { return; }  // a trim call: only what it changed
  ring.record(e, &h.recordings);
}

// Inlined into allocate and deallocate_checked, every event of a pair: a cache hit or put leaves
// the pool's known state as it is; an allocation or free moves `used` by its bytes. note_read
// takes over when the pool is due for a read, or when an allocation may have grown it (fewer
// known reserved bytes than used with it).
[[gnu::always_inline]] inline void pool_resource_base::note_event(history_ring& ring,
                                                                  history_action action,
                                                                  void const* ptr,
                                                                  std::size_t bytes,
                                                                  cudaStream_t stream,
                                                                  std::uint64_t now) noexcept
{
  history_state& h = *history_;
  history_event e = event_at(now, ptr, bytes, stream, cache_ ? cache_->charged_bytes() : 0);
  e.action        = action;
  e.reserved      = h.last_reserved.load(std::memory_order_relaxed);
  e.used          = h.last_used.load(std::memory_order_relaxed);
  // `used` moves by a load and a store, not a read-modify-write: two locked instructions an
  // uncached pair would add to each recorded pair (benchmark section 11 measures the recording's
  // cost). Events racing on several threads may lose each other's move
  // until the next read of the pool sets it right (at most history_pool_read_ns later); one
  // thread's events are exact between reads.
  bool may_grow = false;
  if (action == history_action::alloc) {
    e.used += bytes;
    may_grow = e.reserved < e.used;
    h.last_used.store(e.used, std::memory_order_relaxed);
  } else if (action == history_action::free) {
    e.used = e.used > bytes ? e.used - bytes : 0;
    h.last_used.store(e.used, std::memory_order_relaxed);
  }
  if (may_grow || stamps_since(now, h.last_read.load(std::memory_order_relaxed)) >=
                    h.read_period.load(std::memory_order_relaxed)) [[unlikely]] {
    note_read(ring, e, may_grow);
    return;
  }
  ring.record(e, &h.recordings);
}

// An oom or a trim: the pool read now, the event stamped with what it says.
void pool_resource_base::note_pool(history_ring& ring,
                                   history_action action,
                                   std::size_t bytes,
                                   cudaStream_t stream) noexcept
{
  history_state& h = *history_;
  history_event e  = event_at(history_stamp(), nullptr, bytes, stream,
                             cache_ ? cache_->charged_bytes() : 0);
  e.action         = action;
  e.reserved       = h.last_reserved.load(std::memory_order_relaxed);
  e.used           = h.last_used.load(std::memory_order_relaxed);
  note_read(ring, e, true);
}

void pool_resource_base::trim_to(std::size_t min_bytes_to_keep)
{
  release_cache();
  pool_.trim_to(min_bytes_to_keep);
  if (history_ring* const ring = history_ ? history_->recordings.active() : nullptr) {
    note_pool(*ring, history_action::trim, 0, nullptr);
  }
}

void* pool_resource_base::allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
{
  if (alignment > rmm::CUDA_ALLOCATION_ALIGNMENT || !rmm::is_pow2(alignment)) {
    throw std::invalid_argument{"asyncmr: alignment " + std::to_string(alignment) +
                                " is not a power of two <= 256"};
  }
  if (bytes == 0) { return nullptr; }
  cudaStream_t const s = stream.get();
  history_ring* const ring = history_ ? history_->recordings.active() : nullptr;
  if (ring == nullptr && !prefetch_) {
    if (cache_) { return cache_->allocate(s, bytes); }
    return allocate_giving_caches_back(pool_, bytes, s);  // other resources' caches on this pool
  }
  if (ring == nullptr) {
    void* const ptr = cache_ ? cache_->allocate(s, bytes) : allocate_giving_caches_back(pool_, bytes, s);
    prefetch(ptr, bytes, s);
    return ptr;
  }
  bool hit  = false;
  void* ptr = nullptr;
  try {
    ptr = cache_ ? cache_->allocate(s, bytes, &hit) : allocate_giving_caches_back(pool_, bytes, s);
  } catch (rmm::out_of_memory const&) {
    note_pool(*ring, history_action::oom, bytes, s);
    throw;
  }
  note_event(*ring, hit ? history_action::cache_hit : history_action::alloc, ptr, bytes, s,
             history_stamp());
  if (prefetch_) { prefetch(ptr, bytes, s); }
  return ptr;
}

void pool_resource_base::prefetch(void* ptr, std::size_t bytes, cudaStream_t stream) const noexcept
{
  // A prefetch on a capturing stream invalidates the capture (docs/DRIVER_FACTS.md): a graph's
  // allocation is not prefetched.
  if (ptr == nullptr || stream_capturing(stream)) { return; }
  relaxed_capture_guard guard;  // another thread's global-mode capture: neither refused nor broken
  cudaError_t const status = discard_ ? discard_and_prefetch_async(ptr, bytes, *prefetch_, stream)
                                      : prefetch_async(ptr, bytes, *prefetch_, stream);
  if (status != cudaSuccess) {
    clear_own_error(status);
    refused_prefetches.fetch_add(1, std::memory_order_relaxed);
  }
}

free_result pool_resource_base::deallocate_checked(cuda::stream_ref stream,
                                                   void* ptr,
                                                   std::size_t bytes) noexcept
{
  if (ptr == nullptr) { return {}; }
  // The recording read, and the free stamped, before the free (see note_event), as an
  // allocation reads it before its driver call.
  history_ring* const ring  = history_ ? history_->recordings.active() : nullptr;
  std::uint64_t const stamp = ring != nullptr ? history_stamp() : 0;
  free_result const result  = cache_ ? cache_->deallocate(stream.get(), ptr, bytes)
                                     : free_to_pool(pool_, ptr, stream.get());
  if (!result.ok()) {
    refused_frees.fetch_add(1, std::memory_order_relaxed);
  } else if (ring != nullptr) {
    note_event(*ring, result.cached ? history_action::cache_put : history_action::free, ptr,
               bytes, stream.get(), stamp);
  }
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
  // The wait below cannot be made on a stream this thread captures (the driver refuses it and
  // invalidates the capture): refused before anything is allocated.
  if (stream_capturing(cudaStreamPerThread)) {
    throw unsupported_error{
      "asyncmr: allocate_sync on a thread that captures its per-thread default stream: waiting "
      "for the allocation would invalidate the capture; allocate on the capturing stream "
      "(allocate(stream, bytes)) instead"};
  }
  // Relaxed: another capture (this thread's of another stream, or any thread's in global mode)
  // would otherwise refuse the allocation on the per-thread stream and the wait, and be
  // invalidated by them (the allocation's refusal: docs/DRIVER_FACTS.md).
  relaxed_capture_guard guard;
  void* ptr = allocate(cuda::stream_ref{cudaStreamPerThread}, bytes, alignment);
  cudaError_t status{};
  {
    blocking_region wait;
    status = cudaStreamSynchronize(cudaStreamPerThread);
  }
  if (status != cudaSuccess) {
    // The caller never sees the block: it goes back (in the stream's order) before the throw,
    // and a refusal of that free too (the context may be gone) is not a second error.
    static_cast<void>(deallocate_checked(cuda::stream_ref{cudaStreamPerThread}, ptr, bytes));
    throw_cuda_error(status, "cudaStreamSynchronize after allocate_sync's allocation");
  }
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

std::uint64_t failed_prefetches() noexcept
{
  return detail::refused_prefetches.load(std::memory_order_relaxed);
}

// ---- the three resources ----------------------------------------------------------------
// Each constructor is the one resolution (src/resource_options.cpp) for its kind of memory.

async_managed_memory_resource::async_managed_memory_resource(resource_options const& o)
  : pool_resource_base{detail::resolve_pool(allocation_type::managed, o, nullptr)}
{
}

async_managed_memory_resource::async_managed_memory_resource(mem_pool pool,
                                                             resource_options const& o)
  : pool_resource_base{detail::resolve_pool(allocation_type::managed, o, &pool)}
{
}

async_pinned_memory_resource::async_pinned_memory_resource(resource_options const& o)
  : pool_resource_base{detail::resolve_pool(allocation_type::pinned, o, nullptr)}
{
}

async_pinned_memory_resource::async_pinned_memory_resource(mem_pool pool,
                                                           resource_options const& o)
  : pool_resource_base{detail::resolve_pool(allocation_type::pinned, o, &pool)}
{
}

async_device_memory_resource::async_device_memory_resource(resource_options const& o)
  : pool_resource_base{detail::resolve_pool(allocation_type::device, o, nullptr)}
{
}

async_device_memory_resource::async_device_memory_resource(mem_pool pool,
                                                           resource_options const& o)
  : pool_resource_base{detail::resolve_pool(allocation_type::device, o, &pool)}
{
}

}  // namespace asyncmr

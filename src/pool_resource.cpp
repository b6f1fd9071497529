/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The resources' shared base (asyncmr/pool_resource.hpp): the pool and the parts composed in
// front of it, and the three resources' constructors.

#include <asyncmr/async_device_memory_resource.hpp>
#include <asyncmr/async_managed_memory_resource.hpp>
#include <asyncmr/async_pinned_memory_resource.hpp>
#include <asyncmr/capability.hpp>
#include <asyncmr/error.hpp>

#include "detail/front_cache.hpp"
#include "detail/history_recorder.hpp"
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

std::uint64_t failed_deallocations() noexcept
{
  return refused_frees.load(std::memory_order_relaxed);
}

pool_resource::pool_resource(detail::resolved_pool resolved)
  : pool_{std::move(resolved.pool)},
    device_{resolved.device},
    cache_{resolved.cache != 0 ? detail::front_cache::make(pool_, resolved.cache, device_)
                               : nullptr},
    history_{std::make_shared<detail::history_recorder>()}
{
  if (resolved.prefetch) { placement_.emplace(*resolved.prefetch, resolved.discard); }
}

pool_resource::~pool_resource() = default;

std::size_t pool_resource::cache_capacity() const noexcept { return cache_ ? cache_->cap() : 0; }

std::optional<front_cache_stats> pool_resource::cache_stats() const
{
  if (!cache_) { return std::nullopt; }
  return cache_->stats();
}

void pool_resource::release_cache()
{
  if (!cache_) { return; }
  if (auto const status = cache_->release(); status != cudaSuccess) {
    detail::throw_cuda_error(status, "waiting for the front cache's release stream (the blocks were "
                             "freed in its order, behind the streams that used them)");
  }
}

void pool_resource::trim_to(std::size_t min_bytes_to_keep)
{
  release_cache();
  pool_.trim_to(min_bytes_to_keep);
  if (detail::history_ring* const ring = history_ ? history_->active() : nullptr) {
    history_->pool_event(*ring, pool_, history_action::trim, 0, nullptr,
                         cache_ ? cache_->charged_bytes() : 0);
  }
}

// ---- allocation history ---------------------------------------------------------------------

void pool_resource::start_history(std::size_t max_events) { history_->start(pool_, max_events); }

std::vector<history_event> pool_resource::stop_history(std::uint64_t& dropped)
{
  return history_->stop(dropped);
}

std::vector<history_event> pool_resource::read_history(std::uint64_t& dropped) const
{
  if (!history_) { throw std::logic_error{"asyncmr: no history is being recorded on this resource"}; }
  return history_->read(dropped);
}

bool pool_resource::recording_history() const noexcept
{
  return history_ && history_->active() != nullptr;
}

std::optional<location> pool_resource::prefetch_target() const noexcept
{
  return placement_ ? std::optional{placement_->target()} : std::nullopt;
}

bool pool_resource::prefetch_discards() const noexcept
{
  return placement_ && placement_->discards();
}

// ---- allocation -----------------------------------------------------------------------------

void* pool_resource::allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
{
  if (alignment > rmm::CUDA_ALLOCATION_ALIGNMENT || !rmm::is_pow2(alignment)) {
    throw std::invalid_argument{"asyncmr: alignment " + std::to_string(alignment) +
                                " is not a power of two <= 256"};
  }
  if (bytes == 0) { return nullptr; }
  cudaStream_t const s            = stream.get();
  detail::history_ring* const ring = history_ ? history_->active() : nullptr;
  if (ring == nullptr && !placement_) [[likely]] {
    if (cache_) { return cache_->allocate(s, bytes); }
    return detail::allocate_giving_caches_back(pool_, bytes, s);  // other caches on this pool
  }
  bool hit  = false;
  void* ptr = nullptr;
  try {
    ptr = cache_ ? cache_->allocate(s, bytes, &hit) : detail::allocate_giving_caches_back(pool_, bytes, s);
  } catch (rmm::out_of_memory const&) {
    if (ring != nullptr) {
      history_->pool_event(*ring, pool_, history_action::oom, bytes, s,
                           cache_ ? cache_->charged_bytes() : 0);
    }
    throw;
  }
  if (ring != nullptr) {
    history_->pair(*ring, pool_, hit ? history_action::cache_hit : history_action::alloc, ptr,
                   bytes, s, detail::history_stamp(), cache_ ? cache_->charged_bytes() : 0);
  }
  if (placement_) { placement_->place(ptr, bytes, s); }
  return ptr;
}

free_result pool_resource::deallocate_checked(cuda::stream_ref stream,
                                              void* ptr,
                                              std::size_t bytes) noexcept
{
  if (ptr == nullptr) { return {}; }
  // The recording read, and the free stamped, before the free (see history_recorder::pair), as
  // an allocation reads it before its driver call.
  detail::history_ring* const ring = history_ ? history_->active() : nullptr;
  std::uint64_t const stamp        = ring != nullptr ? detail::history_stamp() : 0;
  free_result const result         = cache_ ? cache_->deallocate(stream.get(), ptr, bytes)
                                            : detail::free_to_pool(pool_, ptr, stream.get());
  if (!result.ok()) {
    refused_frees.fetch_add(1, std::memory_order_relaxed);
  } else if (ring != nullptr) {
    history_->pair(*ring, pool_, result.cached ? history_action::cache_put : history_action::free,
                   ptr, bytes, stream.get(), stamp, cache_ ? cache_->charged_bytes() : 0);
  }
  return result;
}

void pool_resource::deallocate(cuda::stream_ref stream,
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

void* pool_resource::allocate_sync(std::size_t bytes, std::size_t alignment)
{
  // The wait below cannot be made on a stream this thread captures (the driver refuses it and
  // invalidates the capture): refused before anything is allocated.
  if (detail::stream_capturing(cudaStreamPerThread)) {
    throw unsupported_error{
      "asyncmr: allocate_sync on a thread that captures its per-thread default stream: waiting "
      "for the allocation would invalidate the capture; allocate on the capturing stream "
      "(allocate(stream, bytes)) instead"};
  }
  // Relaxed: another capture (this thread's of another stream, or any thread's in global mode)
  // would otherwise refuse the allocation on the per-thread stream and the wait, and be
  // invalidated by them (the allocation's refusal: docs/DRIVER_FACTS.md).
  detail::relaxed_capture_guard guard;
  void* ptr = allocate(cuda::stream_ref{cudaStreamPerThread}, bytes, alignment);
  cudaError_t status{};
  {
    detail::blocking_region wait;
    status = cudaStreamSynchronize(cudaStreamPerThread);
  }
  if (status != cudaSuccess) {
    // The caller never sees the block: it goes back (in the stream's order) before the throw,
    // and a refusal of that free too (the context may be gone) is not a second error.
    static_cast<void>(deallocate_checked(cuda::stream_ref{cudaStreamPerThread}, ptr, bytes));
    detail::throw_cuda_error(status, "cudaStreamSynchronize after allocate_sync's allocation");
  }
  return ptr;
}

void pool_resource::deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept
{
  deallocate(cuda::stream_ref{cudaStreamPerThread}, ptr, bytes, alignment);
}

// ---- the three resources ----------------------------------------------------------------
// Each constructor is the one resolution (src/resource_options.cpp) for its kind of memory.

async_managed_memory_resource::async_managed_memory_resource(resource_options const& o)
  : pool_resource{detail::resolve_pool(allocation_type::managed, o, nullptr)}
{
}

async_managed_memory_resource::async_managed_memory_resource(mem_pool pool,
                                                             resource_options const& o)
  : pool_resource{detail::resolve_pool(allocation_type::managed, o, &pool)}
{
}

async_pinned_memory_resource::async_pinned_memory_resource(resource_options const& o)
  : pool_resource{detail::resolve_pool(allocation_type::pinned, o, nullptr)}
{
}

async_pinned_memory_resource::async_pinned_memory_resource(mem_pool pool,
                                                           resource_options const& o)
  : pool_resource{detail::resolve_pool(allocation_type::pinned, o, &pool)}
{
}

async_device_memory_resource::async_device_memory_resource(resource_options const& o)
  : pool_resource{detail::resolve_pool(allocation_type::device, o, nullptr)}
{
}

async_device_memory_resource::async_device_memory_resource(mem_pool pool,
                                                           resource_options const& o)
  : pool_resource{detail::resolve_pool(allocation_type::device, o, &pool)}
{
}

}  // namespace asyncmr

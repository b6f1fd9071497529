/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The front cache bound to CUDA streams and to a pool (detail/front_cache.hpp), the registry of
// live caches per pool, and the background reclaimer of idle streams' blocks.

#include "detail/front_cache.hpp"
#include "detail/stream_queries.hpp"

#include "detail/device_sync.hpp"
#include "detail/driver_api.hpp"
#include "detail/text.hpp"

#include <asyncmr/detail/blocking.hpp>
#include <asyncmr/detail/capture_mode.hpp>
#include <asyncmr/error.hpp>

#include <rmm/error.hpp>
#include <rmm/logger.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace asyncmr::detail {

std::atomic<void (*)(cudaStream_t) noexcept> testing_put_hook{nullptr};

namespace {

// ---- the markers: a CUDA event per stream, and the release stream's wait for it ----------------
//
// A put records its bucket's event on the block's stream (the stream is alive: the caller is
// freeing on it); parking the bucket makes the cache's release stream wait for that event; the
// parked blocks are then freed on the release stream. All three are stream-ordered calls on
// streams nobody captures, so a release is correct while its blocks' streams are gone, and
// leaves every capture on the device valid (a device-wide synchronization would invalidate
// them: docs/DRIVER_FACTS.md).

// The last context this thread found not primary: the puts on a user context's stream, each
// refused, ask every device once, not at every free. Only the "no" is kept. A primary context
// the driver makes later at that address is then refused too, which costs hits and orders every
// block rightly (refused blocks go to the pool in their stream's order); a "yes" kept could
// outlive its primary context (cuDevicePrimaryCtxReset) and make a marker in a user's context.
thread_local void* not_primary = nullptr;

// An event in the context of `stream` (a bucket may be reused for a stream of another device or
// context than the one that made its event), or nullptr. That context is pushed for the call
// and popped after it, so the thread's own current context, a non-primary one or none, is left
// as it was (a cudaSetDevice round trip would replace a non-primary context by a primary one,
// and make device 0's primary context where the thread had none, on a device it never used).
// Only in a primary context: one the user made (cuCtxCreate) may be destroyed while the bucket
// holds blocks, and its events with it, leaving the release a destroyed event to wait for (or
// whichever event took its address). A free on such a stream is refused instead, and goes to
// the pool in that stream's own order.
cudaEvent_t make_marker(cudaStream_t stream) noexcept
{
  void* const context = stream_context(stream);
  if (context == nullptr || context == not_primary) { return nullptr; }
  if (!primary_context(context)) {
    not_primary = context;
    return nullptr;
  }
  context_scope const in_stream_context{context};
  if (!in_stream_context.ok()) { return nullptr; }
  cudaEvent_t event = nullptr;
  auto const status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  clear_own_error(status);
  return status == cudaSuccess ? event : nullptr;
}

// A bucket's marker: the event that holds its stream's order, and a spare that each put records
// first. They trade places only once the stream is known not to capture after the record: a
// capture may begin on the stream between the owner's last look and the record (another thread
// calls cudaStreamBeginCapture), and an event recorded into a capture must never order a
// release (the release stream would join the capture, and every free on it would fail).
struct marker_pair {
  cudaEvent_t order{nullptr};
  cudaEvent_t spare{nullptr};
};

// Records `event`, or a fresh one made in `stream`'s context when `event` is null or of another
// context (the bucket now serves a stream of another device or context). Returns the event
// recorded, or nullptr; `event` is destroyed when replaced.
cudaEvent_t record_marker(cudaEvent_t event, cudaStream_t stream) noexcept
{
  if (event != nullptr) {
    auto const status = record_event(event, stream);
    if (status == cudaSuccess) { return event; }
    clear_own_error(status);
    clear_own_error(cudaEventDestroy(event));
  }
  cudaEvent_t const fresh = make_marker(stream);
  if (fresh == nullptr) { return nullptr; }
  auto const status = record_event(fresh, stream);
  if (status == cudaSuccess) { return fresh; }
  clear_own_error(status);
  clear_own_error(cudaEventDestroy(fresh));
  return nullptr;
}

mark_result mark_stream(void*, void*& marker, void* stream) noexcept
{
  auto const s = static_cast<cudaStream_t>(stream);
  auto* pair   = static_cast<marker_pair*>(marker);
  if (pair == nullptr) {
    pair = new (std::nothrow) marker_pair{};
    if (pair == nullptr) { return mark_result::unmarkable; }
    marker = pair;
  }
  cudaEvent_t const recorded = record_marker(pair->spare, s);
  pair->spare                = recorded;
  // Never recorded: the old order stays (a wait for an event never recorded would return at
  // once, and the bucket's earlier blocks would be freed without their stream's order).
  if (recorded == nullptr) { return mark_result::unmarkable; }
  // The legacy stream never captures (and is not asked: see legacy_stream).
  if (!legacy_stream(s) && stream_capturing(s)) {
    // A capture began on the stream after the caller looked: the record is the graph's, and no
    // event can hold the stream's order from before the capture any more. The old order does
    // not cover this block's last use either, so the bucket keeps no order until its stream's
    // next put records one (the bucket's blocks stay cached until then, or go back in the
    // stream's own order). The driver refuses the free itself inside the capture: a free node
    // takes only a graph's allocation.
    if (pair->order != nullptr) { clear_own_error(cudaEventDestroy(pair->order)); }
    pair->order = nullptr;
    return mark_result::capturing;
  }
  pair->spare = pair->order;
  pair->order = recorded;
  return mark_result::marked;
}

bool order_release(void* streams, void* marker) noexcept
{
  auto const* pair = static_cast<marker_pair const*>(marker);
  if (pair == nullptr || pair->order == nullptr) { return false; }
  auto const status =
    cudaStreamWaitEvent(static_cast<release_stream*>(streams)->stream, pair->order, 0);
  clear_own_error(status);
  return status == cudaSuccess;
}

void destroy_marker(void*, void* marker) noexcept
{
  auto* const pair = static_cast<marker_pair*>(marker);
  for (cudaEvent_t const e : {pair->order, pair->spare}) {
    if (e != nullptr) { clear_own_error(cudaEventDestroy(e)); }
  }
  delete pair;
}

// ---- the registry of live caches, per pool ---------------------------------------------------

struct cache_registry {
  spin_lock lock;
  std::vector<std::weak_ptr<front_cache>> caches;
};

cache_registry& registry() noexcept
{
  static auto* r = new cache_registry{};  // never destroyed: caches die until the process ends
  return *r;
}

// mem_pool::close's hook: a closed pool's blocks leave every cache on it before it retires.
void release_caches_of_closing(cudaMemPool_t pool) noexcept
{
  static_cast<void>(release_caches_of(pool, nullptr));
}

void register_cache(std::shared_ptr<front_cache> const& cache)
{
  set_pool_closing_hook(&release_caches_of_closing);
  auto& r = registry();
  r.lock.lock();
  try {
    std::erase_if(r.caches, [](auto const& w) { return w.expired(); });
    r.caches.push_back(cache);
  } catch (...) {
    r.lock.unlock();
    throw;
  }
  r.lock.unlock();
}

// ---- the background reclaimer ----------------------------------------------------------------
//
// How long a stream's bucket must go unused before pressure on the cap may take its blocks
// (block_cache's shortest epoch): long enough that a stream waiting for a kernel keeps them,
// short enough that the blocks of destroyed streams come back within a moment of pressure.
constexpr std::uint64_t stale_after_ns = 100'000'000;  // 100 ms
//
// One thread for the process, started the first time a cache asks, that reclaims the blocks of
// streams idle for a whole epoch (block_cache::detach_stale): their streams may be gone, so the
// blocks go back in the release stream's order, and the thread that noticed the pressure
// (inside a free) should not scan every bucket. Its state is never destroyed, and at exit it
// stops taking work.

struct reclaimer_state {
  std::mutex mutex;
  std::condition_variable wake;
  std::condition_variable idle;
  std::vector<std::weak_ptr<front_cache>> queue;
  bool started{false};
  bool busy{false};
  bool exiting{false};
};

reclaimer_state& reclaimer() noexcept
{
  static auto* s = new reclaimer_state{};
  return *s;
}

void reclaimer_loop() noexcept
{
  auto& s = reclaimer();
  std::vector<std::weak_ptr<front_cache>> work;
  for (;;) {
    {
      std::unique_lock lock{s.mutex};
      s.busy = false;
      s.idle.notify_all();
      s.wake.wait(lock, [&] { return s.exiting || !s.queue.empty(); });
      if (s.exiting) { return; }
      work.swap(s.queue);
      s.busy = true;
    }
    for (auto& weak : work) {
      if (auto cache = weak.lock()) { cache->reclaim_stale(); }
    }
    work.clear();
  }
}

void stop_reclaimer() noexcept
{
  // At exit: let a reclaim in progress finish (it waits for nothing, but the runtime may be
  // slow to answer while it shuts down: then give up after a while) before the runtime goes.
  auto& s = reclaimer();
  std::unique_lock lock{s.mutex};
  s.exiting = true;
  s.wake.notify_all();
  s.idle.wait_for(lock, std::chrono::seconds{2}, [&] { return !s.busy; });
}

}  // namespace

void request_reclaim(std::weak_ptr<front_cache> cache) noexcept
{
  auto& s = reclaimer();
  try {
    std::lock_guard lock{s.mutex};
    if (s.exiting) { return; }
    // Compared by owner, never locked: a strong reference made here could become a cache's
    // last and run its end (which lets the GIL go) under this mutex.
    for (auto const& queued : s.queue) {
      if (!queued.owner_before(cache) && !cache.owner_before(queued)) { return; }  // asked for
    }
    // The thread first: a request queued for a thread that failed to start would stay queued,
    // and refuse every later request of its cache as already made.
    if (!s.started) {
      std::thread{reclaimer_loop}.detach();
      s.started = true;
      std::atexit(stop_reclaimer);
    }
    s.queue.push_back(std::move(cache));
    s.wake.notify_one();
  } catch (...) {  // NOLINT(bugprone-empty-catch): no thread or no memory: the blocks wait
  }
}

free_result free_to_pool(mem_pool const& pool, void* ptr, cudaStream_t stream) noexcept
{
  auto const status = pool.deallocate_async(ptr, stream);
  return status == cudaSuccess ? free_result{}
                               : free_result{free_status::driver_refused, status, 0};
}

void* allocate_giving_caches_back(mem_pool const& pool, std::size_t bytes, cudaStream_t stream)
{
  caches_given_back given;
  try {
    return pool.allocate_async(bytes, stream);
  } catch (rmm::out_of_memory const& e) {
    // A cache must never be the reason an allocation fails: the caches on this pool may hold
    // what it needs.
    given = release_caches_of(pool.handle_or_null(), nullptr);
    if (given.caches == 0) {
      throw rmm::out_of_memory{std::string{e.what()} +
                               "; front caches on this pool: none to give memory back"};
    }
  }
  try {
    return pool.allocate_async(bytes, stream);
  } catch (rmm::out_of_memory const& again) {
    throw rmm::out_of_memory{std::string{again.what()} + "; front caches on this pool: " +
                             std::to_string(given.blocks) + " cached blocks given back, still short"};
  }
}

caches_given_back release_caches_of(cudaMemPool_t pool, front_cache const* except) noexcept
{
  // The weak pointers are copied under the lock and locked after it: a cache whose last owner
  // goes meanwhile is destroyed here, and its destruction (which lets the GIL go and takes it
  // back) must not run under the registry's spin lock, which a thread holding the GIL may be
  // spinning on.
  std::vector<std::weak_ptr<front_cache>> all;
  auto& r = registry();
  r.lock.lock();
  try {
    all = r.caches;
  } catch (...) {  // NOLINT(bugprone-empty-catch): no host memory: nothing to ask
  }
  r.lock.unlock();
  caches_given_back given;
  for (auto const& weak : all) {
    auto const c = weak.lock();
    if (!c || c.get() == except || c->made_for() != pool) { continue; }
    std::size_t const before = c->stats().cached_blocks;
    if (c->release() == cudaSuccess) {
      ++given.caches;
      given.blocks += before;
    }
  }
  return given;
}

namespace {

// Whether a call on `stream` joins a capture (a graph's allocation or free, never the cache's),
// or cannot be told; the legacy stream is not asked (see legacy_stream).
bool in_capture(cudaStream_t stream) noexcept
{
  return !legacy_stream(stream) && stream_capturing(stream);
}

// A miss on the legacy stream while a blocking stream captures: the pool's allocation there
// would fail and invalidate that capture; refused before it is asked (hits need no call).
void refuse_if_legacy_closed(cudaStream_t stream, std::size_t bytes)
{
  if (!legacy_stream(stream)) { return; }
  if (auto const error = legacy_stream_open(stream); error != cudaSuccess) {
    throw unsupported_error{
      "asyncmr: cannot allocate " + std::to_string(bytes) +
      " bytes on the legacy default stream now: the front cache holds no block of that size for "
      "it, and CUDA refuses any call there while a blocking stream captures (" +
      cudaGetErrorName(error) +
      "). Allocate on a created stream, or before the capture. Every capture is still valid."};
  }
}

}  // namespace

// ---- front_cache ----------------------------------------------------------------------------

std::shared_ptr<front_cache> front_cache::make(mem_pool pool,
                                                 std::size_t cap,
                                                 std::optional<int> device)
{
  auto cache = std::make_shared<front_cache>(std::move(pool), cap, device);
  register_cache(cache);
  return cache;
}

release_stream::release_stream(std::optional<int> device)
{
  relaxed_capture_guard guard;
  active_context_scope context{device};
  try {
    ASYNCMR_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  } catch (...) {
    destroy();
    throw;
  }
  if (stream_key key{}; stream_key_of(cudaStreamLegacy, key)) {
    legacy        = key;
    this->context = current_context();
  }
}

void release_stream::destroy() noexcept
{
  relaxed_capture_guard guard;
  // The destroy returns at once, but compute-sanitizer's memcheck waits there for the stream's
  // work, which may wait for a stream where a Python host function waits for the GIL (a resource
  // dropped with one queued behind a kernel then hangs with the GIL held). So this counts as a
  // wait.
  blocking_region wait;
  if (stream != nullptr) { clear_own_error(cudaStreamDestroy(stream)); }
  stream = nullptr;
}

front_cache::front_cache(mem_pool pool, std::size_t cap, std::optional<int> device)
  : pool_{std::move(pool)},
    made_for_{pool_.handle_or_null()},
    device_{device},
    release_{device},
    cache_{cap,
           0,
           0,
           stream_markers{&release_, &mark_stream, &order_release, &destroy_marker},
           stale_after_ns}
{
}

front_cache::~front_cache()
{
  // Nothing here waits: the frees are queued on the release stream, behind the streams that used
  // the blocks, and a destroyed stream's queued work still runs (as does an owned pool's: it is
  // parked, not destroyed, while blocks are out). A failure (at process exit the driver may be
  // gone) frees nothing: the blocks stay allocated. Nothing is logged: RMM's logger may already
  // be gone.
  relaxed_capture_guard guard;
  // The last owner may be any thread (the reclaimer's too): as in release(), the cache's
  // device's context is current for every call here and, through ending_, for the members'
  // destruction after it.
  ending_.emplace(device_);
  if (cache_.held_blocks() != 0) { free_in_release_order(false); }
}

std::size_t front_cache::free_in_release_order(bool stale) noexcept
{
  // Callers hold a relaxed_capture_guard (none of this may refuse because of a capture
  // elsewhere: a stream-ordered wait and free, neither on a capturing stream) and have made the
  // cache's device's context current (release, reclaim_stale, the destructor). The front cache
  // parks and hands the blocks over under its release lock (block_cache::release).
  auto free = [this](stream_key, void* p, std::size_t) noexcept {
    // A free that failed leaves the block in the cache.
    return pool_.deallocate_async(p, release_.stream) == cudaSuccess;
  };
  return stale ? cache_.reclaim_stale(free) : cache_.release(free);
}

cudaError_t front_cache::release() noexcept
{
  relaxed_capture_guard guard;
  // Parking makes the release stream wait for each stream's marker: a runtime call that, on a
  // thread with no current context (the reclaimer's, a Dask worker's), would make one on
  // device 0. The cache's device's context, when active, is made current instead.
  active_context_scope context{device_};
  free_in_release_order(false);
  // So that the memory is the pool's again when this returns (a trim or an allocation right
  // after sees it unused): waits for the work the blocks' streams had queued before their frees.
  // Also when this call freed nothing itself: the front cache's release returns only once every
  // block parked before it was handed to a free (the reclaimer's or another release's), queued
  // on the same stream.
  blocking_region wait;
  return cudaStreamSynchronize(release_.stream);
}

void front_cache::reclaim_stale() noexcept
{
  relaxed_capture_guard guard;
  active_context_scope context{device_};  // this runs on the reclaimer's thread: as release()
  free_in_release_order(true);
}

bool front_cache::key_for(cudaStream_t stream, stream_key& key) const noexcept
{
  // The legacy stream of the context the cache was made in has the key taken then: asked of the
  // driver while a blocking stream captures, that question is refused as well
  // (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: docs/DRIVER_FACTS.md), and a hit
  // on it then needs no driver call at all. The context is the cache's as long as the cache
  // lives: its release stream is in it.
  if (legacy_stream(stream) && release_.legacy && release_.context != nullptr &&
      current_context() == release_.context) {
    key = *release_.legacy;
    return true;
  }
  return stream_key_of(stream, key);
}

void* front_cache::allocate(cudaStream_t stream, std::size_t bytes, bool* hit)
{
  if (in_capture(stream)) {
    // A graph allocation node: the graph owns the block (its address comes back at every
    // launch). Noted as the graph's, never recorded as the cache's: it never enters the cache,
    // and its frees go to the driver without the foreign-pointer question. The note needs no
    // host memory, so nothing after the allocation can throw and leak it.
    void* const ptr = pool_.allocate_async(bytes, stream);
    cache_.record_graph(ptr);
    return ptr;
  }
  std::size_t const cls = cache_.class_size(bytes);
  if (cls == 0) {
    refuse_if_legacy_closed(stream, bytes);
    return allocate_giving_caches_back(pool_, bytes, stream);
  }
  stream_key key{};
  if (!key_for(stream, key)) {
    refuse_if_legacy_closed(stream, bytes);
    return pool_.allocate_async(bytes, stream);
  }
  if (pool_.closed()) {
    throw pool_closed_error{"asyncmr: allocating from a memory pool that was closed"};
  }
  if (void* ptr = cache_.take(key, bytes)) {
    if (hit != nullptr) { *hit = true; }
    return ptr;
  }
  refuse_if_legacy_closed(stream, bytes);
  void* ptr = nullptr;
  try {
    ptr = pool_.allocate_async(cls, stream);
  } catch (rmm::out_of_memory const& e) {
    // A cache must never be the reason an allocation fails: this stream's blocks go back in its
    // own order (no wait), then every cache on the pool (release: the release streams).
    std::size_t given = cache_.drain_stream(key, [this, stream](stream_key, void* p, std::size_t) noexcept {
      return pool_.deallocate_async(p, stream) == cudaSuccess;
    });
    try {
      if (given != 0) { ptr = pool_.allocate_async(cls, stream); }
    } catch (rmm::out_of_memory const&) {  // NOLINT(bugprone-empty-catch): try the others
    }
    if (ptr == nullptr) {
      // Retried after any release that waited: one also waits for frees queued before it (by
      // the reclaimer, or a release on another thread) whose blocks the cache no longer counts.
      std::size_t const before = cache_.stats().cached_blocks;
      bool const own_released  = release() == cudaSuccess;
      if (own_released) { given += before; }
      auto const others = release_caches_of(pool_.handle_or_null(), this);
      given += others.blocks;
      try {
        if (own_released || others.caches != 0) { ptr = pool_.allocate_async(cls, stream); }
      } catch (rmm::out_of_memory const& again) {
        auto const s = cache_.stats();
        throw rmm::out_of_memory{std::string{again.what()} + "; front cache: cached " +
                                 human_bytes(s.cached_bytes) + " after giving " +
                                 std::to_string(given) + " blocks back to the pool"};
      }
      if (ptr == nullptr) {
        auto const s = cache_.stats();
        throw rmm::out_of_memory{std::string{e.what()} + "; front cache: cached " +
                                 human_bytes(s.cached_bytes) + " (nothing to give back)"};
      }
    }
  }
  static_cast<void>(cache_.record(ptr, bytes));  // unrecorded: simply never cached
  return ptr;
}

free_result front_cache::deallocate(cudaStream_t stream, void* ptr, std::size_t bytes) noexcept
{
  if (ptr == nullptr) { return {}; }
  // A free on the legacy stream sets its marker there (its order covers every blocking stream's
  // earlier work: see "Markers"), which a capture on a blocking stream forbids: refused first, as
  // CUDA refuses the free itself then, but without breaking that capture. Nothing changed.
  if (legacy_stream(stream)) {
    if (auto const error = legacy_stream_open(stream); error != cudaSuccess) {
      return {free_status::driver_refused, error, 0};
    }
  }
  // Inside a capture (the free becomes a node of the graph, run at every launch), on a stream
  // the driver cannot name, or after the pool was closed (it is parked until its blocks are
  // back, and hits are refused anyway), a block goes to the pool, never into the cache. The
  // record is asked first all the same: a block it holds as cached (a second free) or at
  // another class is refused there as here, before the driver is asked anything. A capture
  // that begins on the stream after this look is caught after the put's record (mark_stream).
  stream_key key{};
  bool const into_cache = !pool_.closed() && !in_capture(stream) && key_for(stream, key);
  if (auto const hook = testing_put_hook.load(std::memory_order_relaxed); hook && into_cache) {
    hook(stream);
  }
  put_result const put =
    into_cache ? cache_.put(key, ptr, bytes, stream) : cache_.unrecord(ptr, bytes);
  // A block the record let go of is the pool's only once the driver takes its free.
  auto const to_pool = [&] {
    auto const result = free_to_pool(pool_, ptr, stream);
    if (!result.ok()) {
      if (put.status == put_status::graph) {
        cache_.record_graph(ptr);
      } else {
        static_cast<void>(cache_.record(ptr, bytes));
      }
    }
    return result;
  };
  switch (put.status) {
    case put_status::cached: return {free_status::freed, cudaSuccess, 0, true};
    case put_status::refused:
      if (into_cache && cache_.note_pressure()) { request_reclaim(weak_from_this()); }
      return to_pool();
    case put_status::wrong_size: return {free_status::wrong_size, cudaSuccess, put.recorded_bytes};
    case put_status::already_cached:
      return {free_status::already_free, cudaSuccess, put.recorded_bytes};
    case put_status::graph: return into_cache ? free_to_pool(pool_, ptr, stream) : to_pool();
    case put_status::uncacheable:
    case put_status::not_recorded: break;
  }
  // Not a block the cache handed out (an uncacheable size, a block of an uncached sibling, one the
  // record had no room for): the pool's, unless the driver names another pool. Memory that no
  // pool handed out names none, and the driver judges its free.
  // Compared with the handle the pool had when the cache was made: a closed pool has none now,
  // and its blocks must still be taken (it is destroyed once they are).
  if (auto const owner = pool_of_pointer(ptr); owner && *owner != nullptr && *owner != made_for_) {
    return {free_status::not_this_resource, cudaSuccess, 0};
  }
  return free_to_pool(pool_, ptr, stream);
}

}  // namespace asyncmr::detail

void asyncmr::testing::set_put_hook(void (*hook)(cudaStream_t) noexcept) noexcept
{
  detail::testing_put_hook.store(hook, std::memory_order_relaxed);
}

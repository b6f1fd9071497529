/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The pools asyncmr owns, process-wide, under one mutex:
// - every live owned pool, by handle, so that adopting such a handle as a view shares the
//   owner's state and sees its close() instead of using a destroyed handle;
// - pools closed while allocations were live or in flight ("parked"). Destroying a pool and
//   then freeing one of its blocks crashes the 13.0 driver at a later synchronization, although
//   the documentation allows it, and destroying one while frees of its blocks are still queued
//   on a stream can leave that stream never finishing (docs/DRIVER_FACTS.md). Parked pools are
//   trimmed, and destroyed once nothing is allocated from them, nothing stays reserved after a
//   trim (no queued free) and no allocation is in flight: at the next close or create, and by a
//   background sweeper that looks at them while any are parked, so a pool goes as soon as it
//   is idle;
// - spares: managed pools that are idle, kept instead of destroyed, and handed to the next
//   create of the same properties (`retirement`, in detail/pool_state.hpp, says why);
// - the stand-in default host pools of a CUDA 12 build on a 12.x driver, never destroyed.

#include "detail/pool_state.hpp"

#include <asyncmr/detail/capture_mode.hpp>
#include <asyncmr/error.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace asyncmr::detail {
namespace {

struct parked_pool {
  cudaMemPool_t handle;
  std::weak_ptr<pool_state> state;  // expired: nothing can be in flight any more
  import_count imports;             // an imported pool's live imports, which outlive its state
  retirement after;                 // destroyed, or kept as a spare, once idle
};

struct spare_pool {
  cudaMemPool_t handle;
  std::optional<pool_properties> reuse_as;  // nullopt: kept, never reused (adopted)
  std::chrono::steady_clock::time_point kept_at;
};

// A spare serves a create once it has been kept this long: the driver can still be tearing
// down a destroyed stream's prefetch of its memory when the pool first holds nothing (the
// hazard `retirement` avoids), and the probe's destroys that waited this long never met it
// (ci/probes/retire_facts.cu, delay=100). A reused pool can still report a mixed
// last-prefetch location (open: docs/DRIVER_FACTS.md).
constexpr std::chrono::milliseconds spare_settle{100};
// At most this many unsettled spares of one kind: a create beyond it waits for the oldest to
// settle, so that fast churn keeps a bounded number of managed pools alive (some hundreds of
// live managed pools end the process: docs/DRIVER_FACTS.md).
constexpr std::size_t spare_limit = 64;

struct owned_pools {
  std::mutex mutex;
  std::unordered_map<cudaMemPool_t, std::weak_ptr<pool_state>> live;
  std::vector<parked_pool> parked;
  std::vector<spare_pool> spares;
  std::map<std::pair<int, int>, cudaMemPool_t> stand_ins;  // (location kind, id) for host pools
};

owned_pools& registry()
{
  static auto* pools = new owned_pools{};  // never destroyed: used until the process ends
  return *pools;
}

// The value of a pool counter, or nullopt when the driver cannot answer.
std::optional<std::uint64_t> counter(cudaMemPool_t h, cudaMemPoolAttr attribute) noexcept
{
  std::uint64_t value = 0;
  auto const status   = cudaMemPoolGetAttribute(h, attribute, &value);
  if (status != cudaSuccess) {
    clear_own_error(status);
    return std::nullopt;
  }
  return value;
}

// True if the driver shows that `h` holds nothing: nothing allocated, and nothing reserved once
// trimmed to 0. Used memory alone is not enough: it drops when cudaFreeAsync is called, while the
// block stays reserved until its stream runs the free, and a pool destroyed with a free still
// queued left that stream never finishing on driver 580 (ci/probes/pool_destroy_facts.cu). False
// when the driver cannot answer: then the pool is kept rather than risked.
bool holds_nothing(cudaMemPool_t h) noexcept
{
  auto const used = counter(h, cudaMemPoolAttrUsedMemCurrent);
  if (!used || *used != 0) { return false; }
  clear_own_error(cudaMemPoolTrimTo(h, 0));
  auto const reserved = counter(h, cudaMemPoolAttrReservedMemCurrent);
  return reserved && *reserved == 0;
}

bool parked_idle(parked_pool const& p) noexcept
{
  auto const state = p.state.lock();
  return idle(p.handle, state.get(), p.imports.get());
}

}  // namespace

bool idle(cudaMemPool_t handle,
          pool_state const* state,
          std::atomic<std::int64_t> const* imports) noexcept
{
  // An imported pool's usage is the exporter's: this process's imports are what counts.
  if (imports != nullptr ? imports->load() != 0 : !holds_nothing(handle)) { return false; }
  // Read after the driver's counters (sequentially consistent): a free whose call dropped the
  // used bytes to 0 is still counted here until the driver returned from it, and no later free
  // of this pool can begin, for nothing is allocated from it.
  return state == nullptr || state->in_flight.load() == 0;
}

namespace {

void destroy(cudaMemPool_t h) noexcept { clear_own_error(cudaMemPoolDestroy(h)); }

// Whether `handle` is among the parked pools. Caller holds the registry mutex.
bool parked(owned_pools const& pools, cudaMemPool_t handle) noexcept
{
  return std::any_of(pools.parked.begin(), pools.parked.end(),
                     [&](parked_pool const& p) { return p.handle == handle; });
}

// Destroys an idle pool, or keeps it as a spare. Caller holds the registry mutex.
void end(owned_pools& pools, cudaMemPool_t handle, retirement const& after) noexcept
{
  if (!after.keep) {
    destroy(handle);
    return;
  }
  try {
    pools.spares.push_back({handle, after.reuse_as, std::chrono::steady_clock::now()});
  } catch (...) {  // NOLINT(bugprone-empty-catch): no memory to remember it: kept all the same
  }
}

// Ends the parked pools that have become empty. Caller holds the registry mutex.
void sweep_parked(owned_pools& pools) noexcept
{
  std::erase_if(pools.parked, [&](parked_pool const& p) {
    if (!parked_idle(p)) { return false; }
    end(pools, p.handle, p.after);
    return true;
  });
}

bool same_pool_kind(pool_properties const& a, pool_properties const& b) noexcept
{
  return a.type == b.type && a.location == b.location && a.max_size == b.max_size &&
         a.export_handle_types == b.export_handle_types;
}

// ---- the sweeper: destroys parked pools once idle, whatever else the process does ----------
//
// One thread, started when the first pool is parked. While pools are parked it sweeps at
// growing intervals (1 ms to 50 ms: a free queued behind a short kernel is seen at once, a pool
// parked behind a long-lived block costs a few driver queries a second); with none parked it
// sleeps until a retire wakes it. At exit it stops before the CUDA runtime is torn down.

struct sweeper_state {
  std::mutex mutex;
  std::condition_variable wake;
  bool started{false};
  bool exiting{false};
  bool sweeping{false};
};

sweeper_state& sweeper() noexcept
{
  static auto* s = new sweeper_state{};  // never destroyed, as the registry
  return *s;
}

void sweeper_loop() noexcept
{
  using namespace std::chrono_literals;
  auto& s     = sweeper();
  auto& pools = registry();
  auto wait   = 1ms;
  std::unique_lock<std::mutex> lock{s.mutex};
  for (;;) {
    if (s.exiting) { return; }
    lock.unlock();
    std::size_t left = 0;
    {
      std::lock_guard<std::mutex> registry_lock{pools.mutex};
      relaxed_capture_guard guard;
      sweep_parked(pools);
      left = pools.parked.size();
    }
    lock.lock();
    if (s.exiting) { return; }
    if (left == 0) {
      s.sweeping = false;
      s.wake.wait(lock, [&] { return s.exiting || s.sweeping; });
      wait = 1ms;
    } else {
      s.wake.wait_for(lock, wait);
      wait = std::min(wait * 2, std::chrono::milliseconds{50});
    }
  }
}

void stop_sweeper() noexcept
{
  auto& s = sweeper();
  std::lock_guard<std::mutex> lock{s.mutex};
  s.exiting = true;
  s.wake.notify_all();
}

// Asks the sweeper to look at the parked pools (starting it the first time). Never throws: a
// thread that cannot start leaves the pools to the next close or create.
void wake_sweeper() noexcept
{
  auto& s = sweeper();
  try {
    std::lock_guard<std::mutex> lock{s.mutex};
    if (s.exiting) { return; }
    if (!s.started) {
      std::thread{sweeper_loop}.detach();
      s.started = true;
      std::atexit(stop_sweeper);
    }
    s.sweeping = true;
    s.wake.notify_one();
  } catch (...) {  // NOLINT(bugprone-empty-catch): no thread: the next close or create sweeps
  }
}

std::atomic<pool_closing_hook> closing_hook{nullptr};

}  // namespace

void set_pool_closing_hook(pool_closing_hook hook) noexcept
{
  closing_hook.store(hook, std::memory_order_release);
}

void run_pool_closing_hook(cudaMemPool_t handle) noexcept
{
  if (auto const hook = closing_hook.load(std::memory_order_acquire)) { hook(handle); }
}

std::shared_ptr<pool_state> register_owned(std::shared_ptr<pool_state> const& state)
{
  auto& pools = registry();
  std::lock_guard<std::mutex> lock{pools.mutex};
  relaxed_capture_guard guard;
  sweep_parked(pools);
  cudaMemPool_t const h = state->handle.load();
  if (auto const it = pools.live.find(h); it != pools.live.end()) {
    if (auto existing = it->second.lock()) { return existing; }
    throw pool_closed_error{"asyncmr: this pool is being closed by its owner; it cannot be "
                            "adopted"};
  }
  if (parked(pools, h)) {
    throw pool_closed_error{"asyncmr: this pool was closed by asyncmr and is destroyed once its "
                            "last allocation is freed; it cannot be adopted"};
  }
  // Room to park, or keep as a spare, every live pool, so that retire (noexcept) never
  // allocates.
  pools.parked.reserve(pools.parked.size() + pools.live.size() + 1);
  pools.spares.reserve(pools.spares.size() + pools.parked.size() + pools.live.size() + 1);
  pools.live.emplace(h, state);
  return nullptr;
}

handle_lookup lookup(cudaMemPool_t handle)
{
  auto& pools = registry();
  std::lock_guard<std::mutex> lock{pools.mutex};
  if (auto const it = pools.live.find(handle); it != pools.live.end()) {
    auto state = it->second.lock();
    // An expired entry: its last owner is in its destructor, between detach and retire.
    return state ? handle_lookup{handle_status::owned, std::move(state)}
                 : handle_lookup{handle_status::closing, nullptr};
  }
  if (parked(pools, handle)) {
    return {handle_status::parked, nullptr};
  }
  if (std::any_of(pools.spares.begin(), pools.spares.end(),
                  [&](spare_pool const& p) { return p.handle == handle; })) {
    return {handle_status::spare, nullptr};
  }
  if (std::any_of(pools.stand_ins.begin(), pools.stand_ins.end(),
                  [&](auto const& entry) { return entry.second == handle; })) {
    return {handle_status::stand_in, nullptr};
  }
  return {};
}

std::unique_lock<std::recursive_mutex> routing_lock()
{
  static auto* routing = new std::recursive_mutex{};  // never destroyed: pools close until the end
  return std::unique_lock<std::recursive_mutex>{*routing};
}

void retire(cudaMemPool_t handle,
            std::shared_ptr<pool_state> const& state,
            import_count imports,
            retirement after) noexcept
{
  auto& pools = registry();
  std::lock_guard<std::mutex> lock{pools.mutex};
  relaxed_capture_guard guard;
  pools.live.erase(handle);
  // in_flight is read after the handle was cleared (sequentially consistent on both sides): an
  // allocation that read the handle before that is counted here; one that reads it after sees
  // nullptr and is refused.
  parked_pool entry{handle, state, std::move(imports), std::move(after)};
  if (parked_idle(entry)) {
    end(pools, handle, entry.after);
  } else {
    clear_own_error(cudaMemPoolTrimTo(handle, 0));  // give back what is not in use now
    try {
      pools.parked.push_back(std::move(entry));  // room reserved at registration (owned pools)
    } catch (...) {  // NOLINT(bugprone-empty-catch): no memory to remember it: it is never
    }                // destroyed (a leak, never a destroyed pool still in use)
  }
  sweep_parked(pools);
  if (!pools.parked.empty()) { wake_sweeper(); }
}

cudaMemPool_t take_spare(pool_properties const& props) noexcept
{
  auto& pools = registry();
  for (;;) {
    std::chrono::steady_clock::duration wait{};
    {
      std::lock_guard<std::mutex> lock{pools.mutex};
      auto const now = std::chrono::steady_clock::now();
      // The newest settled spare of this kind (spares are kept in the order they came).
      std::size_t same_kind = 0;
      auto oldest           = now;
      for (auto it = pools.spares.rbegin(); it != pools.spares.rend(); ++it) {
        if (!it->reuse_as || !same_pool_kind(*it->reuse_as, props)) { continue; }
        if (now - it->kept_at >= spare_settle) {
          cudaMemPool_t const handle = it->handle;
          pools.spares.erase(std::next(it).base());
          return handle;
        }
        ++same_kind;
        oldest = it->kept_at;
      }
      if (same_kind < spare_limit) { return nullptr; }
      wait = spare_settle - (now - oldest);
    }
    std::this_thread::sleep_for(wait);
  }
}

void reset_spare(cudaMemPool_t handle) noexcept
{
  relaxed_capture_guard guard;
  int on = 1;
  for (auto const attribute : {cudaMemPoolReuseFollowEventDependencies,
                               cudaMemPoolReuseAllowOpportunistic,
                               cudaMemPoolReuseAllowInternalDependencies}) {
    clear_own_error(cudaMemPoolSetAttribute(handle, attribute, &on));
  }
  std::uint64_t zero = 0;
  for (auto const attribute : {cudaMemPoolAttrReservedMemHigh, cudaMemPoolAttrUsedMemHigh}) {
    clear_own_error(cudaMemPoolSetAttribute(handle, attribute, &zero));
  }
  int devices = 0;
  if (auto const status = cudaGetDeviceCount(&devices); status != cudaSuccess) {
    clear_own_error(status);
    return;
  }
  for (int device = 0; device < devices; ++device) {
    cudaMemLocation where{cudaMemLocationTypeDevice, device};
    cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
    auto const status        = cudaMemPoolGetAccess(&flags, handle, &where);
    clear_own_error(status);
    if (status != cudaSuccess || flags == cudaMemAccessFlagsProtNone) { continue; }
    cudaMemAccessDesc const none{where, cudaMemAccessFlagsProtNone};
    clear_own_error(cudaMemPoolSetAccess(handle, &none, 1));
  }
}

cudaMemPool_t stand_in_pool(location const& where, allocation_type type)
{
  auto& pools = registry();
  std::lock_guard<std::mutex> lock{pools.mutex};
  auto const key = std::make_pair(static_cast<int>(where.kind),
                                  where.kind == location_kind::host_numa ? where.id : 0);
  if (auto const it = pools.stand_ins.find(key); it != pools.stand_ins.end()) { return it->second; }
  if (where.kind == location_kind::host_numa_current) {
    throw unsupported_error{"asyncmr: this driver has no default pool at host_numa_current; "
                            "name the NUMA node with Location.host_numa(n)"};
  }
  // Like CUDA 13's default pools it starts with release threshold 0 and no device access; the
  // resources apply their policies on top.
  cudaMemPoolProps props{};
  props.allocType   = type == allocation_type::managed ? static_cast<cudaMemAllocationType>(2)
                                                       : cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location    = where.to_cuda();
  cudaMemPool_t handle = nullptr;
  relaxed_capture_guard guard;
  ASYNCMR_CUDA_TRY(cudaMemPoolCreate(&handle, &props));
  pools.stand_ins.emplace(key, handle);
  return handle;
}

}  // namespace asyncmr::detail

std::size_t asyncmr::testing::spare_pools()
{
  auto& pools = detail::registry();
  std::lock_guard<std::mutex> lock{pools.mutex};
  return pools.spares.size();
}

std::size_t asyncmr::testing::parked_pools()
{
  auto& pools = detail::registry();
  std::lock_guard<std::mutex> lock{pools.mutex};
  detail::relaxed_capture_guard guard;
  detail::sweep_parked(pools);
  return pools.parked.size();
}

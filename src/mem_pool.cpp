/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The driver calls are written here by hand rather than through CCCL's cuda::*_memory_pool
// (bundled with librmm, CCCL 3.5): CCCL's default-pool getters raise a zero release threshold
// unconditionally (asyncmr must be able to apply 0 exactly), its pinned pools grant access to
// every device (asyncmr lets the user choose), it has no CUDA 12.6-12.8 path, and it makes
// attribute calls outside relaxed capture mode, which invalidates a capture in progress.

#include <asyncmr/capability.hpp>
#include <asyncmr/detail/capture_mode.hpp>
#include <asyncmr/error.hpp>
#include <asyncmr/mem_pool.hpp>

#if defined(__linux__)
#include <fcntl.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <stdexcept>
#include <string>

namespace asyncmr {
namespace detail {

struct pool_state {
  std::atomic<cudaMemPool_t> handle{nullptr};
  bool owned{false};
  std::optional<location> where{};
  std::optional<allocation_type> type{};
  std::optional<pool_properties> props{};
  std::mutex close_mutex{};

  pool_state() = default;
  pool_state(pool_state const&)            = delete;
  pool_state& operator=(pool_state const&) = delete;
  ~pool_state() { close(); }

  void close() noexcept;
};

namespace {

int driver_version() noexcept
{
  static int const version = versions().driver;
  return version;
}

int device_for_checks(location const& where)
{
  return where.kind == location_kind::device ? where.id : current_device();
}

cudaMemPool_t query_pool(location const& where, allocation_type type, bool current)
{
  validate_combination(where, type, false);
  relaxed_capture_guard guard;
  require_pool_support(where, type, device_for_checks(where));
  cudaMemPool_t handle = nullptr;
#if CUDART_VERSION >= 13000
  cudaMemLocation loc = where.to_cuda();
  if (current) {
    ASYNCMR_CUDA_TRY(cudaMemGetMemPool(&handle, &loc, detail::to_cuda(type)));
  } else {
    ASYNCMR_CUDA_TRY(cudaMemGetDefaultMemPool(&handle, &loc, detail::to_cuda(type)));
  }
#else
  if (type != allocation_type::device) {
    throw unsupported_error{std::string{"asyncmr: default and current "} + to_string(type) +
                            " pools need CUDA 13; in a CUDA 12 build use an owned pool "
                            "(pool='new')"};
  }
  if (current) {
    ASYNCMR_CUDA_TRY(cudaDeviceGetMemPool(&handle, where.id));
  } else {
    ASYNCMR_CUDA_TRY(cudaDeviceGetDefaultMemPool(&handle, where.id));
  }
#endif
  return handle;
}

// Routes (location, type) to `handle` process-wide.
void route(location const& where, allocation_type type, cudaMemPool_t handle)
{
#if CUDART_VERSION >= 13000
  cudaMemLocation loc = where.to_cuda();
  ASYNCMR_CUDA_TRY(cudaMemSetMemPool(&loc, detail::to_cuda(type), handle));
#else
  if (type != allocation_type::device) {
    throw unsupported_error{"asyncmr: routing host and managed pools needs CUDA 13"};
  }
  ASYNCMR_CUDA_TRY(cudaDeviceSetMemPool(where.id, handle));
#endif
}

}  // namespace

// ---- owned pools: the registry and the deferred destruction ----------------------------------
//
// Two process-wide lists, both under one mutex:
// - every live pool asyncmr owns, by handle, so that adopting such a handle as a view shares
//   the owner's state and sees its close() instead of using a destroyed handle;
// - pools closed while allocations were still live ("parked"). On the H200 with driver 580,
//   destroying a pool and then freeing one of its blocks crashed the process at a later
//   synchronization, although the documentation allows it. Parked pools are trimmed and
//   destroyed once nothing is allocated from them, at the next close or create.
namespace {

struct owned_pools {
  std::mutex mutex;
  std::unordered_map<cudaMemPool_t, std::weak_ptr<pool_state>> live;
  std::vector<cudaMemPool_t> parked;
  // Handles asyncmr destroyed (until the driver hands one out again): adopting one is refused
  // instead of passing a dangling handle to the driver.
  std::unordered_set<cudaMemPool_t> destroyed;
};

owned_pools& registry()
{
  static auto* pools = new owned_pools{};  // never destroyed: used until the process ends
  return *pools;
}

// True if the driver says nothing is allocated from `h`; false when it says otherwise or
// cannot answer (then the pool is kept rather than risked).
bool nothing_allocated(cudaMemPool_t h) noexcept
{
  std::uint64_t used = 1;
  if (cudaMemPoolGetAttribute(h, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return used == 0;
}

void destroy(owned_pools& pools, cudaMemPool_t h) noexcept
{
  cudaMemPoolDestroy(h);
  cudaGetLastError();
  pools.destroyed.insert(h);
}

// Destroys the parked pools that have become empty. Caller holds the registry mutex.
void sweep_parked(owned_pools& pools) noexcept
{
  std::erase_if(pools.parked, [&](cudaMemPool_t h) {
    if (!nothing_allocated(h)) { return false; }
    destroy(pools, h);
    return true;
  });
}

}  // namespace

void register_owned(std::shared_ptr<pool_state> const& state)
{
  auto& pools = registry();
  std::lock_guard<std::mutex> lock{pools.mutex};
  relaxed_capture_guard guard;
  sweep_parked(pools);
  cudaMemPool_t const h = state->handle.load();
  pools.destroyed.erase(h);
  pools.live[h] = state;
}

bool was_destroyed(cudaMemPool_t handle)
{
  auto& pools = registry();
  std::lock_guard<std::mutex> lock{pools.mutex};
  return pools.destroyed.contains(handle) ||
         std::find(pools.parked.begin(), pools.parked.end(), handle) != pools.parked.end();
}

/**
 * @brief Whether the process can read the first bytes at `address`, found without touching
 * them: the kernel copies them into a pipe and answers EFAULT if nothing is mapped there.
 *
 * The driver dereferences a pool handle without checking it, so an integer that is not a
 * pool (0x1000, a stale number) would crash the process at the first pool call. This catches
 * the unmapped ones; a mapped address that is not a pool cannot be told apart.
 */
static bool address_is_mapped(void const* address)
{
#if defined(__linux__)
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) { return true; }  // cannot check: trust it
  constexpr std::size_t probe = 64;
  ssize_t written             = -1;
  do {
    written = write(fds[1], address, probe);
  } while (written < 0 && errno == EINTR);
  int const error = written < 0 ? errno : 0;
  close(fds[0]);
  close(fds[1]);
  return error != EFAULT;
#else
  static_cast<void>(address);
  return true;
#endif
}

std::shared_ptr<pool_state> find_owned(cudaMemPool_t handle)
{
  auto& pools = registry();
  std::lock_guard<std::mutex> lock{pools.mutex};
  auto const it = pools.live.find(handle);
  return it == pools.live.end() ? nullptr : it->second.lock();
}

void pool_state::close() noexcept
{
  std::lock_guard<std::mutex> lock{close_mutex};
  cudaMemPool_t const h = handle.exchange(nullptr);
  if (h == nullptr || !owned) { return; }
  relaxed_capture_guard guard;
  // A destroyed pool must not stay current: later cudaMallocAsync calls anywhere in the
  // process would use a dangling handle. Route the location back to its default pool.
  if (where && type) {
    try {
      if (query_pool(*where, *type, true) == h) {
        route(*where, *type, query_pool(*where, *type, false));
      }
    } catch (...) {  // NOLINT(bugprone-empty-catch): best effort in a destructor
    }
  }
  auto& pools = registry();
  std::lock_guard<std::mutex> registry_lock{pools.mutex};
  pools.live.erase(h);
  if (nothing_allocated(h)) {
    destroy(pools, h);
  } else {
    cudaMemPoolTrimTo(h, 0);  // give back what is not in use now
    pools.parked.push_back(h);
  }
  cudaGetLastError();
  sweep_parked(pools);
}

}  // namespace detail

mem_pool::mem_pool(std::shared_ptr<detail::pool_state> state, bool view) noexcept
  : state_{std::move(state)}, view_{view}
{
}

mem_pool mem_pool::default_pool(location where, allocation_type type)
{
  auto state   = std::make_shared<detail::pool_state>();
  state->handle = detail::query_pool(where, type, false);
  state->where  = where;
  state->type   = type;
  return mem_pool{std::move(state)};
}

mem_pool mem_pool::current(location where, allocation_type type)
{
  auto state   = std::make_shared<detail::pool_state>();
  state->handle = detail::query_pool(where, type, true);
  state->where  = where;
  state->type   = type;
  return mem_pool{std::move(state)};
}

mem_pool mem_pool::create(pool_properties const& props)
{
  detail::validate_combination(props.where, props.type, true);
  {
    detail::relaxed_capture_guard guard;
    require_pool_support(props.where, props.type, detail::device_for_checks(props.where));
  }
  cudaMemPoolProps p{};
  p.allocType   = detail::to_cuda(props.type);
  p.handleTypes = static_cast<cudaMemAllocationHandleType>(props.export_handle_types);
  p.location    = props.where.to_cuda();
  p.maxSize     = props.max_size;

  auto state = std::make_shared<detail::pool_state>();
  {
    detail::relaxed_capture_guard guard;
    cudaMemPool_t handle = nullptr;
    auto const status    = cudaMemPoolCreate(&handle, &p);
    if (status == cudaErrorInvalidValue && props.type == allocation_type::managed &&
        props.max_size != 0) {
      cudaGetLastError();
      throw std::invalid_argument{
        "asyncmr: managed pools cannot be bounded: cudaMemPoolCreate refuses a max_size for "
        "managed memory (cudaErrorInvalidValue); leave max_size at 0"};
    }
    ASYNCMR_CUDA_TRY(status);
    state->handle = handle;
  }
  state->owned = true;
  state->where = props.where;
  state->type  = props.type;
  state->props = props;
  detail::register_owned(state);
  mem_pool pool{std::move(state)};  // destroys the driver pool if the threshold call throws
  pool.set<pool_attribute::release_threshold>(
    props.release_threshold.value_or(std::numeric_limits<std::uint64_t>::max()));
  return pool;
}

mem_pool mem_pool::from_handle(cudaMemPool_t handle,
                               bool owned,
                               std::optional<location> where,
                               std::optional<allocation_type> type)
{
  if (handle == nullptr) { throw std::invalid_argument{"asyncmr: pool handle is null (0)"}; }
  require_cuda();
  if (where && type) { detail::validate_combination(*where, *type, false); }
  if (auto shared = detail::find_owned(handle)) {
    // asyncmr owns this pool elsewhere: share that state, as a view unless ownership is
    // asked for (then the owner's copies and this one own it together).
    return mem_pool{std::move(shared), !owned};
  }
  if (detail::was_destroyed(handle)) {
    throw std::invalid_argument{"asyncmr: pool handle was destroyed (closed by asyncmr)"};
  }
  if (!detail::address_is_mapped(handle)) {
    char text[32];
    std::snprintf(text, sizeof text, "%p", static_cast<void*>(handle));
    throw std::invalid_argument{std::string{"asyncmr: "} + text +
                                " is not a memory pool handle (nothing is mapped there)"};
  }
  auto state    = std::make_shared<detail::pool_state>();
  state->handle = handle;
  state->where  = where;
  state->type   = type;
  // Ownership is taken only once the handle answered: a handle the driver rejects is not
  // destroyed by the state's destructor.
  mem_pool pool{state};
  static_cast<void>(pool.get<pool_attribute::release_threshold>());
  state->owned = owned;
  if (owned) { detail::register_owned(state); }
  return pool;
}

cudaMemPool_t mem_pool::handle() const
{
  cudaMemPool_t const h = state_->handle.load(std::memory_order_acquire);
  if (h == nullptr) { throw pool_closed_error{"asyncmr: the memory pool was closed"}; }
  return h;
}

cudaMemPool_t mem_pool::handle_or_null() const noexcept
{
  return state_->handle.load(std::memory_order_acquire);
}

bool mem_pool::owned() const noexcept { return state_->owned && !view_; }

bool mem_pool::closed() const noexcept { return handle_or_null() == nullptr; }

std::optional<location> mem_pool::where() const
{
  if (state_->where) { return state_->where; }
  if (detail::driver_version() < info(pool_attribute::location_type).min_driver) { return {}; }
  cudaMemLocation loc{};
  loc.type = static_cast<cudaMemLocationType>(get<pool_attribute::location_type>());
  loc.id   = get<pool_attribute::location_id>();
  return location::from_cuda(loc);
}

std::optional<allocation_type> mem_pool::type() const
{
  if (state_->type) { return state_->type; }
  if (detail::driver_version() < info(pool_attribute::allocation_type).min_driver) { return {}; }
  auto const raw = static_cast<cudaMemAllocationType>(get<pool_attribute::allocation_type>());
  if (raw == cudaMemAllocationTypePinned) {
    auto const w = where();
    return (w && w->kind == location_kind::device) ? allocation_type::device
                                                   : allocation_type::pinned;
  }
  return allocation_type::managed;
}

std::optional<pool_properties> mem_pool::properties() const { return state_->props; }

namespace {

// The value of a CUDA 13.2 attribute that asyncmr knows without asking the driver.
std::optional<std::uint64_t> known_value(detail::pool_state const& s, pool_attribute attribute)
{
  switch (attribute) {
    case pool_attribute::allocation_type:
      if (s.type) { return static_cast<std::uint64_t>(detail::to_cuda(*s.type)); }
      break;
    case pool_attribute::location_type:
      if (s.where) { return static_cast<std::uint64_t>(s.where->to_cuda().type); }
      break;
    case pool_attribute::location_id:
      if (s.where) { return static_cast<std::uint64_t>(s.where->to_cuda().id); }
      break;
    case pool_attribute::max_pool_size:
      if (s.props) { return s.props->max_size; }
      break;
    case pool_attribute::export_handle_types:
      if (s.props) { return static_cast<std::uint64_t>(s.props->export_handle_types); }
      break;
    case pool_attribute::hw_decompress_enabled:
      if (s.props) { return 0; }  // asyncmr never requests decompression-capable pools
      break;
    default: break;
  }
  return std::nullopt;
}

}  // namespace

std::uint64_t mem_pool::get_attribute(pool_attribute attribute) const
{
  cudaMemPool_t const h = handle();
  auto const& row       = info(attribute);
  if (detail::driver_version() < row.min_driver) {
    if (auto known = known_value(*state_, attribute)) { return *known; }
    throw unsupported_error{"asyncmr: pool attribute '" + std::string{row.name} +
                            "' needs a CUDA driver >= " + version_string(row.min_driver) +
                            "; this driver is " + version_string(detail::driver_version()) +
                            ", and the value is not known for this pool without asking it"};
  }
  // Integer and boolean attributes are 4 bytes wide in the driver; a zeroed 8-byte slot reads
  // them correctly on every little-endian host CUDA supports.
  std::uint64_t value = 0;
  {
    detail::relaxed_capture_guard guard;
    ASYNCMR_CUDA_TRY(
      cudaMemPoolGetAttribute(h, static_cast<cudaMemPoolAttr>(row.cuda_value), &value));
  }
  if (row.kind != attribute_kind::bytes) { value &= 0xffffffffULL; }
  if (row.kind == attribute_kind::boolean) { value = value != 0 ? 1 : 0; }
  return value;
}

void mem_pool::set_attribute(pool_attribute attribute, std::uint64_t value) const
{
  auto const& row = info(attribute);
  std::string const name{row.name};
  switch (row.access) {
    case attribute_access::read_only:
      throw std::invalid_argument{"asyncmr: pool attribute '" + name + "' is read-only"};
    case attribute_access::reset_only:
      if (value != 0) {
        throw std::invalid_argument{"asyncmr: pool attribute '" + name +
                                    "' is a high-water mark; it can only be reset, by setting "
                                    "0 (got " +
                                    std::to_string(value) + ")"};
      }
      break;
    case attribute_access::read_write:
      if (row.kind == attribute_kind::boolean && value > 1) {
        throw std::invalid_argument{"asyncmr: pool attribute '" + name +
                                    "' is a boolean (got " + std::to_string(value) + ")"};
      }
      break;
  }
  cudaMemPool_t const h = handle();
  auto const attr       = static_cast<cudaMemPoolAttr>(row.cuda_value);
  detail::relaxed_capture_guard guard;
  if (row.kind == attribute_kind::bytes) {
    std::uint64_t v = value;
    ASYNCMR_CUDA_TRY(cudaMemPoolSetAttribute(h, attr, &v));
  } else {
    int v = static_cast<int>(value);
    ASYNCMR_CUDA_TRY(cudaMemPoolSetAttribute(h, attr, &v));
  }
}

void mem_pool::reset_peaks() const
{
  set<pool_attribute::used_mem_high>(0);
  set<pool_attribute::reserved_mem_high>(0);
}

void mem_pool::trim_to(std::size_t min_bytes_to_keep) const
{
  cudaMemPool_t const h = handle();
  detail::relaxed_capture_guard guard;
  ASYNCMR_CUDA_TRY(cudaMemPoolTrimTo(h, min_bytes_to_keep));
}

void mem_pool::set_access(std::vector<int> const& devices, access_mode mode) const
{
  cudaMemPool_t const h = handle();
  detail::relaxed_capture_guard guard;
  std::vector<cudaMemAccessDesc> descs;
  descs.reserve(devices.size());
  for (int const device : devices) {
    require_device(device);
    cudaMemAccessDesc d{};
    d.location = location::device(device).to_cuda();
    d.flags    = mode == access_mode::read_write ? cudaMemAccessFlagsProtReadWrite
                 : mode == access_mode::read     ? cudaMemAccessFlagsProtRead
                                                 : cudaMemAccessFlagsProtNone;
    descs.push_back(d);
  }
  if (descs.empty()) { return; }
  ASYNCMR_CUDA_TRY(cudaMemPoolSetAccess(h, descs.data(), descs.size()));
}

access_mode mem_pool::access(int device) const
{
  cudaMemPool_t const h = handle();
  detail::relaxed_capture_guard guard;
  require_device(device);
  cudaMemLocation loc      = location::device(device).to_cuda();
  cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
  ASYNCMR_CUDA_TRY(cudaMemPoolGetAccess(&flags, h, &loc));
  switch (flags) {
    case cudaMemAccessFlagsProtReadWrite: return access_mode::read_write;
    case cudaMemAccessFlagsProtRead: return access_mode::read;
    default: return access_mode::none;
  }
}

mem_pool mem_pool::make_current() const
{
  cudaMemPool_t const h = handle();
  auto const w          = where();
  auto const t          = type();
  if (!w || !t) {
    throw unsupported_error{
      "asyncmr: make_current needs the pool's location and allocation type; this driver "
      "cannot report them for an adopted handle (pass them to from_handle)"};
  }
  mem_pool previous = current(*w, *t);
  detail::relaxed_capture_guard guard;
  detail::route(*w, *t, h);
  return previous;
}

void mem_pool::close()
{
  if (view_) {
    // A view stops being usable; the pool and its owner are left alone.
    state_ = std::make_shared<detail::pool_state>();
    view_  = false;
    return;
  }
  state_->close();
}

bool mem_pool::operator==(mem_pool const& other) const noexcept
{
  return state_ == other.state_ || (handle_or_null() != nullptr &&
                                    handle_or_null() == other.handle_or_null());
}

}  // namespace asyncmr

/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The pool API. How pools are obtained is src/driver_api.cpp's concern, which of them the
// platform supports capability.cpp's, and the lifetime of owned pools pool_registry.cpp's.

#include "detail/driver_api.hpp"
#include "detail/pool_state.hpp"
#include "detail/text.hpp"

#include <asyncmr/capability.hpp>
#include <asyncmr/detail/blocking.hpp>
#include <asyncmr/detail/capture_mode.hpp>
#include <asyncmr/error.hpp>
#include <asyncmr/mem_pool.hpp>

#include <rmm/error.hpp>

#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

namespace asyncmr {
namespace detail {
namespace {

int device_for_checks(location const& where)
{
  return where.kind == location_kind::device ? where.id : current_device();
}

// Checks `type` at `where` for `source` and returns the path to the pool. Caller holds a
// relaxed capture guard (device queries are capture-unsafe on some drivers).
pool_path checked_path(location const& where, allocation_type type, pool_source source)
{
  validate_combination(where, type, source == pool_source::new_pool);
  return require_pool_support(where, type, source, device_for_checks(where));
}

pool_path routing_path(location const& where, allocation_type type)
{
  auto const decision = decide_routing_support(current_platform(device_for_checks(where)), type);
  if (!decision) { throw unsupported_error{decision.reason}; }
  return *decision.path;
}

std::shared_ptr<pool_state> view_state(cudaMemPool_t handle, location where, allocation_type type)
{
  auto state    = std::make_shared<pool_state>();
  state->handle = handle;
  state->where  = where;
  state->type   = type;
  return state;
}

// A pool's reserved and used bytes, asked of the driver in one relaxed-capture section.
std::optional<pool_usage> usage_of(cudaMemPool_t h) noexcept
{
  pool_usage u{};
  relaxed_capture_guard guard;
  auto const a = cudaMemPoolGetAttribute(h, cudaMemPoolAttrReservedMemCurrent, &u.reserved);
  auto const b = cudaMemPoolGetAttribute(h, cudaMemPoolAttrUsedMemCurrent, &u.used);
  clear_own_error(a);
  clear_own_error(b);
  if (a != cudaSuccess || b != cudaSuccess) { return std::nullopt; }
  return u;
}

// What the pool holds, for an out-of-memory message: "pool: reserved X MiB, used Y MiB".
std::string describe_usage(cudaMemPool_t h)
{
  auto const u = usage_of(h);
  if (!u) { return "pool: usage unknown"; }
  return "pool: reserved " + human_bytes(u->reserved) + ", used " + human_bytes(u->used);
}

[[noreturn]] void throw_allocation_error(cudaError_t error,
                                         std::size_t bytes,
                                         cudaStream_t stream,
                                         pool_state const& s,
                                         cudaMemPool_t h)
{
  clear_own_error(error);
  std::string const what = std::to_string(bytes) + " bytes of " +
                           (s.type ? to_string(*s.type) : "pool") + " memory" +
                           (s.where ? " at " + s.where->to_string() : std::string{});
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (error != cudaErrorMemoryAllocation) {
    auto const query = cudaStreamIsCapturing(stream, &status);
    clear_own_error(query);
    if (query == cudaSuccess && status == cudaStreamCaptureStatusActive) {
      throw unsupported_error{
        "asyncmr: cannot allocate " + what + " inside a stream capture: CUDA refuses it (" +
        cudaGetErrorName(error) +
        "). Graph allocation nodes exist only for device and managed@device pools; allocate "
        "before beginning the capture. The capture is still valid."};
    }
  }
  if (error == cudaErrorMemoryAllocation) {
    throw rmm::out_of_memory{"asyncmr: out of memory allocating " + what +
                             " (cudaMallocFromPoolAsync: cudaErrorMemoryAllocation); " +
                             describe_usage(h)};
  }
  throw_cuda_error(error, ("cudaMallocFromPoolAsync(" + what + ")").c_str());
}

}  // namespace

pool_use::pool_use(pool_state& state, char const* closed_message) : state_{state}
{
  // Counted before the handle is read; close() clears the handle before it reads the count
  // (both sequentially consistent): either this sees the pool closed, or close() sees this.
  state_.in_flight.fetch_add(1);
  handle_ = state_.handle.load();
  if (handle_ == nullptr) {
    state_.in_flight.fetch_sub(1);
    throw pool_closed_error{closed_message != nullptr ? closed_message
                                                      : "asyncmr: the memory pool was closed"};
  }
  if (auto const hook = testing_pool_use_hook.load(std::memory_order_relaxed)) { hook(); }
}

cudaMemPool_t pool_state::detach() noexcept
{
  cudaMemPool_t const h = handle.exchange(nullptr);
  if (h == nullptr || !owned) { return nullptr; }
  // A destroyed pool must not stay current: later cudaMallocAsync calls anywhere in the
  // process would use a dangling handle. Route the location back to its default pool. (An
  // imported pool is never current.)
  if (where && type && !imported) {
    relaxed_capture_guard guard;
    try {
      auto const routing = routing_lock();  // no make_current between the check and the set
      int const device = device_for_checks(*where);
      auto const current_path =
        require_pool_support(*where, *type, pool_source::current, device);
      if (get_current_pool(*where, *type, current_path) == h) {
        auto const default_path =
          require_pool_support(*where, *type, pool_source::default_pool, device);
        set_current_pool(*where, *type, get_default_pool(*where, *type, default_path),
                         routing_path(*where, *type));
      }
    } catch (...) {  // NOLINT(bugprone-empty-catch): best effort; unsupported means not routable
    }
  }
  return h;
}

pool_state::~pool_state()
{
  // No mem_pool refers to this state any more, so no allocation can be in flight through it.
  if (cudaMemPool_t const h = detach()) {
    retire(h, nullptr, live_imports, after_retirement());
  }
}

}  // namespace detail

mem_pool::mem_pool() : state_{std::make_shared<detail::pool_state>()} {}

mem_pool::mem_pool(std::shared_ptr<detail::pool_state> state, bool view) noexcept
  : state_{std::move(state)}, view_{view}
{
}

mem_pool mem_pool::default_pool(asyncmr::location location, allocation_type type)
{
  detail::relaxed_capture_guard guard;
  auto const path = detail::checked_path(location, type, pool_source::default_pool);
  return mem_pool{detail::view_state(detail::get_default_pool(location, type, path), location, type)};
}

// mem_pool::current's work; the caller holds the routing lock, so the pool read as current stays
// current (a closing pool reroutes under that lock) until the registry has been asked about it.
mem_pool mem_pool::current_routed(asyncmr::location location, allocation_type type)
{
  using namespace detail;
  relaxed_capture_guard guard;
  auto const path       = checked_path(location, type, pool_source::current);
  cudaMemPool_t const h = get_current_pool(location, type, path);
  // A pool asyncmr owns is shared as a view of its owner's state, as from_handle does: closed
  // with its owner, never left holding the handle of a destroyed driver pool.
  auto found = lookup(h);
  switch (found.status) {
    case handle_status::owned: return mem_pool{std::move(found.state), true};
    case handle_status::closing:
    case handle_status::parked:
      throw pool_closed_error{"asyncmr: the current pool was closed by asyncmr (it is destroyed "
                              "once its last allocation is freed); make another pool current"};
    case handle_status::spare:
      throw pool_closed_error{"asyncmr: the current pool was closed by asyncmr (it keeps closed "
                              "managed pools for reuse); make another pool current"};
    case handle_status::unknown:
    case handle_status::stand_in: break;
  }
  return mem_pool{view_state(h, location, type)};
}

mem_pool mem_pool::current(asyncmr::location location, allocation_type type)
{
  auto const routing = detail::routing_lock();
  return current_routed(location, type);
}

mem_pool mem_pool::create(pool_properties const& props)
{
  // cudaMemPoolCreate refuses any maxSize for managed memory (cudaErrorInvalidValue,
  // docs/DRIVER_FACTS.md): said before the driver is looked for, as the combinations are.
  if (props.type == allocation_type::managed && props.max_size != 0) {
    throw std::invalid_argument{
      "asyncmr: managed pools cannot be bounded: cudaMemPoolCreate refuses a max_size for "
      "managed memory (cudaErrorInvalidValue); leave max_size at 0"};
  }
  int const known =
    static_cast<int>(export_handle::posix_fd) | static_cast<int>(export_handle::fabric);
  if (props.export_handle_types < 0 || (props.export_handle_types & ~known) != 0) {
    char text[160];
    std::snprintf(text, sizeof text,
                  "asyncmr: export_handle_types %#x has bits no export handle type has (%#x); "
                  "the types are posix_fd = %d, fabric = %d",
                  static_cast<unsigned>(props.export_handle_types),
                  static_cast<unsigned>(props.export_handle_types & ~known),
                  static_cast<int>(export_handle::posix_fd),
                  static_cast<int>(export_handle::fabric));
    throw std::invalid_argument{text};
  }
  detail::relaxed_capture_guard guard;
  auto const path = detail::checked_path(props.location, props.type, pool_source::new_pool);
  cudaMemPoolProps p{};
  p.allocType   = detail::to_cuda(props.type);
  p.handleTypes = static_cast<cudaMemAllocationHandleType>(props.export_handle_types);
  p.location    = props.location.to_cuda();
  p.maxSize     = props.max_size;

  // A spare (detail::retirement) is a pool of these properties that holds nothing; made to
  // read as a new one, it serves instead of another driver pool.
  cudaMemPool_t handle = props.type == allocation_type::managed ? detail::take_spare(props)
                                                                : nullptr;
  if (handle != nullptr) { detail::reset_spare(handle); }
  auto const status = handle != nullptr ? cudaSuccess : detail::create_pool(&handle, p, path);
  std::string const what = std::string{to_string(props.type)} + " pool at " +
                           props.location.to_string();
  if (status == cudaErrorInvalidValue && props.export_handle_types != 0) {
    detail::clear_own_error(status);
    throw std::invalid_argument{
      "asyncmr: cudaMemPoolCreate refused export_handle_types=" +
      std::to_string(props.export_handle_types) + " for a " + what +
      " (cudaErrorInvalidValue): this driver does not share such pools between processes"};
  }
  if (status != cudaSuccess) {
    detail::throw_cuda_error(status, ("cudaMemPoolCreate(" + what + ")").c_str());
  }
  auto state    = std::make_shared<detail::pool_state>();
  state->handle = handle;
  state->owned  = true;
  state->where  = props.location;
  state->type   = props.type;
  state->props  = props;
  // A new handle or a spare: no live state can own it (the driver reuses a value only once
  // destroyed; a spare was no live state's).
  static_cast<void>(detail::register_owned(state));
  mem_pool pool{std::move(state)};  // destroys the driver pool if the threshold call throws
  pool.set<pool_attribute::release_threshold>(
    props.release_threshold.value_or(std::numeric_limits<std::uint64_t>::max()));
  return pool;
}

mem_pool mem_pool::from_handle(cudaMemPool_t handle,
                               bool owned,
                               std::optional<asyncmr::location> location,
                               std::optional<allocation_type> type)
{
  if (handle == nullptr) {
    throw std::invalid_argument{"asyncmr: pool handle must be a non-zero 64-bit address, got 0"};
  }
  // A combination CUDA is known to refuse is named before the driver is looked for (as create
  // and import_fd do).
  if (location && type) { validate_combination(*location, *type, false); }
  require_cuda();
  // What asyncmr knows of this handle now (not its history: the driver reuses handle values,
  // so a handle asyncmr once destroyed may be another library's live pool today).
  auto found = detail::lookup(handle);
  switch (found.status) {
    case detail::handle_status::owned:
      // asyncmr owns this pool elsewhere: share that state, as a view unless ownership is
      // asked for (then the owner's copies and this one own it together).
      return mem_pool{std::move(found.state), !owned};
    case detail::handle_status::closing:
    case detail::handle_status::parked:
      throw std::invalid_argument{
        "asyncmr: this pool was closed by asyncmr and is destroyed once its last allocation is "
        "freed; it cannot be adopted"};
    case detail::handle_status::spare:
      throw std::invalid_argument{
        "asyncmr: this pool was closed by asyncmr, which keeps closed managed pools to serve "
        "later pools of the same kind; it cannot be adopted"};
    case detail::handle_status::unknown:
    case detail::handle_status::stand_in: break;
  }
  if (owned && found.status == detail::handle_status::stand_in) {
    throw std::invalid_argument{
      "asyncmr: this is asyncmr's process-wide default host pool; it can be adopted as a view "
      "(owned=False), not owned"};
  }
  if (!detail::address_is_mapped(handle)) {
    char text[32];
    std::snprintf(text, sizeof text, "%p", static_cast<void*>(handle));
    throw std::invalid_argument{std::string{"asyncmr: "} + text +
                                " is not a memory pool handle (nothing is mapped there)"};
  }
  auto state    = std::make_shared<detail::pool_state>();
  state->handle = handle;
  state->where  = location;
  state->type   = type;
  // Ownership is taken only once the driver answered for the handle: a handle the driver
  // rejects is not destroyed by the state's destructor.
  mem_pool pool{state};
  static_cast<void>(pool.get<pool_attribute::release_threshold>());
  if (!owned) { return pool; }
  // Another adoption of the same handle may have registered it since the lookup: then this
  // state, not yet seen by anyone, is dropped unowned (never destroying the pool) and this
  // adoption shares the first one's.
  state->owned = true;
  std::shared_ptr<detail::pool_state> first;
  try {
    first = detail::register_owned(state);
  } catch (pool_closed_error const& e) {
    state->owned = false;
    throw std::invalid_argument{e.what()};
  }
  if (first) {
    state->owned = false;
    return mem_pool{std::move(first), false};
  }
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

std::optional<asyncmr::location> mem_pool::location() const
{
  if (state_->where) { return state_->where; }
  if (versions().driver < info(pool_attribute::location_type).min_driver) { return {}; }
  try {
    cudaMemLocation loc{};
    loc.type = static_cast<cudaMemLocationType>(get<pool_attribute::location_type>());
    loc.id   = get<pool_attribute::location_id>();
    return asyncmr::location::from_cuda(loc);
  } catch (unsupported_error const&) {
    return {};
  }
}

std::optional<allocation_type> mem_pool::type() const
{
  if (state_->type) { return state_->type; }
  if (versions().driver < info(pool_attribute::allocation_type).min_driver) { return {}; }
  try {
    auto const raw = get<pool_attribute::allocation_type>();
    if (raw == 2) { return allocation_type::managed; }
    // Pinned to the driver: device memory when the pool lives on a device, else host memory.
    auto const w = location();
    if (!w) { return {}; }
    return w->kind == location_kind::device ? allocation_type::device : allocation_type::pinned;
  } catch (unsupported_error const&) {
    return {};
  }
}

std::optional<pool_properties> mem_pool::properties() const { return state_->props; }

std::optional<pool_usage> mem_pool::usage() const noexcept
{
  if (state_->imported) { return std::nullopt; }  // an import answers no attribute
  try {
    detail::pool_use const use{*state_};  // closed: refused here
    return detail::usage_of(use.handle());
  } catch (...) {
    return std::nullopt;
  }
}

void* mem_pool::allocate_async(std::size_t bytes, cudaStream_t stream) const
{
  auto& s = *state_;
  if (s.imported) {
    throw std::invalid_argument{"asyncmr: an imported pool cannot be allocated from (CUDA "
                                "allows only import_pointer on it)"};
  }
  // Counted until the error, if any, has read the pool's usage for its message.
  detail::pool_use const use{s, "asyncmr: allocating from a memory pool that was closed"};
  void* ptr = nullptr;
  cudaError_t status{};
  {
    // Relaxed, as every other pool call: while another thread captures in global mode (PyTorch's
    // default), the driver refuses a new pool's allocation in the default mode, every kind
    // (cudaErrorStreamCaptureUnsupported: docs/DRIVER_FACTS.md). A capture of
    // `stream` itself still records the allocation as a graph node.
    detail::relaxed_capture_guard const relaxed;
    status = cudaMallocFromPoolAsync(&ptr, bytes, use.handle(), stream);
  }
  if (status != cudaSuccess) {
    detail::throw_allocation_error(status, bytes, stream, s, use.handle());
  }
  return ptr;
}

cudaError_t mem_pool::deallocate_async(void* ptr, cudaStream_t stream) const noexcept
{
  // Counted in flight, as an allocation is: the driver drops the pool's used bytes inside the
  // call, and a closed pool found empty meanwhile must not be destroyed under it.
  auto& in_flight = state_->in_flight;
  in_flight.fetch_add(1);
  cudaError_t status{};
  {
    detail::relaxed_capture_guard const relaxed;  // as allocate_async
    status = cudaFreeAsync(ptr, stream);
  }
  in_flight.fetch_sub(1);
  detail::clear_own_error(status);
  return status;
}

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
  detail::pool_use const use{*state_};
  cudaMemPool_t const h = use.handle();
  auto const& row       = info(attribute);
  int const driver      = versions().driver;
  auto unsupported      = [&](std::string const& why) {
    return unsupported_error{"asyncmr: pool attribute '" + std::string{row.name} + "' " + why +
                             ", and the value is not known for this pool without asking it"};
  };
  if (driver < row.min_driver) {
    if (auto known = known_value(*state_, attribute)) { return *known; }
    throw unsupported("needs a CUDA driver >= " + version_string(row.min_driver) +
                      "; this driver is " + version_string(driver));
  }
  // Integer and boolean attributes are 4 bytes wide in the driver; a zeroed 8-byte slot reads
  // them correctly on every little-endian host CUDA supports.
  std::uint64_t value = 0;
  cudaError_t status  = cudaSuccess;
  {
    detail::relaxed_capture_guard guard;
    status = cudaMemPoolGetAttribute(h, static_cast<cudaMemPoolAttr>(row.cuda_value), &value);
  }
  if (status == cudaErrorInvalidValue && row.min_driver > 13000) {
    // A driver that should know this attribute refused it (a build or platform without it):
    // what asyncmr knows still answers; otherwise it is unsupported, not an error.
    detail::clear_own_error(status);
    if (auto known = known_value(*state_, attribute)) { return *known; }
    throw unsupported("was refused by this driver (" + version_string(driver) +
                      ", cudaErrorInvalidValue)");
  }
  if (status != cudaSuccess) {
    detail::throw_cuda_error(status,
                             ("cudaMemPoolGetAttribute(" + std::string{row.name} + ")").c_str());
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
  detail::pool_use const use{*state_};
  cudaMemPool_t const h = use.handle();
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
  detail::pool_use const use{*state_};
  cudaMemPool_t const h = use.handle();
  detail::relaxed_capture_guard guard;
  detail::blocking_region wait;
  ASYNCMR_CUDA_TRY(cudaMemPoolTrimTo(h, min_bytes_to_keep));
}

mem_pool mem_pool::make_current() const
{
  // A close() waits for this, and this sees a close() that came first: a closed pool is never
  // made current (its reroute would have run already and no later one comes).
  std::lock_guard<std::mutex> const not_closing{state_->close_mutex};
  cudaMemPool_t const h = handle();
  if (state_->imported) {
    throw std::invalid_argument{"asyncmr: an imported pool cannot be made current"};
  }
  auto const w          = location();
  auto const t          = type();
  if (!w || !t) {
    throw unsupported_error{
      "asyncmr: make_current needs the pool's location and allocation type; this driver "
      "cannot report them for an adopted handle (pass them to from_handle)"};
  }
  detail::relaxed_capture_guard guard;
  auto const path    = detail::routing_path(*w, *t);
  auto const routing = detail::routing_lock();  // the previous pool is the one replaced
  mem_pool previous  = current_routed(*w, *t);
  detail::set_current_pool(*w, *t, h, path);
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
  // Allocations through other copies may be in flight: the registry reads this state's
  // in-flight count before it decides to destroy the driver pool.
  std::lock_guard<std::mutex> lock{state_->close_mutex};
  if (cudaMemPool_t const h = state_->detach()) {
    // Frees bypass the caches from now on (the handle is cleared); what they hold goes back now,
    // so that the pool is destroyed here rather than parked behind cached blocks.
    detail::run_pool_closing_hook(h);
    detail::retire(h, state_, state_->live_imports, state_->after_retirement());
  }
}

bool mem_pool::operator==(mem_pool const& other) const noexcept
{
  return state_ == other.state_ || (handle_or_null() != nullptr &&
                                    handle_or_null() == other.handle_or_null());
}

namespace detail {
std::atomic<void (*)() noexcept> testing_pool_use_hook{nullptr};
}  // namespace detail

void testing::set_pool_use_hook(void (*hook)() noexcept) noexcept
{
  detail::testing_pool_use_hook.store(hook, std::memory_order_relaxed);
}

}  // namespace asyncmr

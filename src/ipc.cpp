/*
 * SPDX-License-Identifier: Apache-2.0
 */

// Sharing pools between processes: a pool exported as a POSIX file descriptor, imported
// elsewhere, and allocations exported and imported one by one. The rules CUDA sets, which
// these functions make hard to break: an importer must not use an allocation before the
// exporter's allocation completed, and must release it before the exporter frees it; an
// imported pool cannot be allocated from.

#include "detail/device_sync.hpp"
#include "detail/driver_api.hpp"
#include "detail/pool_state.hpp"

#include <asyncmr/detail/blocking.hpp>

#include <asyncmr/capability.hpp>
#include <asyncmr/detail/capture_mode.hpp>
#include <asyncmr/error.hpp>
#include <asyncmr/mem_pool.hpp>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace asyncmr {

namespace {

[[noreturn]] void refuse_export(cudaError_t status, char const* what)
{
  detail::clear_own_error(status);
  if (status == cudaErrorInvalidValue || status == cudaErrorNotSupported) {
    throw std::invalid_argument{
      std::string{"asyncmr: the driver refused to export "} + what + " (" +
      cudaGetErrorName(status) +
      "): was the pool created with export_handle_types including posix_fd, and exported "
      "(export_fd) before its allocations?"};
  }
  detail::throw_cuda_error(status, what);
}

}  // namespace

exported_pointer export_pointer(void* ptr)
{
  if (ptr == nullptr) { throw std::invalid_argument{"asyncmr: cannot export a null pointer"}; }
  static_assert(sizeof(exported_pointer) == sizeof(cudaMemPoolPtrExportData));
  cudaMemPoolPtrExportData data{};
  auto const status = cudaMemPoolExportPointer(&data, ptr);
  if (status != cudaSuccess) { refuse_export(status, "an allocation (cudaMemPoolExportPointer)"); }
  exported_pointer out;
  std::memcpy(out.bytes, &data, sizeof data);
  return out;
}

int mem_pool::export_fd() const
{
  detail::pool_use const use{*state_};
  cudaMemPool_t const h = use.handle();
  if (state_->props &&
      (state_->props->export_handle_types & static_cast<int>(export_handle::posix_fd)) == 0) {
    throw std::invalid_argument{
      "asyncmr: this pool was created without export_handle_types including posix_fd, so it "
      "cannot be shared with another process"};
  }
  if (state_->imported) {
    throw std::invalid_argument{"asyncmr: an imported pool cannot be exported again"};
  }
  int fd = -1;
  detail::relaxed_capture_guard guard;
  auto const status =
    cudaMemPoolExportToShareableHandle(&fd, h, cudaMemHandleTypePosixFileDescriptor, 0);
  if (status != cudaSuccess) { refuse_export(status, "the pool (cudaMemPoolExportToShareableHandle)"); }
  return fd;
}

mem_pool mem_pool::import_fd(int fd, asyncmr::location location, allocation_type type)
{
  if (fd < 0) {
    throw std::invalid_argument{"asyncmr: a pool file descriptor is >= 0, got " +
                                std::to_string(fd)};
  }
  validate_combination(location, type, false);
  require_cuda();
  cudaMemPool_t h = nullptr;
  {
    detail::relaxed_capture_guard guard;
    auto const status = cudaMemPoolImportFromShareableHandle(
      &h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
      cudaMemHandleTypePosixFileDescriptor, 0);
    // A descriptor of something else (a file, a socket) is answered "invalid value" or, on the
    // 580 driver, "unknown error".
    if (status == cudaErrorInvalidValue || status == cudaErrorInvalidResourceHandle ||
        status == cudaErrorUnknown) {
      detail::clear_own_error(status);
      throw std::invalid_argument{
        "asyncmr: file descriptor " + std::to_string(fd) +
        " is not an exported memory pool (cudaMemPoolImportFromShareableHandle: " +
        cudaGetErrorName(status) + ")"};
    }
    if (status != cudaSuccess) {
      detail::throw_cuda_error(status, "cudaMemPoolImportFromShareableHandle");
    }
  }
  auto state      = std::make_shared<detail::pool_state>();
  state->handle   = h;
  state->owned    = true;
  state->imported = true;
  state->live_imports = std::make_shared<std::atomic<std::int64_t>>(0);
  state->where    = location;
  state->type     = type;
  return mem_pool{std::move(state)};
}

bool mem_pool::imported() const noexcept { return state_->imported; }

namespace {

// The bytes the driver mapped at `ptr` (CU_POINTER_ATTRIBUTE_RANGE_START_ADDR / _RANGE_SIZE), or
// 0 when it cannot say: the size an importer may use, whatever its peer claims.
std::size_t mapped_bytes(void* ptr) noexcept
{
  constexpr int range_start = 11;  // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
  constexpr int range_size  = 12;  // CU_POINTER_ATTRIBUTE_RANGE_SIZE
  unsigned long long start = 0;
  std::size_t size         = 0;
  if (detail::pointer_attribute(&start, range_start, ptr) != 0 ||
      detail::pointer_attribute(&size, range_size, ptr) != 0) {
    return 0;
  }
  return detail::bytes_from(start, size, reinterpret_cast<std::uintptr_t>(ptr));
}

}  // namespace

std::size_t detail::bytes_from(std::uint64_t start, std::uint64_t size, std::uint64_t address) noexcept
{
  // A range that does not hold the address (a pinned pool block's start is not the block:
  // docs/DRIVER_FACTS.md) says nothing about it; its size less the offset would wrap.
  if (address < start || address - start >= size) { return 0; }
  return static_cast<std::size_t>(size - (address - start));
}

imported_allocation mem_pool::import_pointer(exported_pointer const& data) const
{
  detail::pool_use const use{*state_};
  cudaMemPool_t const h = use.handle();
  if (!state_->imported) {
    throw std::invalid_argument{
      "asyncmr: import_pointer needs an imported pool (mem_pool::import_fd)"};
  }
  cudaMemPoolPtrExportData raw{};
  std::memcpy(&raw, data.bytes, sizeof raw);
  void* ptr = nullptr;
  cudaError_t status{};
  // Counted before the import exists (and for as long as it lives): a close() from now on
  // parks the pool instead of destroying the import under it.
  state_->live_imports->fetch_add(1);
  {
    detail::relaxed_capture_guard guard;
    status = cudaMemPoolImportPointer(&ptr, h, &raw);
  }
  if (status != cudaSuccess) { state_->live_imports->fetch_sub(1); }
  if (status == cudaErrorInvalidValue) {
    detail::clear_own_error(status);
    throw std::invalid_argument{
      "asyncmr: the driver refused the exported pointer data (cudaMemPoolImportPointer: "
      "cudaErrorInvalidValue): it must come from export_pointer on an allocation of the pool "
      "this one imports"};
  }
  if (status != cudaSuccess) { detail::throw_cuda_error(status, "cudaMemPoolImportPointer"); }
  return imported_allocation{*this, ptr, mapped_bytes(ptr), detail::current_context()};
}

imported_allocation::imported_allocation(mem_pool pool,
                                         void* ptr,
                                         std::size_t size,
                                         void* context) noexcept
  : pool_{std::move(pool)}, ptr_{ptr}, size_{size}, context_{context}
{
}

imported_allocation::imported_allocation(imported_allocation&& other) noexcept
  : pool_{std::move(other.pool_)},
    ptr_{other.ptr_.exchange(nullptr)},
    size_{std::exchange(other.size_, 0)},
    context_{std::exchange(other.context_, nullptr)}
{
}

imported_allocation& imported_allocation::operator=(imported_allocation&& other) noexcept
{
  if (this != &other) {
    this->~imported_allocation();
    new (this) imported_allocation{std::move(other)};
  }
  return *this;
}

imported_allocation::~imported_allocation()
{
  if (ptr_.load() == nullptr) { return; }
  try {
    release();
  } catch (...) {  // NOLINT(bugprone-empty-catch): the import stays counted; nothing is freed twice
  }
}

void imported_allocation::release()
{
  if (ptr_.load() == nullptr) { return; }
  // A stream nobody captures, made in the import's context (the calling thread may have another
  // current, or none: a garbage collector's), and made, used and destroyed in relaxed mode, so
  // that another thread's global-mode capture neither refuses nor breaks. The legacy stream
  // would break a capture on any blocking stream of the device (docs/DRIVER_FACTS.md).
  detail::relaxed_capture_guard const relaxed;
  detail::context_scope const in_import_context{context_};
  detail::scratch_stream const own;
  release(own.get());
}

void imported_allocation::release(cudaStream_t stream)
{
  // A second thread waits here (without the GIL: Python calls this in a blocking region) until
  // the first has freed and waited, then finds nothing to free: it returns only once the free
  // has run (ptr_ is cleared before the wait, so it is read under the lock only).
  std::lock_guard<std::mutex> const one_at_a_time{release_mutex_};
  void* const ptr = ptr_.load();
  if (ptr == nullptr) { return; }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  auto const query                = cudaStreamIsCapturing(stream, &capture);
  detail::clear_own_error(query);
  if (query != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    throw unsupported_error{
      "asyncmr: an imported allocation cannot be released on a stream that is capturing (a "
      "graph cannot free another process's memory); release it outside the capture. Nothing "
      "was changed"};
  }
  if (cudaError_t const freed = pool_.deallocate_async(ptr, stream); freed != cudaSuccess) {
    detail::throw_cuda_error(freed, "cudaFreeAsync(ptr, stream)");  // as every pool free
  }
  ptr_.store(nullptr);  // the free is enqueued: never again
  cudaError_t status{};
  {
    // Relaxed: this wait must not refuse (and break) a global-mode capture on another thread.
    detail::relaxed_capture_guard const relaxed;
    detail::blocking_region wait;
    status = cudaStreamSynchronize(stream);
  }
  if (status != cudaSuccess) {
    // The free may not have run: the import stays counted, so the pool outlives it.
    detail::throw_cuda_error(status, "cudaStreamSynchronize after releasing an imported allocation "
                                     "(the import stays counted)");
  }
  pool_.state_->live_imports->fetch_sub(1);  // the free has run: the import may be destroyed now
}

}  // namespace asyncmr

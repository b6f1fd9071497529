/*
 * SPDX-License-Identifier: Apache-2.0
 */

// Prefetch and discard of managed memory (placement.hpp).

#include <asyncmr/capability.hpp>
#include <asyncmr/error.hpp>
#include <asyncmr/placement.hpp>

#include "detail/placement.hpp"
#include "detail/front_cache.hpp"
#include "detail/stream_queries.hpp"

#include <asyncmr/detail/capture_mode.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <iterator>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <vector>

namespace asyncmr {
namespace detail {

void check_target_kind(location to, char const* what)
{
  if (to.kind != location_kind::device && !to.is_host()) {
    throw std::invalid_argument{std::string{"asyncmr: "} + what +
                                " must be a device or the host, got " + to.to_string()};
  }
  if (to.kind == location_kind::device) { check_device_ordinal(to.id, what); }
  if (to.kind == location_kind::host_numa) {
    check_host_numa_node(to.id, ("a prefetch to " + to.to_string()).c_str());
  }
}

void require_placement_driver(char const* what)
{
#if CUDART_VERSION < 13000
  // The CUDA 12 build calls cudaMemPrefetchAsync_v2 and cudaMemAdvise_v2 (they take a
  // cudaMemLocation), which a 12.0 or 12.1 driver does not have: say so, not a generic error.
  int const driver = versions().driver;
  if (driver != 0 && driver < placement_driver) {
    throw unsupported_error{std::string{"asyncmr: "} + what +
                            " needs a CUDA 12.2 or newer driver (cudaMemPrefetchAsync_v2 and "
                            "cudaMemAdvise_v2 take a location); this driver is " +
                            version_string(driver)};
  }
#else
  static_cast<void>(what);  // the CUDA 13 build refuses a driver older than 13.0 (require_cuda)
#endif
}

void check_prefetch_target(location to)
{
  check_target_kind(to, "prefetch");
  require_placement_driver("prefetch");
  if (to.kind == location_kind::device) { require_device(to.id); }
}

cudaError_t prefetch_async(void const* ptr, std::size_t bytes, location to,
                           cudaStream_t stream) noexcept
{
#if CUDART_VERSION >= 13000
  return cudaMemPrefetchAsync(ptr, bytes, to.to_cuda(), 0, stream);
#else
  return cudaMemPrefetchAsync_v2(ptr, bytes, to.to_cuda(), 0, stream);
#endif
}

cudaError_t discard_and_prefetch_async(void* ptr, std::size_t bytes, location to,
                                       cudaStream_t stream) noexcept
{
  // The driver's batched discards refuse the legacy NULL stream (cuda_runtime_api.h: "must not
  // be legacy NULL stream"), which RMM, CuPy's null stream and cuDF use when no stream is
  // named: there the allocation is prefetched without the discard.
  if (legacy_stream(stream)) { return prefetch_async(ptr, bytes, to, stream); }
#if CUDART_VERSION >= 13000
  cudaMemLocation where = to.to_cuda();
  std::size_t first     = 0;
  return cudaMemDiscardAndPrefetchBatchAsync(&ptr, &bytes, 1, &where, &first, 1, 0, stream);
#else
  static_cast<void>(ptr);
  static_cast<void>(bytes);
  static_cast<void>(to);
  static_cast<void>(stream);
  return cudaErrorNotSupported;
#endif
}

}  // namespace detail

namespace {

std::atomic<std::uint64_t> refused_prefetches{0};

}  // namespace

std::uint64_t failed_prefetches() noexcept
{
  return refused_prefetches.load(std::memory_order_relaxed);
}

void allocation_placement::place(void* ptr, std::size_t bytes, cudaStream_t stream) const noexcept
{
  // A prefetch on a capturing stream invalidates the capture (docs/DRIVER_FACTS.md): a graph's
  // allocation is not placed.
  if (ptr == nullptr || detail::stream_capturing(stream)) { return; }
  detail::relaxed_capture_guard guard;  // another thread's global capture: neither refused nor broken
  cudaError_t const status = discard_ ? detail::discard_and_prefetch_async(ptr, bytes, to_, stream)
                                      : detail::prefetch_async(ptr, bytes, to_, stream);
  if (status != cudaSuccess) {
    detail::clear_own_error(status);
    refused_prefetches.fetch_add(1, std::memory_order_relaxed);
  }
}

namespace {

[[noreturn]] void needs_cuda13(char const* what)
{
  throw unsupported_error{std::string{"asyncmr: "} + what +
                          " needs the CUDA 13 build of asyncmr (asyncmr-cu13) on a CUDA 13 "
                          "driver; this build is for CUDA " +
                          version_string(versions().runtime)};
}

// Everything is checked before the first call to the driver: the ranges and the target's kind,
// then, for the discards, that this build has them (bad input is bad input in every build), then
// that there is a driver, then the target device.
void check_ranges(std::span<memory_range const> ranges, char const* what,
                  location const* to = nullptr, bool discards = false)
{
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].ptr == nullptr && ranges[i].bytes != 0) {
      throw std::invalid_argument{std::string{"asyncmr: "} + what + ": range " +
                                  std::to_string(i) + " is a null pointer of " +
                                  std::to_string(ranges[i].bytes) + " bytes"};
    }
    auto const start = reinterpret_cast<std::uintptr_t>(ranges[i].ptr);
    if (ranges[i].bytes > UINTPTR_MAX - start) {
      throw std::invalid_argument{std::string{"asyncmr: "} + what + ": range " +
                                  std::to_string(i) + " runs past the end of the address space (" +
                                  std::to_string(ranges[i].bytes) + " bytes from " +
                                  std::to_string(start) + ")"};
    }
  }
  if (to != nullptr) { detail::check_target_kind(*to, "to"); }
  if (discards && !can_discard()) { needs_cuda13(what); }
  static_cast<void>(require_cuda());  // no driver: say so, not "capturing"
  detail::require_placement_driver(what);
  if (to != nullptr && to->kind == location_kind::device) { require_device(to->id); }
}

// The batched discards' own refusal, before any driver call, in words (the driver would say
// cudaErrorInvalidValue, which reads as "not managed memory").
void check_not_legacy(cudaStream_t stream, char const* what)
{
  if (detail::legacy_stream(stream)) {
    throw unsupported_error{std::string{"asyncmr: "} + what +
                            " on the legacy default stream: the driver's batched discard calls "
                            "refuse it (cudaMemDiscardBatchAsync: \"must not be legacy NULL "
                            "stream\"); pass a stream you created, or the per-thread default "
                            "stream"};
  }
}

// As check_ranges, and the stream-ordered calls refuse a capturing stream.
void check(std::span<memory_range const> ranges, cudaStream_t stream, char const* what,
           location const* to = nullptr, bool discards = false)
{
  check_ranges(ranges, what, to, discards);
  if (detail::stream_capturing(stream)) {
    throw unsupported_error{std::string{"asyncmr: "} + what +
                            " on a capturing stream: the driver would invalidate the capture "
                            "(issue it before the capture, or on another stream)"};
  }
}

[[noreturn]] void refused(char const* what, std::string const& range, cudaError_t status,
                          location const* to = nullptr)
{
  detail::clear_own_error(status);
  if (status == cudaErrorInvalidDevice) {
    // The range is not at fault: the target cannot take it (cudaMemPrefetchAsync: a device
    // without concurrent managed access).
    throw std::invalid_argument{std::string{"asyncmr: "} + what + " refused " + range +
                                ": the driver refused the target" +
                                (to != nullptr ? " " + to->to_string() : std::string{}) +
                                " (cudaErrorInvalidDevice: a device without concurrent managed "
                                "access cannot be one)"};
  }
  if (status == cudaErrorInvalidValue) {
    throw std::invalid_argument{std::string{"asyncmr: "} + what + " refused " + range +
                                ": not managed memory, or a range the driver does not know (" +
                                cudaGetErrorName(status) + ")"};
  }
  detail::throw_cuda_error(status, (std::string{what} + " of " + range).c_str());
}

struct batch {
  std::vector<void*> ptrs;
  std::vector<std::size_t> sizes;
  std::vector<std::size_t> index;  // into the caller's ranges
};

// A batched call names no range when it refuses: the message names them all.
std::string batch_name(batch const& b)
{
  return "the batch of " + std::to_string(b.ptrs.size()) + " ranges (one of them)";
}

batch non_empty(std::span<memory_range const> ranges)
{
  batch b;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].bytes == 0) { continue; }
    b.ptrs.push_back(ranges[i].ptr);
    b.sizes.push_back(ranges[i].bytes);
    b.index.push_back(i);
  }
  return b;
}

// Each memory_advice, in the enum's order: the driver's kind and the name.
struct advice_kind {
  cudaMemoryAdvise cuda;
  char const* name;
};
constexpr advice_kind advice_kinds[] = {
  {cudaMemAdviseSetReadMostly, "set_read_mostly"},
  {cudaMemAdviseUnsetReadMostly, "unset_read_mostly"},
  {cudaMemAdviseSetPreferredLocation, "set_preferred_location"},
  {cudaMemAdviseUnsetPreferredLocation, "unset_preferred_location"},
  {cudaMemAdviseSetAccessedBy, "set_accessed_by"},
  {cudaMemAdviseUnsetAccessedBy, "unset_accessed_by"},
};

advice_kind const* kind_of(memory_advice advice) noexcept
{
  auto const i = static_cast<std::size_t>(advice);  // an out-of-range int is huge here too
  return i < std::size(advice_kinds) ? &advice_kinds[i] : nullptr;
}

}  // namespace

char const* to_string(memory_advice advice) noexcept
{
  advice_kind const* const k = kind_of(advice);
  return k != nullptr ? k->name : "unknown";
}

void advise(std::span<memory_range const> ranges, memory_advice advice, location to)
{
  advice_kind const* const kind = kind_of(advice);
  if (kind == nullptr) {
    throw std::invalid_argument{"asyncmr: advise: unknown advice " +
                                std::to_string(static_cast<int>(advice))};
  }
  check_ranges(ranges, "advise", &to);  // a device or the host, as for prefetch; no capture
  detail::relaxed_capture_guard guard;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].bytes == 0) { continue; }
#if CUDART_VERSION >= 13000
    auto const status = cudaMemAdvise(ranges[i].ptr, ranges[i].bytes, kind->cuda, to.to_cuda());
#else
    auto const status = cudaMemAdvise_v2(ranges[i].ptr, ranges[i].bytes, kind->cuda, to.to_cuda());
#endif
    if (status == cudaSuccess) { continue; }
    std::string const range = "range " + std::to_string(i) + " (" +
                              std::to_string(ranges[i].bytes) + " bytes)";
    if (status == cudaErrorNotSupported) {
      detail::clear_own_error(status);
      throw unsupported_error{
        std::string{"asyncmr: advise("} + kind->name + ") of " + range +
        ": the driver takes no advice on this memory (cudaErrorNotSupported; on memory-pool "
        "allocations every kind is refused, docs/DRIVER_FACTS.md). For a managed pool use its "
        "location (AsyncManagedMR(location=...)), set_access, or prefetch"};
    }
    refused((std::string{"advise("} + kind->name + ")").c_str(), range, status, &to);
  }
}

bool can_discard() noexcept { return CUDART_VERSION >= 13000; }

void prefetch(std::span<memory_range const> ranges, location to, cuda::stream_ref stream)
{
  check(ranges, stream.get(), "prefetch", &to);
  // Relaxed, as advise and every pool call: another thread's global-mode capture must neither
  // refuse these stream-ordered calls nor be invalidated by them.
  detail::relaxed_capture_guard guard;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].bytes == 0) { continue; }
    auto const status = detail::prefetch_async(ranges[i].ptr, ranges[i].bytes, to, stream.get());
    if (status != cudaSuccess) {
      refused("prefetch", "range " + std::to_string(i) + " (" + std::to_string(ranges[i].bytes) +
                            " bytes)", status, &to);
    }
  }
}

void discard(std::span<memory_range const> ranges, cuda::stream_ref stream)
{
  check(ranges, stream.get(), "discard", nullptr, true);
  check_not_legacy(stream.get(), "discard");
  batch b = non_empty(ranges);
  if (b.ptrs.empty()) { return; }
  detail::relaxed_capture_guard guard;  // as prefetch
#if CUDART_VERSION >= 13000
  auto const status = cudaMemDiscardBatchAsync(b.ptrs.data(), b.sizes.data(), b.ptrs.size(), 0,
                                               stream.get());
  if (status != cudaSuccess) { refused("discard", batch_name(b), status); }
#endif
}

void discard_and_prefetch(std::span<memory_range const> ranges,
                          location to,
                          cuda::stream_ref stream)
{
  check(ranges, stream.get(), "discard_and_prefetch", &to, true);
  check_not_legacy(stream.get(), "discard_and_prefetch");
  batch b = non_empty(ranges);
  if (b.ptrs.empty()) { return; }
  detail::relaxed_capture_guard guard;  // as prefetch
#if CUDART_VERSION >= 13000
  cudaMemLocation where = to.to_cuda();
  std::size_t first     = 0;  // every range goes to the one location
  auto const status = cudaMemDiscardAndPrefetchBatchAsync(b.ptrs.data(), b.sizes.data(),
                                                          b.ptrs.size(), &where, &first, 1, 0,
                                                          stream.get());
  if (status != cudaSuccess) { refused("discard_and_prefetch", batch_name(b), status, &to); }
#else
  static_cast<void>(to);
#endif
}

}  // namespace asyncmr

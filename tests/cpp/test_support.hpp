/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file test_support.hpp
 * @brief What the GPU tests share: the skip rules, a fixture that gives each test a stream and
 * puts the process-wide pools back as it found them, stream-capture and kernel helpers, and the
 * three resource kinds for typed tests.
 */

#include <asyncmr/asyncmr.hpp>

#include <gtest/gtest.h>

#include <cuda/stream>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace asyncmr::test {

inline constexpr std::size_t mib             = std::size_t{1} << 20;
inline constexpr std::uint64_t max_threshold = std::numeric_limits<std::uint64_t>::max();
/// @brief The seed of the pattern the test kernels write (see test_kernels.hpp).
inline constexpr std::uint32_t test_seed = 0x5eed1234u;

/// @brief Why device 0 cannot run the GPU tests ("" when it can). Computed once per process.
[[nodiscard]] std::string const& no_device_reason();
/// @brief Why managed pools cannot be used on device 0 ("" when they can).
[[nodiscard]] std::string managed_pools_unavailable();
/// @brief Why host (pinned) pools cannot be used on device 0 ("" when they can).
[[nodiscard]] std::string host_pools_unavailable();
/// @brief The number of visible devices (after `no_device_reason()` came back empty).
[[nodiscard]] int device_count();

/// @brief Skips the running test with `reason` unless it is empty. Use in a test body or SetUp.
#define ASYNCMR_SKIP_IF(reason_expr)                                             \
  do {                                                                           \
    std::string const asyncmr_skip_reason_ = (reason_expr);                      \
    if (!asyncmr_skip_reason_.empty()) { GTEST_SKIP() << asyncmr_skip_reason_; } \
  } while (0)

// ---- the driver's view, read without asyncmr --------------------------------------------------

/// @brief `cudaMemGetDefaultMemPool` for `where` and `type`, asked directly (a CUDA 12 build
/// asks the 13.x driver's `cuMemGetDefaultMemPool`).
[[nodiscard]] cudaMemPool_t driver_default_pool(location where, allocation_type type);
/// @brief `cudaMemGetMemPool` for `where` and `type`, asked directly (or `cuMemGetMemPool`).
[[nodiscard]] cudaMemPool_t driver_current_pool(location where, allocation_type type);
/// @brief The pool's release threshold in bytes, asked directly.
[[nodiscard]] std::uint64_t driver_threshold(cudaMemPool_t pool);
/// @brief Sets the pool's release threshold in bytes directly (fails the test on error).
void set_driver_threshold(cudaMemPool_t pool, std::uint64_t bytes);

// ---- fixture ---------------------------------------------------------------------------------

/**
 * @brief Base of every test that needs a GPU. Skips when device 0 is unusable (with the reason),
 * hands the test a non-blocking stream, and on exit puts the shared pools (default and current
 * pools of device 0, managed@device0, managed@host and pinned@host) back to the release
 * thresholds and routing they had, so tests do not depend on each other's order.
 */
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] cuda::stream_ref stream_ref() const noexcept { return cuda::stream_ref{stream_}; }

 private:
  struct shared_pool_snapshot {
    cudaMemLocation loc;
    int type;  ///< the driver's CUmemAllocationType (1 pinned, 2 managed)
    cudaMemPool_t default_pool;
    std::uint64_t default_threshold;
    cudaMemPool_t current_pool;
    std::uint64_t current_threshold;
  };
  std::vector<shared_pool_snapshot> saved_{};
  cudaStream_t stream_{nullptr};
  bool active_{false};
};

// ---- kernels and graphs ----------------------------------------------------------------------

/**
 * @brief Fills `bytes` bytes at `ptr` with a pattern by a kernel on `stream`, waits for the
 * stream, then reads the pattern back on the host: directly when `host_reads` (managed and
 * pinned memory), through a device-to-host copy otherwise. Succeeds when every word matches.
 */
[[nodiscard]] ::testing::AssertionResult kernel_writes_host_reads(void* ptr,
                                                                  std::size_t bytes,
                                                                  bool host_reads,
                                                                  cudaStream_t stream);

/**
 * @brief Copies `bytes` bytes at device-accessible `ptr` to the host (synchronously) and
 * succeeds when every word holds the pattern for `seed`.
 */
[[nodiscard]] ::testing::AssertionResult holds_pattern(void const* ptr,
                                                       std::size_t bytes,
                                                       std::uint32_t seed = test_seed);

/// @brief How many nodes of `type` `graph` has (e.g. `cudaGraphNodeTypeMemAlloc`).
[[nodiscard]] std::size_t count_nodes(cudaGraph_t graph, cudaGraphNodeType type);

/**
 * @brief A stream capture that cannot outlive the test: the destructor ends it (if `end()` was
 * not called) and destroys the graph.
 */
class capture_scope {
 public:
  capture_scope(cudaStream_t stream, cudaStreamCaptureMode mode);
  ~capture_scope();
  capture_scope(capture_scope const&)            = delete;
  capture_scope& operator=(capture_scope const&) = delete;

  /// @brief What `cudaStreamBeginCapture` returned.
  [[nodiscard]] cudaError_t begin_status() const noexcept { return begin_status_; }
  /// @brief Ends the capture; returns what `cudaStreamEndCapture` returned.
  cudaError_t end();
  /// @brief The captured graph after a successful `end()`, else nullptr.
  [[nodiscard]] cudaGraph_t graph() const noexcept { return graph_; }

 private:
  cudaStream_t stream_;
  cudaError_t begin_status_;
  bool ended_{false};
  cudaGraph_t graph_{nullptr};
};

/// @brief Instantiates `graph`, launches it on `stream` and waits; the first failing status.
[[nodiscard]] cudaError_t instantiate_and_run(cudaGraph_t graph, cudaStream_t stream);

/// @brief A `cudaMalloc` buffer freed at scope exit (for test scaffolding, not under test).
class device_scratch {
 public:
  explicit device_scratch(std::size_t bytes);
  ~device_scratch();
  device_scratch(device_scratch const&)            = delete;
  device_scratch& operator=(device_scratch const&) = delete;
  [[nodiscard]] void* get() const noexcept { return ptr_; }

 private:
  void* ptr_{nullptr};
};

// ---- the three resources, for typed tests ----------------------------------------------------

struct device_kind {
  using resource_type                   = async_device_memory_resource;
  using options_type                    = device_resource_options;
  static constexpr char const* name     = "device";
  static constexpr allocation_type type = allocation_type::device;
  static constexpr bool host_accessible = false;
  static constexpr bool host_pool       = false;
  [[nodiscard]] static location where() { return location::device(0); }
  [[nodiscard]] static std::string unavailable() { return {}; }
};

struct managed_kind {
  using resource_type                   = async_managed_memory_resource;
  using options_type                    = managed_resource_options;
  static constexpr char const* name     = "managed";
  static constexpr allocation_type type = allocation_type::managed;
  static constexpr bool host_accessible = true;
  static constexpr bool host_pool       = false;
  [[nodiscard]] static location where() { return location::device(0); }
  [[nodiscard]] static std::string unavailable() { return managed_pools_unavailable(); }
};

struct pinned_kind {
  using resource_type                   = async_pinned_memory_resource;
  using options_type                    = pinned_resource_options;
  static constexpr char const* name     = "pinned";
  static constexpr allocation_type type = allocation_type::pinned;
  static constexpr bool host_accessible = true;
  static constexpr bool host_pool       = true;
  [[nodiscard]] static location where() { return location::host(); }
  [[nodiscard]] static std::string unavailable() { return host_pools_unavailable(); }
};

using resource_kinds = ::testing::Types<device_kind, managed_kind, pinned_kind>;

/// @brief Names typed tests by kind ("device", "managed", "pinned") instead of a number.
struct kind_names {
  template <class Kind>
  static std::string GetName(int)
  { return Kind::name; }
};

/// @brief A GPU test run once per resource kind; skips kinds this device cannot serve.
template <class Kind>
class ResourceKindTest : public GpuTest {
 protected:
  using resource_type = typename Kind::resource_type;
  using options_type  = typename Kind::options_type;

  void SetUp() override
  {
    GpuTest::SetUp();
    if (IsSkipped()) { return; }
    ASYNCMR_SKIP_IF(Kind::unavailable());
  }

  /// @brief Options naming `source` and nothing else.
  [[nodiscard]] static options_type options(pool_source source)
  {
    options_type o{};
    o.source = source;
    return o;
  }

  /// @brief Properties of a new pool of this kind on device 0 / the host.
  [[nodiscard]] static pool_properties properties()
  {
    pool_properties p{};
    p.type  = Kind::type;
    p.location = Kind::where();
    return p;
  }
};

}  // namespace asyncmr::test

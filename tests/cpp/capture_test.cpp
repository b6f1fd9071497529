/*
 * SPDX-License-Identifier: Apache-2.0
 */

// Capture safety. Pool attribute, trim, access and routing calls are refused by CUDA while a
// capture is in progress, and the refusal invalidates the capture (docs/DRIVER_FACTS.md); asyncmr
// makes them in relaxed capture mode. Each test captures a kernel, makes the calls, and checks
// that the capture ends cleanly and its graph runs. Allocation inside a capture becomes a graph
// allocation node for device and managed@device pools, and is refused for host pools.

#include "test_support.hpp"

#include "test_kernels.hpp"

#include <asyncmr/detail/capture_mode.hpp>

#include <future>
#include <optional>
#include <thread>

namespace asyncmr::test {
namespace {

using attr = pool_attribute;

constexpr std::size_t graph_bytes = 1 * mib;
constexpr std::size_t graph_words = graph_bytes / sizeof(std::uint32_t);

class CaptureTest : public GpuTest {
 protected:
  void SetUp() override
  {
    GpuTest::SetUp();
    if (IsSkipped()) { return; }
    device_pool_.emplace(mem_pool::create(pool_properties{}));
    if (host_pools_unavailable().empty()) {
      host_pool_.emplace(mem_pool::create(
        pool_properties{.type = allocation_type::pinned, .location = location::host()}));
    }
  }
  void TearDown() override
  {
    host_pool_.reset();
    device_pool_.reset();
    GpuTest::TearDown();
  }

  /// @brief Every pool call outside allocation that asyncmr offers; each must succeed.
  void make_pool_calls()
  {
    auto& pool = *device_pool_;
    EXPECT_NO_THROW(static_cast<void>(pool.get<attr::release_threshold>()));
    EXPECT_NO_THROW(pool.set<attr::release_threshold>(64 * mib));
    EXPECT_NO_THROW(pool.set<attr::reuse_allow_opportunistic>(true));
    EXPECT_NO_THROW(static_cast<void>(pool.get<attr::reserved_mem_current>()));
    EXPECT_NO_THROW(pool.reset_peaks());
    EXPECT_NO_THROW(pool.trim_to(0));
    EXPECT_NO_THROW(static_cast<void>(pool.access(0)));
    EXPECT_NO_THROW({
      auto const previous = pool.make_current();
      static_cast<void>(previous.make_current());
    });
    if (host_pool_) {
      EXPECT_NO_THROW(host_pool_->set_access({0}, access_mode::read_write));
      EXPECT_NO_THROW(static_cast<void>(host_pool_->access(0)));
    }
  }

  /// A kernel and every pool call inside a capture in `mode` on this thread: the capture ends
  /// valid and its graph runs the kernel.
  void expect_pool_calls_keep_capture_valid(cudaStreamCaptureMode mode)
  {
    device_scratch scratch{graph_bytes};
    auto* const words = static_cast<std::uint32_t*>(scratch.get());
    {
      capture_scope capture{stream(), mode};
      ASSERT_EQ(cudaSuccess, capture.begin_status());
      ASSERT_EQ(cudaSuccess, launch_fill(words, graph_words, test_seed, stream()));
      make_pool_calls();
      ASSERT_EQ(cudaSuccess, capture.end());
      ASSERT_EQ(cudaSuccess, instantiate_and_run(capture.graph(), stream()));
    }
    EXPECT_TRUE(holds_pattern(words, graph_bytes));
  }

 private:
  std::optional<mem_pool> device_pool_{};
  std::optional<mem_pool> host_pool_{};
};

TEST_F(CaptureTest, PoolCallsDuringThreadLocalCaptureOnThisThreadKeepTheCaptureValid)
{
  expect_pool_calls_keep_capture_valid(cudaStreamCaptureModeThreadLocal);
}

TEST_F(CaptureTest, PoolCallsDuringGlobalCaptureOnThisThreadKeepTheCaptureValid)
{
  expect_pool_calls_keep_capture_valid(cudaStreamCaptureModeGlobal);
}

TEST_F(CaptureTest, PoolCallsWhileAnotherThreadCapturesInGlobalModeKeepTheCaptureValid)
{
  device_scratch scratch{graph_bytes};
  auto* const words    = static_cast<std::uint32_t*>(scratch.get());
  cudaStream_t const s = stream();
  cudaError_t begin    = cudaErrorUnknown;
  cudaError_t fill     = cudaErrorUnknown;
  cudaError_t end      = cudaErrorUnknown;
  cudaError_t run      = cudaErrorUnknown;
  std::promise<void> capturing;
  std::promise<void> calls_done;
  auto calls_done_future = calls_done.get_future();

  std::thread capturer{[&] {
    cudaSetDevice(0);
    capture_scope capture{s, cudaStreamCaptureModeGlobal};
    begin = capture.begin_status();
    if (begin == cudaSuccess) { fill = launch_fill(words, graph_words, test_seed, s); }
    capturing.set_value();
    calls_done_future.wait();
    if (begin == cudaSuccess) {
      end = capture.end();
      if (end == cudaSuccess) { run = instantiate_and_run(capture.graph(), s); }
    }
  }};
  capturing.get_future().wait();
  make_pool_calls();  // on this thread, while the other one captures in global mode
  calls_done.set_value();
  capturer.join();

  ASSERT_EQ(cudaSuccess, begin);
  EXPECT_EQ(cudaSuccess, fill);
  ASSERT_EQ(cudaSuccess, end) << cudaGetErrorName(end);
  ASSERT_EQ(cudaSuccess, run) << cudaGetErrorName(run);
  EXPECT_TRUE(holds_pattern(words, graph_bytes));
}

// ---- the guard itself -------------------------------------------------------------------------

/// @brief The calling thread's capture mode, read through the runtime (two exchanges: the mode
/// is left as it was), not through the path the guard takes.
cudaStreamCaptureMode thread_capture_mode()
{
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  EXPECT_EQ(cudaSuccess, cudaThreadExchangeStreamCaptureMode(&mode));
  cudaStreamCaptureMode back = mode;
  EXPECT_EQ(cudaSuccess, cudaThreadExchangeStreamCaptureMode(&back));
  return mode;
}

TEST_F(CaptureTest, TheRelaxedGuardRelaxesTheThreadAndGivesItsModeBackWhateverItWas)
{
  // The guard exchanges the mode through the driver's entry point where it has one: the
  // runtime must see the same mode inside (relaxed) and after (the thread's own, nested too).
  for (auto const own : {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                         cudaStreamCaptureModeRelaxed}) {
    cudaStreamCaptureMode previous = own;
    ASSERT_EQ(cudaSuccess, cudaThreadExchangeStreamCaptureMode(&previous));
    {
      detail::relaxed_capture_guard const outer;
      EXPECT_EQ(thread_capture_mode(), cudaStreamCaptureModeRelaxed) << own;
      {
        detail::relaxed_capture_guard const inner;
        EXPECT_EQ(thread_capture_mode(), cudaStreamCaptureModeRelaxed) << own;
      }
      EXPECT_EQ(thread_capture_mode(), cudaStreamCaptureModeRelaxed) << own;
    }
    EXPECT_EQ(thread_capture_mode(), own);
    ASSERT_EQ(cudaSuccess, cudaThreadExchangeStreamCaptureMode(&previous));  // as it was
  }
}

// ---- allocation inside a capture ---------------------------------------------------------

/// @brief Captures allocate, fill, check, free from `mr`; checks the graph has an allocation
/// node, runs it, and expects the check kernel to have found the pattern.
template <class Resource>
void expect_allocation_becomes_graph_node(Resource& mr, cudaStream_t stream)
{
  device_scratch counter{sizeof(unsigned long long)};
  auto* const mismatches = static_cast<unsigned long long*>(counter.get());
  {
    capture_scope capture{stream, cudaStreamCaptureModeThreadLocal};
    ASSERT_EQ(cudaSuccess, capture.begin_status());
    void* p = nullptr;
    ASSERT_NO_THROW(p = mr.allocate(cuda::stream_ref{stream}, graph_bytes));
    ASSERT_NE(p, nullptr);
    auto* const words = static_cast<std::uint32_t*>(p);
    ASSERT_EQ(cudaSuccess, cudaMemsetAsync(mismatches, 0, sizeof(*mismatches), stream));
    ASSERT_EQ(cudaSuccess, launch_fill(words, graph_words, test_seed, stream));
    ASSERT_EQ(cudaSuccess,
              launch_count_mismatches(words, graph_words, test_seed, mismatches, stream));
    mr.deallocate(cuda::stream_ref{stream}, p, graph_bytes);
    ASSERT_EQ(cudaSuccess, capture.end());
    EXPECT_EQ(count_nodes(capture.graph(), cudaGraphNodeTypeMemAlloc), 1u);
    EXPECT_EQ(count_nodes(capture.graph(), cudaGraphNodeTypeMemFree), 1u);
    ASSERT_EQ(cudaSuccess, instantiate_and_run(capture.graph(), stream));
  }
  unsigned long long wrong = ~0ULL;
  ASSERT_EQ(cudaSuccess, cudaMemcpy(&wrong, mismatches, sizeof(wrong), cudaMemcpyDeviceToHost));
  EXPECT_EQ(wrong, 0u);
}

TEST_F(CaptureTest, DevicePoolAllocationInsideACaptureBecomesAGraphNode)
{
  async_device_memory_resource mr{};
  expect_allocation_becomes_graph_node(mr, stream());
}

TEST_F(CaptureTest, OwnedDevicePoolAllocationInsideACaptureBecomesAGraphNode)
{
  async_device_memory_resource mr{device_resource_options{.source = pool_source::new_pool}};
  expect_allocation_becomes_graph_node(mr, stream());
}

TEST_F(CaptureTest, ManagedDevicePoolAllocationInsideACaptureBecomesAGraphNode)
{
  ASYNCMR_SKIP_IF(managed_pools_unavailable());
  async_managed_memory_resource mr{};
  expect_allocation_becomes_graph_node(mr, stream());
}

TEST_F(CaptureTest, PinnedPoolAllocationInsideACaptureThrowsUnsupportedAndTheCaptureSurvives)
{
  ASYNCMR_SKIP_IF(host_pools_unavailable());
  async_pinned_memory_resource mr{};
  device_scratch scratch{graph_bytes};
  auto* const words = static_cast<std::uint32_t*>(scratch.get());
  {
    capture_scope capture{stream(), cudaStreamCaptureModeThreadLocal};
    ASSERT_EQ(cudaSuccess, capture.begin_status());
    ASSERT_EQ(cudaSuccess, launch_fill(words, graph_words, test_seed, stream()));
    EXPECT_THROW(static_cast<void>(mr.allocate(stream_ref(), graph_bytes)), unsupported_error);
    ASSERT_EQ(cudaSuccess, capture.end());
    ASSERT_EQ(cudaSuccess, instantiate_and_run(capture.graph(), stream()));
  }
  EXPECT_TRUE(holds_pattern(words, graph_bytes));
  // The refusal left nothing behind: the resource allocates normally after the capture.
  void* p = mr.allocate(stream_ref(), graph_bytes);
  EXPECT_NE(p, nullptr);
  mr.deallocate(stream_ref(), p, graph_bytes);
}

}  // namespace
}  // namespace asyncmr::test

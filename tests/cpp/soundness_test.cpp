/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The soundness rules of the front cache and the pools, on the GPU: resources with different
// caches are different resources, a path that must not allocate does not (or survives when it
// cannot), and an imported allocation keeps its pool.

#include "alloc_failure.hpp"
#include "test_support.hpp"

#include <rmm/resource_ref.hpp>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <atomic>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

extern char** environ;

namespace asyncmr::test {
namespace {

constexpr std::size_t cache_cap = 64 * mib;

class SoundnessTest : public GpuTest {};

// ---- equality: memory of one may be freed through the other only if they are equal ------------

TEST_F(SoundnessTest, ResourcesWithDifferentCachesAreNotEqual)
{
  mem_pool const pool = mem_pool::create({.type = allocation_type::device,
                                          .location = location::device(0)});
  async_device_memory_resource const plain{pool};
  async_device_memory_resource const cached{pool, {.cache = cache_cap}};
  async_device_memory_resource const other_cache{pool, {.cache = cache_cap}};
  async_device_memory_resource const copy = cached;  // NOLINT(performance-unnecessary-copy-initialization)
  EXPECT_FALSE(plain == cached) << "an uncached and a cached resource on one pool compare equal";
  EXPECT_FALSE(cached == other_cache) << "two caches on one pool compare equal";
  EXPECT_TRUE(cached == copy) << "copies share the cache";
  EXPECT_TRUE(plain == async_device_memory_resource{pool});
  rmm::device_async_resource_ref const a{const_cast<async_device_memory_resource&>(plain)};
  rmm::device_async_resource_ref const b{const_cast<async_device_memory_resource&>(cached)};
  EXPECT_FALSE(a == b) << "RMM's resource_ref equality follows the resources'";
}

// ---- nothing allocates where a failure could leak or terminate -------------------------------------

TEST_F(SoundnessTest, ACapturedAllocationNeedsNoHostMemory)
{
  async_device_memory_resource mr{{.source = pool_source::new_pool, .cache = cache_cap}};
  capture_scope capture{stream(), cudaStreamCaptureModeThreadLocal};
  ASSERT_EQ(capture.begin_status(), cudaSuccess);
  void* p = nullptr;
  unsigned long allocations = 0;
  {
    // A graph allocation node is made by the driver; a host allocation after it could throw
    // and leak the graph's block, so the path makes none.
    counting_allocations counted;
    p           = mr.allocate(stream_ref(), mib);
    allocations = counted.count();
  }
  EXPECT_EQ(allocations, 0U) << "the captured allocation path allocated host memory";
  ASSERT_NE(p, nullptr);
  mr.deallocate(stream_ref(), p, mib);  // a graph free node
  ASSERT_EQ(capture.end(), cudaSuccess);
  EXPECT_EQ(instantiate_and_run(capture.graph(), stream()), cudaSuccess);
}

TEST_F(SoundnessTest, HitsAndPutsNeedNoHostMemory)
{
  async_device_memory_resource mr{{.source = pool_source::new_pool, .cache = cache_cap}};
  void* p = mr.allocate(stream_ref(), 4096);
  mr.deallocate(stream_ref(), p, 4096);
  unsigned long allocations = 0;
  int hits                  = 0;
  {
    counting_allocations counted;
    for (int i = 0; i < 100; ++i) {
      void* q = mr.allocate(stream_ref(), 4096);
      hits += q == p ? 1 : 0;
      mr.deallocate(stream_ref(), q, 4096);
    }
    allocations = counted.count();
  }
  EXPECT_EQ(hits, 100);
  EXPECT_EQ(allocations, 0U) << "the hit path allocated host memory";
  EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
}

// The child of the test below: fills a cache, releases it with no host memory to be had, then
// releases it again; exits 0 when the cache ended empty.
[[noreturn]] void release_without_host_memory(cudaStream_t stream)
{
  device_resource_options options{};
  options.source = pool_source::new_pool;
  options.cache  = cache_cap;
  async_device_memory_resource mr{options};
  cuda::stream_ref const s{stream};
  std::vector<void*> blocks;
  for (int i = 0; i < 64; ++i) { blocks.push_back(mr.allocate(s, 4096 * (i % 7 + 1))); }
  for (int i = 0; i < 64; ++i) { mr.deallocate(s, blocks[i], 4096 * (i % 7 + 1)); }
  {
    failing_allocations no_host_memory;
    try {
      mr.release_cache();
    } catch (std::bad_alloc const&) {  // NOLINT(bugprone-empty-catch): refusing is allowed
    }
  }
  mr.release_cache();
  std::fflush(nullptr);
  std::_Exit(mr.cache_stats()->cached_blocks == 0 ? 0 : 3);
}

// release_cache() must not terminate the process when host memory runs out; checked in a
// re-executed child (threadsafe death-test style), which starts CUDA afresh.
TEST_F(SoundnessTest, ReleasingTheCacheSurvivesHostAllocationFailure)
{
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(release_without_host_memory(stream()), ::testing::ExitedWithCode(0), "");
}

// ---- a release never breaks a capture on another thread ------------------------------------------

// A device-wide synchronization refuses while any stream of the device captures, and invalidates
// that capture, whatever the modes. So giving cached blocks back, or dropping a cached
// resource, while another thread captures unrelated work must leave that capture valid.
enum class release_action { release_cache, drop };

void release_during_capture(cudaStreamCaptureMode mode, release_action action)
{
  auto mr = std::make_unique<async_device_memory_resource>(
    device_resource_options{.source = pool_source::new_pool, .cache = cache_cap});
  cudaStream_t own = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), cudaSuccess);
  cuda::stream_ref const s{own};
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) { blocks.push_back(mr->allocate(s, 4096)); }
  for (void* p : blocks) { mr->deallocate(s, p, 4096); }
  ASSERT_EQ(cudaStreamSynchronize(own), cudaSuccess);
  ASSERT_EQ(mr->cache_stats()->cached_blocks, 8U);

  device_scratch scratch{4096};
  cudaStream_t captured = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&captured, cudaStreamNonBlocking), cudaSuccess);
  std::atomic<int> phase{0};  // 1: capturing, 2: released
  cudaError_t begin = cudaSuccess, end = cudaSuccess;
  cudaGraph_t graph = nullptr;
  std::thread capturer{[&] {
    begin = cudaStreamBeginCapture(captured, mode);
    static_cast<void>(cudaMemsetAsync(scratch.get(), 1, 4096, captured));
    phase = 1;
    while (phase.load() != 2) { std::this_thread::yield(); }
    static_cast<void>(cudaMemsetAsync(scratch.get(), 2, 4096, captured));
    end = cudaStreamEndCapture(captured, &graph);
  }};
  while (phase.load() != 1) { std::this_thread::yield(); }
  bool threw = false;
  try {
    if (action == release_action::release_cache) {
      mr->release_cache();
    } else {
      mr.reset();
    }
  } catch (std::exception const&) {
    threw = true;
  }
  phase = 2;
  capturer.join();
  ASSERT_EQ(begin, cudaSuccess);
  EXPECT_EQ(end, cudaSuccess) << "the other thread's capture was broken: " << cudaGetErrorName(end);
  EXPECT_FALSE(threw) << "the release refused while another thread captured";
  if (mr) {
    EXPECT_EQ(mr->cache_stats()->cached_blocks + mr->cache_stats()->parked_blocks, 0U)
      << "the blocks did not go back";
  }
  if (graph != nullptr) { EXPECT_EQ(instantiate_and_run(graph, captured), cudaSuccess); }
  static_cast<void>(cudaGetLastError());
  EXPECT_EQ(cudaStreamSynchronize(own), cudaSuccess);
  mr.reset();
  EXPECT_EQ(cudaStreamDestroy(captured), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(own), cudaSuccess);
}

TEST_F(SoundnessTest, ReleasingTheCacheLeavesAThreadLocalCaptureValid)
{
  release_during_capture(cudaStreamCaptureModeThreadLocal, release_action::release_cache);
}

TEST_F(SoundnessTest, ReleasingTheCacheLeavesAGlobalCaptureValid)
{
  release_during_capture(cudaStreamCaptureModeGlobal, release_action::release_cache);
}

TEST_F(SoundnessTest, DroppingACachedResourceLeavesACaptureValid)
{
  release_during_capture(cudaStreamCaptureModeThreadLocal, release_action::drop);
}

// ---- allocate_sync and captures ---------------------------------------------------------------------

// allocate_sync allocates on the calling thread's per-thread stream and waits for it. On a thread
// that captures that stream the wait cannot be (the driver refuses it and invalidates the
// capture): it is refused before anything is allocated, and the capture stays valid.
TEST_F(SoundnessTest, AllocateSyncOnAThreadCapturingItsStreamIsRefusedAndLeavesTheCaptureValid)
{
  async_device_memory_resource mr{device_resource_options{.source = pool_source::new_pool}};
  device_scratch scratch{4096};
  ASSERT_EQ(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal),
            cudaSuccess);
  static_cast<void>(cudaMemsetAsync(scratch.get(), 1, 4096, cudaStreamPerThread));
  bool refused = false;
  try {
    void* p = mr.allocate_sync(4096);
    mr.deallocate_sync(p, 4096);
  } catch (unsupported_error const& e) {
    refused = std::string{e.what()}.find("capturing") != std::string::npos;
  } catch (std::exception const& e) {
    ADD_FAILURE() << "allocate_sync threw something else: " << e.what();
  }
  cudaGraph_t graph = nullptr;
  cudaError_t const end = cudaStreamEndCapture(cudaStreamPerThread, &graph);
  EXPECT_TRUE(refused) << "allocate_sync was not refused, naming the capture";
  EXPECT_EQ(end, cudaSuccess) << "the capture was broken: " << cudaGetErrorName(end);
  if (graph != nullptr) { EXPECT_EQ(instantiate_and_run(graph, cudaStreamPerThread), cudaSuccess); }
  static_cast<void>(cudaGetLastError());
  EXPECT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
  EXPECT_EQ(mr.pool().get_attribute(pool_attribute::used_mem_current), 0U)
    << "the refused allocate_sync left a block allocated";
}

// Another thread's capture, in any mode, is not this thread's: allocate_sync serves it and leaves
// that capture valid.
void allocate_sync_beside_a_capture(cudaStreamCaptureMode mode)
{
  async_device_memory_resource mr{device_resource_options{.source = pool_source::new_pool}};
  device_scratch scratch{4096};
  cudaStream_t captured = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&captured, cudaStreamNonBlocking), cudaSuccess);
  std::atomic<int> phase{0};  // 1: capturing, 2: allocated
  cudaError_t begin = cudaSuccess, end = cudaSuccess;
  cudaGraph_t graph = nullptr;
  std::thread capturer{[&] {
    begin = cudaStreamBeginCapture(captured, mode);
    static_cast<void>(cudaMemsetAsync(scratch.get(), 1, 4096, captured));
    phase = 1;
    while (phase.load() != 2) { std::this_thread::yield(); }
    end = cudaStreamEndCapture(captured, &graph);
  }};
  while (phase.load() != 1) { std::this_thread::yield(); }
  void* p = nullptr;
  std::string error;
  try {
    p = mr.allocate_sync(4096);
  } catch (std::exception const& e) {
    error = e.what();
  }
  phase = 2;
  capturer.join();
  ASSERT_EQ(begin, cudaSuccess);
  EXPECT_EQ(end, cudaSuccess) << "the other thread's capture was broken: " << cudaGetErrorName(end);
  EXPECT_NE(p, nullptr) << "allocate_sync refused while another thread captured: " << error;
  if (graph != nullptr) { EXPECT_EQ(instantiate_and_run(graph, captured), cudaSuccess); }
  static_cast<void>(cudaGetLastError());
  if (p != nullptr) { mr.deallocate_sync(p, 4096); }
  EXPECT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(captured), cudaSuccess);
}

TEST_F(SoundnessTest, AllocateSyncLeavesAnotherThreadsGlobalCaptureValid)
{
  allocate_sync_beside_a_capture(cudaStreamCaptureModeGlobal);
}

TEST_F(SoundnessTest, AllocateSyncLeavesAnotherThreadsThreadLocalCaptureValid)
{
  allocate_sync_beside_a_capture(cudaStreamCaptureModeThreadLocal);
}

// ---- close(): a pool goes once its queued frees have run, not before ------------------------------

// A host function that sleeps holds the stream back: frees queued behind it have not run yet.
void CUDART_CB hold_stream(void*) { std::this_thread::sleep_for(std::chrono::milliseconds{300}); }

TEST_F(SoundnessTest, AClosedPoolWaitsForItsQueuedFreesAndThenGoes)
{
  mem_pool pool = mem_pool::create({.type = allocation_type::device,
                                    .location = location::device(0)});
  async_device_memory_resource mr{pool};
  cudaStream_t own = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), cudaSuccess);
  cuda::stream_ref const s{own};
  std::size_t const before = asyncmr::testing::parked_pools();
  ASSERT_EQ(cudaLaunchHostFunc(own, hold_stream, nullptr), cudaSuccess);
  for (int i = 0; i < 50; ++i) { mr.deallocate(s, mr.allocate(s, 4096), 4096); }
  EXPECT_EQ(pool.get_attribute(pool_attribute::used_mem_current), 0U)
    << "the driver counts a queued free as freed (docs/DRIVER_FACTS.md)";
  pool.close();
  EXPECT_EQ(asyncmr::testing::parked_pools(), before + 1)
    << "a pool closed under queued frees was destroyed instead of parked";
  EXPECT_EQ(cudaStreamSynchronize(own), cudaSuccess);
  EXPECT_EQ(asyncmr::testing::parked_pools(), before)
    << "the closed pool stayed parked after its frees ran";
  EXPECT_EQ(cudaStreamDestroy(own), cudaSuccess);
}

// ---- a free racing the beginning of a capture on its stream -------------------------------------

// The put hook (testing::set_put_hook) holds the freeing thread between the cache's decision to
// take the block and its record of the stream's order, until the main thread has begun a
// capture on that stream: the window a real race hits rarely, made certain.
std::atomic<int> race_step{0};
void wait_for_the_capture(cudaStream_t) noexcept
{
  race_step.store(1);
  while (race_step.load() != 2) { std::this_thread::yield(); }
}

struct put_hook_scope {
  explicit put_hook_scope(void (*hook)(cudaStream_t) noexcept) { testing::set_put_hook(hook); }
  ~put_hook_scope() { testing::set_put_hook(nullptr); }
  put_hook_scope(put_hook_scope const&)            = delete;
  put_hook_scope& operator=(put_hook_scope const&) = delete;
};

TEST_F(SoundnessTest, AFreeRacingACaptureOnItsStreamBreaksNeitherTheCaptureNorTheRecord)
{
  async_device_memory_resource mr{{.source = pool_source::new_pool, .cache = cache_cap}};
  mem_pool const pool = mr.pool();
  for (int round = 0; round < 20; ++round) {
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    cuda::stream_ref const sr{s};
    // A block cached on s before the race: its order is the marker's, which must survive.
    mr.deallocate(sr, mr.allocate(sr, 4096), 4096);
    void* const p = mr.allocate(sr, 4096);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaGraph_t graph = nullptr;
    {
      put_hook_scope const hook{&wait_for_the_capture};
      race_step.store(0);
      std::thread freeing{[&] { mr.deallocate(sr, p, 4096); }};
      while (race_step.load() != 1) { std::this_thread::yield(); }
      ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
      race_step.store(2);
      freeing.join();
      EXPECT_NO_THROW(mr.release_cache()) << "round " << round;
      EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess)
        << "round " << round << ": the racing free invalidated the capture";
    }
    if (graph != nullptr) {
      EXPECT_EQ(instantiate_and_run(graph, s), cudaSuccess);
      EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    }
    // The block that met the capture is cached, its stream's bucket unordered until the next
    // free there records the stream's order again; then a release gives everything back.
    mr.deallocate(sr, mr.allocate(sr, 4096), 4096);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_NO_THROW(mr.release_cache());
    EXPECT_EQ(pool.get_attribute(pool_attribute::used_mem_current), 0U)
      << "round " << round << ": a block was lost from the cache's record";
    EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
    cudaGetLastError();
    if (HasFailure()) { break; }
  }
}

// ---- IPC: an imported allocation keeps its imported pool alive -----------------------------------

template <class Import>
void* address_of(Import const& imported)
{
  if constexpr (std::is_pointer_v<Import>) {
    return imported;
  } else {
    return imported.get();
  }
}

std::string to_hex(exported_pointer const& data)
{
  std::string out;
  char byte[3];
  for (unsigned char const b : data.bytes) {
    std::snprintf(byte, sizeof byte, "%02x", b);
    out += byte;
  }
  return out;
}

exported_pointer from_hex(char const* text)
{
  exported_pointer data;
  for (std::size_t i = 0; i < sizeof data.bytes; ++i) {
    unsigned value = 0;
    std::sscanf(text + 2 * i, "%2x", &value);
    data.bytes[i] = static_cast<unsigned char>(value);
  }
  return data;
}

// The importing side (run only as the child of the test below).
TEST_F(SoundnessTest, IpcChildImportOutlivesItsPoolHandles)
{
  char const* fd_text   = std::getenv("ASYNCMR_IPC_FD");
  char const* data_text = std::getenv("ASYNCMR_IPC_DATA");
  if (fd_text == nullptr || data_text == nullptr) {
    GTEST_SKIP() << "not applicable: the importing child of "
                    "IpcAnImportKeepsItsPoolAfterEveryHandleIsGone";
  }
  mem_pool pool = mem_pool::import_fd(std::atoi(fd_text), location::device(0),
                                      allocation_type::device);
  // Generic, so the form of import_pointer's result decides which branch compiles.
  auto check = [&](auto& imported_pool) {
    auto imported = imported_pool.import_pointer(from_hex(data_text));
    imported_pool = mem_pool{};  // the last handle of the imported pool goes away
    EXPECT_TRUE(holds_pattern(address_of(imported), mib)) << "the import lost its mapping";
    if constexpr (!std::is_pointer_v<decltype(imported)>) { imported.release(stream()); }
  };
  check(pool);
}

TEST_F(SoundnessTest, IpcAnImportKeepsItsPoolAfterEveryHandleIsGone)
{
  if (std::getenv("ASYNCMR_IPC_FD") != nullptr) { GTEST_SKIP() << "not applicable: the child"; }
  mem_pool const pool = mem_pool::create({.type                = allocation_type::device,
                                          .location            = location::device(0),
                                          .export_handle_types = static_cast<int>(export_handle::posix_fd)});
  async_device_memory_resource mr{pool};
  int const fd = pool.export_fd();
  void* p      = mr.allocate(stream_ref(), mib);
  ASSERT_TRUE(kernel_writes_host_reads(p, mib, false, stream()));
  std::string const data = to_hex(export_pointer(p));
  ASSERT_EQ(fcntl(fd, F_SETFD, 0), 0);  // the child inherits the descriptor
  std::string const fd_env   = "ASYNCMR_IPC_FD=" + std::to_string(fd);
  std::string const data_env = "ASYNCMR_IPC_DATA=" + data;
  std::vector<std::string> env_strings{fd_env, data_env};
  for (char** e = environ; *e != nullptr; ++e) { env_strings.emplace_back(*e); }
  std::vector<char*> envp;
  for (auto& s : env_strings) { envp.push_back(s.data()); }
  envp.push_back(nullptr);
  std::string filter = "--gtest_filter=SoundnessTest.IpcChildImportOutlivesItsPoolHandles";
  std::string self   = "/proc/self/exe";
  char* argv[]       = {self.data(), filter.data(), nullptr};
  pid_t child        = 0;
  ASSERT_EQ(posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  close(fd);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
    << "the importing child failed (status " << status << ")";
  mr.deallocate(stream_ref(), p, mib);
  EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
}

}  // namespace
}  // namespace asyncmr::test

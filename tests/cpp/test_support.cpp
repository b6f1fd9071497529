/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "test_support.hpp"

#include "test_kernels.hpp"

#include <cstring>
#include <vector>

namespace asyncmr::test {
namespace {

std::string error_text(cudaError_t error)
{ return std::string{cudaGetErrorName(error)} + " (" + cudaGetErrorString(error) + ")"; }

bool device_attribute(cudaDeviceAttr attr)
{
  int value = 0;
  if (cudaDeviceGetAttribute(&value, attr, 0) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return value != 0;
}

// The (location, allocation type) pairs whose shared pools a test may change.
struct shared_pool_key {
  location where;
  allocation_type type;
};
std::vector<shared_pool_key> const& shared_pool_keys()
{
  static std::vector<shared_pool_key> const keys{
    {location::device(0), allocation_type::device},
    {location::device(0), allocation_type::managed},
    {location::host(), allocation_type::managed},
    {location::host(), allocation_type::pinned},
  };
  return keys;
}

}  // namespace

std::string const& no_device_reason()
{
  static std::string const reason = [] {
    int count         = 0;
    auto const status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      cudaGetLastError();
      return "no usable CUDA device: cudaGetDeviceCount failed with " + error_text(status);
    }
    if (count == 0) { return std::string{"no CUDA device: cudaGetDeviceCount returned 0"}; }
    if (!device_attribute(cudaDevAttrMemoryPoolsSupported)) {
      return std::string{
        "device 0 does not support memory pools (cudaDevAttrMemoryPoolsSupported=0)"};
    }
    return std::string{};
  }();
  return reason;
}

int device_count()
{
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::string managed_pools_unavailable()
{
  // A CUDA 12 build reaches a 13.x driver's managed pools through its entry points.
  if (versions().driver < 13000) {
    return "managed memory pools need a CUDA 13 driver; this one is " +
           version_string(versions().driver);
  }
  if (!device_attribute(cudaDevAttrConcurrentManagedAccess)) {
    return "device 0 has no concurrent managed access, which managed pools need";
  }
  return {};
}

std::string host_pools_unavailable()
{
  // cudaDevAttrHostMemoryPoolsSupported, by number: 12.9 headers do not name it.
  if (!device_attribute(static_cast<cudaDeviceAttr>(144))) {
    return "device 0 does not support host memory pools (cudaDevAttrHostMemoryPoolsSupported=0)";
  }
  return {};
}

// ---- the driver's view ------------------------------------------------------------------------
//
// Asked without asyncmr: the CUDA 13 runtime's calls, or in a CUDA 12 build the same driver
// functions through their entry points (CUDA 13 drivers only; the tests that need pools by
// location for host or managed memory skip on older drivers).

namespace {

using get_pool_fn = int (*)(cudaMemPool_t*, cudaMemLocation*, int);
using set_pool_fn = int (*)(cudaMemLocation*, int, cudaMemPool_t);

template <class Fn>
Fn driver_function(char const* symbol)
{
  void* address                          = nullptr;
  cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &address, 13000, cudaEnableDefault, &result) !=
        cudaSuccess ||
      result != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    ADD_FAILURE() << symbol << " is not in this driver";
    return nullptr;
  }
  return reinterpret_cast<Fn>(address);
}

int driver_type(allocation_type type) { return type == allocation_type::managed ? 2 : 1; }

cudaError_t get_pool(bool current, cudaMemLocation loc, int type, cudaMemPool_t* pool)
{
#if CUDART_VERSION >= 13000
  auto const t = static_cast<cudaMemAllocationType>(type);
  return current ? cudaMemGetMemPool(pool, &loc, t) : cudaMemGetDefaultMemPool(pool, &loc, t);
#else
  auto const fn = driver_function<get_pool_fn>(current ? "cuMemGetMemPool" : "cuMemGetDefaultMemPool");
  return fn == nullptr ? cudaErrorNotSupported : static_cast<cudaError_t>(fn(pool, &loc, type));
#endif
}

cudaError_t set_pool(cudaMemLocation loc, int type, cudaMemPool_t pool)
{
#if CUDART_VERSION >= 13000
  return cudaMemSetMemPool(&loc, static_cast<cudaMemAllocationType>(type), pool);
#else
  auto const fn = driver_function<set_pool_fn>("cuMemSetMemPool");
  return fn == nullptr ? cudaErrorNotSupported : static_cast<cudaError_t>(fn(&loc, type, pool));
#endif
}

}  // namespace

cudaMemPool_t driver_default_pool(location where, allocation_type type)
{
  cudaMemPool_t pool = nullptr;
  EXPECT_EQ(cudaSuccess, get_pool(false, where.to_cuda(), driver_type(type), &pool));
  return pool;
}

cudaMemPool_t driver_current_pool(location where, allocation_type type)
{
  cudaMemPool_t pool = nullptr;
  EXPECT_EQ(cudaSuccess, get_pool(true, where.to_cuda(), driver_type(type), &pool));
  return pool;
}

std::uint64_t driver_threshold(cudaMemPool_t pool)
{
  std::uint64_t value = 0;
  EXPECT_EQ(cudaSuccess, cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &value));
  return value;
}

void set_driver_threshold(cudaMemPool_t pool, std::uint64_t bytes)
{ EXPECT_EQ(cudaSuccess, cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &bytes)); }

// ---- fixture ---------------------------------------------------------------------------------

void GpuTest::SetUp()
{
  ASYNCMR_SKIP_IF(no_device_reason());
  ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
  for (auto const& key : shared_pool_keys()) {
    // Pairs this device or driver cannot serve are skipped; the tests of them skip too.
    if (key.type == allocation_type::managed && !managed_pools_unavailable().empty()) { continue; }
    if (key.where.is_host() && !host_pools_unavailable().empty()) { continue; }
    shared_pool_snapshot s{};
    s.loc  = key.where.to_cuda();
    s.type = driver_type(key.type);
    if (get_pool(false, s.loc, s.type, &s.default_pool) != cudaSuccess ||
        get_pool(true, s.loc, s.type, &s.current_pool) != cudaSuccess ||
        cudaMemPoolGetAttribute(
          s.default_pool, cudaMemPoolAttrReleaseThreshold, &s.default_threshold) != cudaSuccess ||
        cudaMemPoolGetAttribute(
          s.current_pool, cudaMemPoolAttrReleaseThreshold, &s.current_threshold) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    saved_.push_back(s);
  }
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  active_ = true;
}

void GpuTest::TearDown()
{
  if (!active_) { return; }
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
  EXPECT_EQ(cudaSuccess, cudaStreamDestroy(stream_));
  stream_ = nullptr;
  for (auto& s : saved_) {
    cudaMemPool_t now = nullptr;
    if (get_pool(true, s.loc, s.type, &now) == cudaSuccess && now != s.current_pool) {
      ADD_FAILURE() << "a test left another pool current; routing it back";
      EXPECT_EQ(cudaSuccess, set_pool(s.loc, s.type, s.current_pool));
    }
    EXPECT_EQ(cudaSuccess,
              cudaMemPoolSetAttribute(
                s.default_pool, cudaMemPoolAttrReleaseThreshold, &s.default_threshold));
    if (s.current_pool != s.default_pool) {
      EXPECT_EQ(cudaSuccess,
                cudaMemPoolSetAttribute(
                  s.current_pool, cudaMemPoolAttrReleaseThreshold, &s.current_threshold));
    }
  }
  saved_.clear();
  // A sticky error (an illegal address in a kernel) would fail every later test; say so here.
  EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
  cudaGetLastError();
  active_ = false;
}

// ---- kernels and graphs ----------------------------------------------------------------------

::testing::AssertionResult kernel_writes_host_reads(void* ptr,
                                                    std::size_t bytes,
                                                    bool host_reads,
                                                    cudaStream_t stream)
{
  constexpr std::uint32_t seed = test_seed;
  std::size_t const count      = bytes / sizeof(std::uint32_t);
  auto* const words            = static_cast<std::uint32_t*>(ptr);
  if (auto const e = launch_fill(words, count, seed, stream); e != cudaSuccess) {
    return ::testing::AssertionFailure() << "fill kernel launch: " << error_text(e);
  }
  std::vector<std::uint32_t> copy;
  std::uint32_t const* host_view = words;
  if (!host_reads) {
    copy.resize(count);
    if (auto const e = cudaMemcpyAsync(
          copy.data(), words, count * sizeof(std::uint32_t), cudaMemcpyDefault, stream);
        e != cudaSuccess) {
      return ::testing::AssertionFailure() << "device-to-host copy: " << error_text(e);
    }
    host_view = copy.data();
  }
  if (auto const e = cudaStreamSynchronize(stream); e != cudaSuccess) {
    return ::testing::AssertionFailure() << "stream synchronize: " << error_text(e);
  }
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (host_view[i] != pattern_word(i, seed)) { ++wrong; }
  }
  if (wrong != 0) {
    return ::testing::AssertionFailure() << wrong << " of " << count << " words read back wrong";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult holds_pattern(void const* ptr, std::size_t bytes, std::uint32_t seed)
{
  std::size_t const count = bytes / sizeof(std::uint32_t);
  std::vector<std::uint32_t> copy(count);
  if (auto const e = cudaMemcpy(copy.data(), ptr, count * sizeof(std::uint32_t), cudaMemcpyDefault);
      e != cudaSuccess) {
    return ::testing::AssertionFailure() << "copy to the host: " << error_text(e);
  }
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (copy[i] != pattern_word(i, seed)) { ++wrong; }
  }
  if (wrong != 0) {
    return ::testing::AssertionFailure()
           << wrong << " of " << count << " words differ from the pattern";
  }
  return ::testing::AssertionSuccess();
}

std::size_t count_nodes(cudaGraph_t graph, cudaGraphNodeType type)
{
  std::size_t n = 0;
  if (graph == nullptr || cudaGraphGetNodes(graph, nullptr, &n) != cudaSuccess) { return 0; }
  std::vector<cudaGraphNode_t> nodes(n);
  if (cudaGraphGetNodes(graph, nodes.data(), &n) != cudaSuccess) { return 0; }
  std::size_t matching = 0;
  for (auto* node : nodes) {
    cudaGraphNodeType t{};
    if (cudaGraphNodeGetType(node, &t) == cudaSuccess && t == type) { ++matching; }
  }
  return matching;
}

capture_scope::capture_scope(cudaStream_t stream, cudaStreamCaptureMode mode)
    : stream_{stream}, begin_status_{cudaStreamBeginCapture(stream, mode)}
{
  if (begin_status_ != cudaSuccess) { cudaGetLastError(); }
}

capture_scope::~capture_scope()
{
  if (begin_status_ == cudaSuccess && !ended_) { static_cast<void>(end()); }
  if (graph_ != nullptr) { cudaGraphDestroy(graph_); }
  cudaGetLastError();
}

cudaError_t capture_scope::end()
{
  ended_            = true;
  auto const status = cudaStreamEndCapture(stream_, &graph_);
  if (status != cudaSuccess) {
    cudaGetLastError();
    if (graph_ != nullptr) {
      cudaGraphDestroy(graph_);
      graph_ = nullptr;
    }
  }
  return status;
}

cudaError_t instantiate_and_run(cudaGraph_t graph, cudaStream_t stream)
{
  if (graph == nullptr) { return cudaErrorInvalidValue; }
  cudaGraphExec_t exec = nullptr;
  if (auto const e = cudaGraphInstantiate(&exec, graph, 0); e != cudaSuccess) { return e; }
  auto status = cudaGraphLaunch(exec, stream);
  if (status == cudaSuccess) { status = cudaStreamSynchronize(stream); }
  cudaGraphExecDestroy(exec);
  return status;
}

device_scratch::device_scratch(std::size_t bytes)
{ EXPECT_EQ(cudaSuccess, cudaMalloc(&ptr_, bytes)); }

device_scratch::~device_scratch()
{
  if (ptr_ != nullptr) { cudaFree(ptr_); }
}

}  // namespace asyncmr::test

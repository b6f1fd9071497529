/*
 * SPDX-License-Identifier: Apache-2.0
 */

// Launches the test kernels from the fatbin embedded at build time, through the driver API.
//
// Why not <<<>>>: a kernel compiled by nvcc registers itself with the CUDA runtime that nvcc
// ships, and that registration only links against the same runtime. The tests link asyncmr's
// static runtime instead, which is 12.9 for a cu12 build, while the GPU host's nvcc is 13. A
// fatbin loaded with cuModuleLoadData needs no runtime at all. The driver functions come from
// cudaGetDriverEntryPointByVersion, so the binary does not link libcuda either.

#include "test_kernels.hpp"

#include <cuda.h>

#include <cstdio>
#include <map>
#include <mutex>

namespace asyncmr::test {

// The fatbin's bytes (generated from test_kernels.cu, see CMakeLists.txt).
extern unsigned char const test_kernels_fatbin[];

namespace {

// The ABI versions asked for: each function as it has been since CUDA 12.0 (cuFuncLoad: 12.4).
constexpr unsigned int abi_12_0 = 12000;
constexpr unsigned int abi_12_4 = 12040;

struct driver_api {
  decltype(&::cuCtxGetCurrent) ctx_get_current{};
  decltype(&::cuModuleLoadData) module_load_data{};
  decltype(&::cuModuleGetFunction) module_get_function{};
  decltype(&::cuLaunchKernel) launch_kernel{};
  decltype(&::cuGetErrorName) get_error_name{};
  decltype(&::cuFuncLoad) func_load{};  // optional: absent before driver 12.4
  cudaError_t status{cudaSuccess};
};

template <class Fn>
cudaError_t entry_point(char const* name, Fn& fn, unsigned int abi)
{
  void* p                                = nullptr;
  cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
  auto const e = cudaGetDriverEntryPointByVersion(name, &p, abi, cudaEnableDefault, &result);
  if (e != cudaSuccess) { return e; }
  if (result != cudaDriverEntryPointSuccess || p == nullptr) { return cudaErrorSymbolNotFound; }
  fn = reinterpret_cast<Fn>(p);
  return cudaSuccess;
}

driver_api const& driver()
{
  static driver_api const api = [] {
    driver_api d{};
    for (auto const e : {entry_point("cuCtxGetCurrent", d.ctx_get_current, abi_12_0),
                         entry_point("cuModuleLoadData", d.module_load_data, abi_12_0),
                         entry_point("cuModuleGetFunction", d.module_get_function, abi_12_0),
                         entry_point("cuLaunchKernel", d.launch_kernel, abi_12_0),
                         entry_point("cuGetErrorName", d.get_error_name, abi_12_0)}) {
      if (e != cudaSuccess && d.status == cudaSuccess) { d.status = e; }
    }
    static_cast<void>(entry_point("cuFuncLoad", d.func_load, abi_12_4));
    return d;
  }();
  return api;
}

// CUDA keeps the runtime's error numbers equal to the driver's for the errors these calls
// return (invalid value 1, out of memory 2, illegal address 700, launch failure 719, capture
// errors 900-...), so the driver's code is returned under the runtime's name.
cudaError_t as_runtime_error(CUresult r) { return static_cast<cudaError_t>(r); }

// Relaxed capture mode for loading: module loading is not a stream operation, and a first
// launch may come inside a global-mode capture (the capture tests do exactly that).
class relaxed_capture {
 public:
  relaxed_capture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~relaxed_capture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  relaxed_capture(relaxed_capture const&)            = delete;
  relaxed_capture& operator=(relaxed_capture const&) = delete;

 private:
  cudaStreamCaptureMode mode_{cudaStreamCaptureModeRelaxed};
};

struct kernels {
  CUfunction fill{};
  CUfunction count_mismatches{};
};

// The kernels loaded into the current context (a module belongs to one context; the tests use
// the runtime's primary contexts, one per device).
cudaError_t current_kernels(kernels& out)
{
  auto const& d = driver();
  if (d.status != cudaSuccess) { return d.status; }

  CUcontext ctx = nullptr;
  if (auto const r = d.ctx_get_current(&ctx); r != CUDA_SUCCESS) { return as_runtime_error(r); }
  static std::mutex mutex;
  static std::map<CUcontext, kernels> loaded;
  if (ctx != nullptr) {
    std::lock_guard const lock{mutex};
    if (auto const it = loaded.find(ctx); it != loaded.end()) {
      out = it->second;
      return cudaSuccess;
    }
  }

  relaxed_capture const relaxed;
  if (ctx == nullptr) {
    // No runtime call has made a context current on this thread yet: the runtime's
    // cudaSetDevice makes the device's primary context current.
    int device = 0;
    if (auto const e = cudaGetDevice(&device); e != cudaSuccess) { return e; }
    if (auto const e = cudaSetDevice(device); e != cudaSuccess) { return e; }
    if (auto const r = d.ctx_get_current(&ctx); r != CUDA_SUCCESS) {
      return as_runtime_error(r);
    }
    if (ctx == nullptr) { return cudaErrorDeviceUninitialized; }
  }
  std::lock_guard const lock{mutex};
  if (auto const it = loaded.find(ctx); it != loaded.end()) {
    out = it->second;
    return cudaSuccess;
  }
  auto fail = [&](char const* what, CUresult r) {
    char const* name = nullptr;
    d.get_error_name(r, &name);
    std::fprintf(stderr, "test kernels: %s failed: %s\n", what, name ? name : "unknown error");
    return as_runtime_error(r);
  };
  CUmodule module = nullptr;
  if (auto const r = d.module_load_data(&module, test_kernels_fatbin); r != CUDA_SUCCESS) {
    return fail("cuModuleLoadData", r);
  }
  kernels k{};
  if (auto const r = d.module_get_function(&k.fill, module, "asyncmr_test_fill");
      r != CUDA_SUCCESS) {
    return fail("cuModuleGetFunction(asyncmr_test_fill)", r);
  }
  if (auto const r =
        d.module_get_function(&k.count_mismatches, module, "asyncmr_test_count_mismatches");
      r != CUDA_SUCCESS) {
    return fail("cuModuleGetFunction(asyncmr_test_count_mismatches)", r);
  }
  // Under lazy loading (the default since CUDA 12.2) a function may load at its first launch;
  // load both now, outside any capture, where the driver offers that.
  if (d.func_load != nullptr) {
    for (auto* f : {k.fill, k.count_mismatches}) {
      if (auto const r = d.func_load(f); r != CUDA_SUCCESS) { return fail("cuFuncLoad", r); }
    }
  }
  // The module lives until the process ends: kernels may be launched until then.
  loaded.emplace(ctx, k);
  out = k;
  return cudaSuccess;
}

constexpr unsigned block_size = 256;

unsigned grid_for(std::size_t count)
{
  auto const blocks = (count + block_size - 1) / block_size;
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks > 1024 ? 1024 : blocks));
}

cudaError_t launch(CUfunction f, std::size_t count, cudaStream_t stream, void** args)
{
  // cudaStream_t and CUstream are the same type (CUstream_st*).
  auto const r =
    driver().launch_kernel(f, grid_for(count), 1, 1, block_size, 1, 1, 0, stream, args, nullptr);
  return as_runtime_error(r);
}

}  // namespace

cudaError_t launch_fill(std::uint32_t* words,
                        std::size_t count,
                        std::uint32_t seed,
                        cudaStream_t stream)
{
  kernels k{};
  if (auto const e = current_kernels(k); e != cudaSuccess) { return e; }
  // The argument types match the kernel's parameters exactly (test_kernels.cu).
  unsigned long long n = count;
  void* args[]         = {&words, &n, &seed};
  return launch(k.fill, count, stream, args);
}

cudaError_t launch_count_mismatches(std::uint32_t const* words,
                                    std::size_t count,
                                    std::uint32_t seed,
                                    unsigned long long* mismatches,
                                    cudaStream_t stream)
{
  kernels k{};
  if (auto const e = current_kernels(k); e != cudaSuccess) { return e; }
  unsigned long long n = count;
  void* args[]         = {&words, &n, &seed, &mismatches};
  return launch(k.count_mismatches, count, stream, args);
}

}  // namespace asyncmr::test

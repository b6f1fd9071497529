/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include <asyncmr/capability.hpp>
#include <asyncmr/error.hpp>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace asyncmr {

cuda_versions versions() noexcept
{
  cuda_versions v{0, 0};
  if (cudaDriverGetVersion(&v.driver) != cudaSuccess) { v.driver = 0; }
  if (cudaRuntimeGetVersion(&v.runtime) != cudaSuccess) { v.runtime = CUDART_VERSION; }
  return v;
}

std::string version_string(int version)
{
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

int require_cuda()
{
  auto const v = versions();
  if (v.driver == 0) {
    throw no_device_error{
      "asyncmr: no CUDA driver found (libcuda.so could not be loaded). asyncmr needs an NVIDIA "
      "GPU and its driver (>= 580 for this CUDA " +
      version_string(CUDART_VERSION) + " build)."};
  }
  int count      = 0;
  auto const err = cudaGetDeviceCount(&count);
  // CUDA's minor-version compatibility lets a 13.x runtime run on any 13.0+ driver; only a
  // driver of an older major version (or one the runtime itself refuses) is too old.
  if (err == cudaErrorInsufficientDriver || v.driver / 1000 < v.runtime / 1000) {
    cudaGetLastError();
    throw no_device_error{"asyncmr: the CUDA driver (" + version_string(v.driver) +
                          ") is older than the CUDA runtime asyncmr was built with (" +
                          version_string(v.runtime) + "); upgrade the driver (>= 580 for CUDA 13)."};
  }
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    char const* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw no_device_error{std::string{"asyncmr: no CUDA device is visible ("} +
                          cudaGetErrorName(err) + ")" +
                          (visible != nullptr
                             ? std::string{"; CUDA_VISIBLE_DEVICES='"} + visible + "'"
                             : std::string{})};
  }
  return count;
}

void require_device(int device)
{
  int const count = require_cuda();
  if (device < 0 || device >= count) {
    throw std::out_of_range{"asyncmr: device " + std::to_string(device) +
                            " does not exist; visible devices are 0.." +
                            std::to_string(count - 1)};
  }
}

int current_device()
{
  require_cuda();
  int device = 0;
  ASYNCMR_CUDA_TRY(cudaGetDevice(&device));
  return device;
}

namespace {
bool device_attribute(cudaDeviceAttr attr, int device)
{
  int value = 0;
  ASYNCMR_CUDA_TRY(cudaDeviceGetAttribute(&value, attr, device));
  return value != 0;
}
}  // namespace

void require_pool_support(location const& loc, allocation_type type, int device)
{
  require_device(device);
  if (!device_attribute(cudaDevAttrMemoryPoolsSupported, device)) {
    throw unsupported_error{"asyncmr: device " + std::to_string(device) +
                            " does not support memory pools (cudaMallocAsync)"};
  }
  if (type == allocation_type::managed) {
#if CUDART_VERSION < 13000
    throw unsupported_error{
      "asyncmr: managed memory pools need CUDA 13; this asyncmr was built with CUDA " +
      version_string(CUDART_VERSION)};
#else
    auto const v = versions();
    if (v.driver < 13000) {
      throw unsupported_error{"asyncmr: managed memory pools need a CUDA 13 driver; this one is " +
                              version_string(v.driver)};
    }
    if (!device_attribute(cudaDevAttrConcurrentManagedAccess, device)) {
      throw unsupported_error{"asyncmr: device " + std::to_string(device) +
                              " has no concurrent managed access, which managed pools need "
                              "(not available on WSL2 and some platforms)"};
    }
#endif
  }
  if (type == allocation_type::pinned || (type == allocation_type::managed && loc.is_host())) {
#if CUDART_VERSION < 12060
    throw unsupported_error{"asyncmr: host memory pools need CUDA 12.6; this asyncmr was built "
                            "with CUDA " +
                            version_string(CUDART_VERSION)};
#else
    bool const numa = loc.kind == location_kind::host_numa ||
                      loc.kind == location_kind::host_numa_current;
    // cudaDevAttrHostNumaMemoryPoolsSupported (142) and cudaDevAttrHostMemoryPoolsSupported
    // (144) are not named by 12.6-12.8 headers; a runtime that does not know them refuses the
    // query, and then pool creation itself gives the driver's answer.
    auto const attr = static_cast<cudaDeviceAttr>(numa ? 142 : 144);
    int supported   = 1;
    if (cudaDeviceGetAttribute(&supported, attr, device) != cudaSuccess) {
      cudaGetLastError();
      supported = 1;
    }
    if (supported == 0) {
      throw unsupported_error{std::string{"asyncmr: device "} + std::to_string(device) +
                              " does not support " + (numa ? "host NUMA" : "host") +
                              " memory pools (driver " + version_string(versions().driver) +
                              "; they need a CUDA 12.6+ driver on Linux)"};
    }
#endif
  }
}

}  // namespace asyncmr

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include <asyncmr/capability.hpp>
#include <asyncmr/error.hpp>

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace asyncmr {
namespace {

// The first driver versions that have what asyncmr uses.
constexpr int host_pools_driver = 12060;  // cudaMemPoolCreate at host / host NUMA locations
constexpr int cuda13_driver     = 13000;  // managed pools, default/current pools by location

// -1: not read yet; 0: no override; > 0: the version asyncmr acts as if the driver had.
std::atomic<int> driver_override{-1};

int testing_driver_version() noexcept
{
  int v = driver_override.load(std::memory_order_acquire);
  if (v < 0) {
    char const* text = std::getenv("ASYNCMR_TESTING_DRIVER_VERSION");
    int parsed       = text != nullptr ? std::atoi(text) : 0;
    if (parsed < 0) { parsed = 0; }
    int expected = -1;
    driver_override.compare_exchange_strong(expected, parsed, std::memory_order_acq_rel);
    v = driver_override.load(std::memory_order_acquire);
  }
  return v;
}

std::string device_name(int device) { return "device " + std::to_string(device); }

}  // namespace

namespace testing {
void set_driver_version(int version) noexcept
{
  driver_override.store(version > 0 ? version : 0, std::memory_order_release);
}
}  // namespace testing

cuda_versions versions() noexcept
{
  cuda_versions v{0, CUDART_VERSION};
  auto const status = cudaDriverGetVersion(&v.driver);
  if (status != cudaSuccess) {
    detail::clear_own_error(status);
    v.driver = 0;
  }
  if (int const fake = testing_driver_version(); fake > 0 && v.driver != 0) { v.driver = fake; }
  return v;
}

std::string version_string(int version)
{
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

char const* to_string(pool_path path) noexcept
{
  switch (path) {
    case pool_path::runtime: return "runtime";
    case pool_path::driver_entry_point: return "driver_entry_point";
    case pool_path::stand_in: return "stand_in";
  }
  return "unknown";
}

int require_cuda()
{
  auto const v = versions();
  if (v.driver == 0) {
    throw no_device_error{
      "asyncmr: no CUDA driver found (libcuda.so could not be loaded). asyncmr needs an NVIDIA "
      "GPU and its driver (" +
      std::string{CUDART_VERSION >= 13000 ? ">= 580 for this CUDA 13 build"
                                          : "any CUDA 12 or 13 driver for this CUDA 12 build"} +
      ")."};
  }
  int count      = 0;
  auto const err = cudaGetDeviceCount(&count);
  detail::clear_own_error(err);
  // CUDA's minor-version compatibility lets a 13.x runtime run on any 13.0+ driver (and a 12.x
  // runtime on any 12.0+ driver); only a driver of an older major version is too old.
  if (err == cudaErrorInsufficientDriver || v.driver / 1000 < v.runtime / 1000) {
    throw no_device_error{"asyncmr: the CUDA driver (" + version_string(v.driver) +
                          ") is older than the CUDA runtime asyncmr was built with (" +
                          version_string(v.runtime) + "); upgrade the driver (>= " +
                          std::string{v.runtime >= 13000 ? "580 for CUDA 13" : "525 for CUDA 12"} +
                          ") or install the asyncmr variant for your CUDA (asyncmr-cu12)."};
  }
  if (err != cudaSuccess || count == 0) {
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

void require_distinct_devices(std::vector<int> const& devices, char const* what)
{
  for (std::size_t i = 0; i < devices.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {  // a few devices: no set needed
      if (devices[j] == devices[i]) {
        throw std::invalid_argument{std::string{"asyncmr: "} + what + ": device " +
                                    std::to_string(devices[i]) + " is named twice"};
      }
    }
  }
}

int current_device()
{
  require_cuda();
  int device        = 0;
  auto const status = cudaGetDevice(&device);
  if (status != cudaSuccess) {
    // Said here, not through the error translator: the probe never depends on it.
    detail::clear_own_error(status);
    throw cuda_error{status, std::string{"asyncmr: cudaGetDevice failed: "} +
                               cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")"};
  }
  return device;
}

// ---- the decision ------------------------------------------------------------------------------

namespace {

support yes(pool_path path) { return support{path, {}}; }
support no(std::string reason) { return support{std::nullopt, std::move(reason)}; }

std::string build_name(platform const& p)
{
  return "this asyncmr was built with CUDA " + version_string(p.build);
}

}  // namespace

support decide_pool_support(platform const& p,
                            location const& where,
                            allocation_type type,
                            pool_source source)
{
  if (!p.device.memory_pools) {
    return no("asyncmr: this device does not support memory pools (cudaMallocAsync)");
  }
  bool const cuda13_build  = p.build >= cuda13_driver;
  bool const cuda13_driver_here = p.driver >= cuda13_driver;
  bool const host = where.is_host();
  bool const numa = where.kind == location_kind::host_numa ||
                    where.kind == location_kind::host_numa_current;

  if (type == allocation_type::managed) {
    if (!cuda13_driver_here) {
      return no("asyncmr: managed memory pools are a CUDA 13 driver feature (driver >= 580); "
                "this driver is " + version_string(p.driver));
    }
    if (!p.device.concurrent_managed_access) {
      return no("asyncmr: this device has no concurrent managed access, which managed pools "
                "need (not available on WSL2 and some platforms)");
    }
  }
  if (host) {
    if (p.driver < host_pools_driver) {
      return no("asyncmr: host memory pools need a CUDA 12.6 or newer driver; this driver is " +
                version_string(p.driver));
    }
    if (p.build < host_pools_driver) {
      return no("asyncmr: host memory pools need CUDA 12.6; " + build_name(p));
    }
    bool const supported = numa ? p.device.host_numa_memory_pools : p.device.host_memory_pools;
    if (!supported) {
      return no(std::string{"asyncmr: this device does not support "} +
                (numa ? "host NUMA" : "host") + " memory pools (driver " +
                version_string(p.driver) + "; they need a CUDA 12.6+ driver on Linux)");
    }
  }

  if (type == allocation_type::device) { return yes(pool_path::runtime); }
  // Host (pinned) and managed pools from here on.
  if (cuda13_build) { return yes(pool_path::runtime); }
  if (type == allocation_type::managed) {
    // A CUDA 12 runtime knows no managed pools; the 13.x driver's entry points do.
    return yes(pool_path::driver_entry_point);
  }
  // Pinned pools in a CUDA 12 build.
  if (source == pool_source::new_pool) { return yes(pool_path::runtime); }
  if (cuda13_driver_here) { return yes(pool_path::driver_entry_point); }
  if (source == pool_source::default_pool) { return yes(pool_path::stand_in); }
  return no("asyncmr: the current host pool (cudaMemGetMemPool) is a CUDA 13 driver feature, "
            "and this driver is " + version_string(p.driver) + " (" + build_name(p) +
            "); use pool='default' (asyncmr's process-wide host pool) or pool='new'");
}

support decide_routing_support(platform const& p, allocation_type type)
{
  if (!p.device.memory_pools) {
    return no("asyncmr: this device does not support memory pools (cudaMallocAsync)");
  }
  if (type == allocation_type::device) { return yes(pool_path::runtime); }
  if (p.build >= cuda13_driver) { return yes(pool_path::runtime); }
  if (p.driver >= cuda13_driver) { return yes(pool_path::driver_entry_point); }
  return no(std::string{"asyncmr: making a "} + to_string(type) +
            " pool current (cudaMemSetMemPool) is a CUDA 13 driver feature; this driver is " +
            version_string(p.driver) + " (" + build_name(p) + ")");
}

namespace {

// Device attributes a runtime older than the driver does not name are read by number; when
// the runtime refuses the query, the answer is "unknown", taken as supported, and the driver's
// answer to the pool call itself decides.
bool device_attribute(int attr, int device, bool unknown_means)
{
  int value         = 0;
  auto const status = cudaDeviceGetAttribute(&value, static_cast<cudaDeviceAttr>(attr), device);
  if (status != cudaSuccess) {
    detail::clear_own_error(status);
    return unknown_means;
  }
  return value != 0;
}

device_facts query_facts(int device)
{
  device_facts f;
  f.memory_pools              = device_attribute(cudaDevAttrMemoryPoolsSupported, device, false);
  f.concurrent_managed_access = device_attribute(cudaDevAttrConcurrentManagedAccess, device, false);
  f.host_numa_memory_pools    = device_attribute(142, device, true);
  f.host_memory_pools         = device_attribute(144, device, true);
  return f;
}

}  // namespace

platform current_platform(int device)
{
  require_device(device);
  static std::mutex mutex;
  static std::unordered_map<int, device_facts> facts;  // devices do not change their features
  platform p;
  p.driver = versions().driver;
  p.build  = CUDART_VERSION;
  std::lock_guard<std::mutex> lock{mutex};
  auto it = facts.find(device);
  if (it == facts.end()) { it = facts.emplace(device, query_facts(device)).first; }
  p.device = it->second;
  return p;
}

pool_path require_pool_support(location const& where,
                               allocation_type type,
                               pool_source source,
                               int device)
{
  auto const decision = decide_pool_support(current_platform(device), where, type, source);
  if (!decision) {
    std::string reason = decision.reason;
    // The decision speaks of "this device"; the user wants to know which.
    if (auto const pos = reason.find("this device"); pos != std::string::npos) {
      reason.replace(pos, 11, device_name(device));
    }
    throw unsupported_error{reason};
  }
  return *decision.path;
}

}  // namespace asyncmr

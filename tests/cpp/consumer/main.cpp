/*
 * SPDX-License-Identifier: Apache-2.0
 */

// Allocates through rmm::device_async_resource_ref from each asyncmr resource, built against the
// installed package (find_package(asyncmr)). Prints one line per resource.
// Exit status: 0 all passed, 1 a failure, 77 no CUDA device (the build is what CI checks).

#include <asyncmr/asyncmr.hpp>

#include <rmm/device_buffer.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda/stream_ref>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

namespace {

constexpr std::size_t bytes = std::size_t{1} << 20;

// A 1 MiB rmm::device_buffer through the resource's rmm::device_async_resource_ref, filled on
// `stream` and read back; true when every byte came back.
bool round_trip(rmm::device_async_resource_ref ref, bool host_accessible, cudaStream_t stream)
{
  rmm::device_buffer buf{bytes, cuda::stream_ref{stream}, ref};
  if (buf.data() == nullptr || buf.size() != bytes) { return false; }
  std::vector<unsigned char> back(bytes, 0);
  if (host_accessible) {
    // Pool pinned memory is host memory: the host writes it once the stream reached it.
    if (cudaStreamSynchronize(stream) != cudaSuccess) { return false; }
    std::memset(buf.data(), 0x5a, bytes);
    std::memcpy(back.data(), buf.data(), bytes);
  } else {
    if (cudaMemsetAsync(buf.data(), 0x5a, bytes, stream) != cudaSuccess ||
        cudaMemcpyAsync(back.data(), buf.data(), bytes, cudaMemcpyDefault, stream) !=
          cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess) {
      return false;
    }
  }
  for (auto const b : back) {
    if (b != 0x5a) { return false; }
  }
  return true;
}

// One resource: "ok", "skipped" (this driver or device cannot have it) or a failure.
template <class Resource>
bool check(char const* name, bool host_accessible, cudaStream_t stream)
{
  try {
    Resource mr{};
    bool const ok = round_trip(rmm::device_async_resource_ref{mr}, host_accessible, stream);
    std::printf("%-8s %s\n", name, ok ? "ok" : "FAILED: wrong bytes or a CUDA call failed");
    return ok;
  } catch (asyncmr::unsupported_error const& e) {
    std::printf("%-8s skipped: %s\n", name, e.what());
    return true;
  } catch (std::exception const& e) {
    std::printf("%-8s FAILED: %s\n", name, e.what());
    return false;
  }
}

}  // namespace

int main()
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device\n");
    return 77;
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    std::printf("asyncmr consumer: FAILED: cudaStreamCreateWithFlags\n");
    return 1;
  }
  bool ok = true;
  ok &= check<asyncmr::async_device_memory_resource>("device", false, stream);
  ok &= check<asyncmr::async_managed_memory_resource>("managed", false, stream);
  ok &= check<asyncmr::async_pinned_memory_resource>("pinned", true, stream);
  ok &= cudaStreamDestroy(stream) == cudaSuccess;
  std::printf("asyncmr consumer: %s\n", ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include <asyncmr/location.hpp>

#include <fstream>
#include <stdexcept>
#include <string>

#if defined(__linux__)
#include <sys/stat.h>
#endif

namespace asyncmr {

cudaMemLocation location::to_cuda() const noexcept
{
  cudaMemLocation loc{};
  switch (kind) {
    // CUDA 12 headers call the zero value "invalid"; CUDA 13 names it "none".
    case location_kind::none: loc.type = static_cast<cudaMemLocationType>(0); break;
    case location_kind::device: loc.type = cudaMemLocationTypeDevice; break;
    case location_kind::host: loc.type = cudaMemLocationTypeHost; break;
    case location_kind::host_numa: loc.type = cudaMemLocationTypeHostNuma; break;
    case location_kind::host_numa_current: loc.type = cudaMemLocationTypeHostNumaCurrent; break;
  }
  bool const has_id = kind == location_kind::device || kind == location_kind::host_numa;
  loc.id            = has_id ? id : 0;
  return loc;
}

location location::from_cuda(cudaMemLocation const& loc) noexcept
{
  switch (loc.type) {
    case cudaMemLocationTypeDevice: return device(loc.id);
    case cudaMemLocationTypeHost: return host();
    case cudaMemLocationTypeHostNuma: return host_numa(loc.id);
    case cudaMemLocationTypeHostNumaCurrent: return host_numa_current();
    default: return none();
  }
}

std::string location::to_string() const
{
  switch (kind) {
    case location_kind::none: return "none";
    case location_kind::device: return "device(" + std::to_string(id) + ")";
    case location_kind::host: return "host";
    case location_kind::host_numa: return "host_numa(" + std::to_string(id) + ")";
    case location_kind::host_numa_current: return "host_numa_current";
  }
  return "unknown";
}

char const* to_string(allocation_type type) noexcept
{
  switch (type) {
    case allocation_type::device: return "device";
    case allocation_type::pinned: return "pinned";
    case allocation_type::managed: return "managed";
  }
  return "unknown";
}

char const* to_string(pool_source source) noexcept
{
  switch (source) {
    case pool_source::default_pool: return "default";
    case pool_source::current: return "current";
    case pool_source::new_pool: return "new";
  }
  return "unknown";
}

namespace detail {

cudaMemAllocationType to_cuda(allocation_type type)
{
  switch (type) {
    case allocation_type::device:
    case allocation_type::pinned: return cudaMemAllocationTypePinned;
    // cudaMemAllocationTypeManaged (CUDA 13), spelled as the driver's value so a CUDA 12 build
    // can hand it to the 13.x driver's entry points.
    case allocation_type::managed: return static_cast<cudaMemAllocationType>(2);
  }
  throw std::invalid_argument{"asyncmr: unknown allocation type"};
}

void check_device_ordinal(int device, char const* what)
{
  if (device < 0) {
    throw std::invalid_argument{std::string{"asyncmr: "} + what + " must be in [0, 2**31), got " +
                                std::to_string(device)};
  }
}

void check_host_numa_node(int node, char const* what)
{
  if (node < 0) {
    throw std::invalid_argument{std::string{"asyncmr: "} + what +
                                ": NUMA node must be in [0, 2**31), got " +
                                std::to_string(node)};
  }
#if defined(__linux__)
  constexpr char const* nodes = "/sys/devices/system/node";
  struct stat st {};
  bool const listed = ::stat(nodes, &st) == 0;
  std::string const path = std::string{nodes} + "/node" + std::to_string(node);
  if (listed ? ::stat(path.c_str(), &st) == 0 : node == 0) { return; }
  std::string online = "0";
  if (listed) {
    std::ifstream in{std::string{nodes} + "/online"};
    if (!(in >> online)) { online = "unknown"; }
  }
  throw std::invalid_argument{std::string{"asyncmr: "} + what + ": the host has no NUMA node " +
                              std::to_string(node) + " (its nodes: " + online + ")"};
#else
  static_cast<void>(what);
#endif
}


}  // namespace detail

void validate_combination(location const& loc, allocation_type type, bool for_create)
{
  auto refuse = [&](char const* why) {
    throw std::invalid_argument{std::string{"asyncmr: "} + to_string(type) + " memory at " +
                                loc.to_string() + " is not possible: " + why};
  };
  if ((loc.kind == location_kind::device || loc.kind == location_kind::host_numa) && loc.id < 0) {
    refuse("the id must be >= 0");
  }
  switch (type) {
    case allocation_type::device:
      if (loc.kind != location_kind::device) {
        refuse("device memory lives on a device; use Location.device(i), or allocation type "
               "'pinned' for host memory");
      }
      break;
    case allocation_type::pinned:
      if (!loc.is_host()) {
        refuse("pinned memory lives on the host; use Location.host() or Location.host_numa(n), "
               "or allocation type 'device' for device memory");
      }
      break;
    case allocation_type::managed:
      if (loc.kind == location_kind::host_numa || loc.kind == location_kind::host_numa_current) {
        refuse("managed pools are located on a device, the host, or nowhere (Location.none())");
      }
      break;
  }
  if (loc.kind == location_kind::host_numa) {
    detail::check_host_numa_node(loc.id, (std::string{to_string(type)} + " memory at " +
                                  loc.to_string()).c_str());
  }
  if (for_create && loc.kind == location_kind::host_numa_current) {
    refuse("cudaMemPoolCreate does not accept host_numa_current; name the node with "
           "Location.host_numa(n)");
  }
}

}  // namespace asyncmr

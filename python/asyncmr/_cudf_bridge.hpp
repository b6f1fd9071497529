/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// cuDF's pinned memory resource, for Cython: a resource_ref has no default constructor, so
// Cython sees it boxed in an optional.

#include <asyncmr/async_pinned_memory_resource.hpp>

#include <cudf/utilities/pinned_memory.hpp>
#include <rmm/resource_ref.hpp>

#include <optional>

namespace asyncmr_py {

struct pinned_ref {
  std::optional<rmm::host_device_async_resource_ref> ref{};
};

// An asyncmr pinned resource models both host and device access, as cuDF asks.
static_assert(cuda::mr::resource_with<asyncmr::async_pinned_memory_resource,
                                      cuda::mr::host_accessible,
                                      cuda::mr::device_accessible>);

/// Installs `mr` as cuDF's pinned resource; returns the previous one.
inline pinned_ref install_pinned(asyncmr::async_pinned_memory_resource& mr)
{
  return {cudf::set_pinned_memory_resource(rmm::host_device_async_resource_ref{mr})};
}

/// Installs a resource `install_pinned` returned earlier; returns the one it replaced.
inline pinned_ref reinstall_pinned(pinned_ref const& previous)
{
  return {cudf::set_pinned_memory_resource(previous.ref.value())};
}

/// cuDF's pinned resource now.
inline pinned_ref current_pinned() { return {cudf::get_pinned_memory_resource()}; }

/// Whether `a` is `mr` (the resource_ref compares the resources it refers to).
inline bool is_resource(pinned_ref const& a, asyncmr::async_pinned_memory_resource& mr)
{
  return a.ref.has_value() && *a.ref == rmm::host_device_async_resource_ref{mr};
}

}  // namespace asyncmr_py

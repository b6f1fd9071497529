/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/// @file asyncmr.hpp
/// @brief Everything public in asyncmr.

#include <asyncmr/async_device_memory_resource.hpp>
#include <asyncmr/async_managed_memory_resource.hpp>
#include <asyncmr/async_pinned_memory_resource.hpp>
#include <asyncmr/capability.hpp>
#include <asyncmr/error.hpp>
#include <asyncmr/location.hpp>
#include <asyncmr/mem_pool.hpp>
#include <asyncmr/placement.hpp>
#include <asyncmr/pool_attributes.hpp>
#include <asyncmr/resource_options.hpp>

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Glue between Cython and the C++ API: plain-integer entry points (Cython handles C++ enum
// classes and std::optional poorly) and the one translator from C++ exceptions to Python's.

#include <Python.h>

#include <asyncmr/asyncmr.hpp>

#include <rmm/error.hpp>

#include <cstdint>
#include <new>
#include <optional>
#include <stdexcept>
#include <vector>

namespace asyncmr_py {

using namespace asyncmr;

// ---- exceptions -----------------------------------------------------------------------------
inline PyObject* no_device_type   = nullptr;
inline PyObject* unsupported_type = nullptr;
inline PyObject* closed_type      = nullptr;
inline PyObject* cuda_error_type  = nullptr;

inline void set_exception_types(PyObject* no_device,
                                PyObject* unsupported,
                                PyObject* closed,
                                PyObject* cuda_error)
{
  for (PyObject* t : {no_device, unsupported, closed, cuda_error}) { Py_INCREF(t); }
  no_device_type   = no_device;
  unsupported_type = unsupported;
  closed_type      = closed;
  cuda_error_type  = cuda_error;
}

/// Called by Cython inside `catch (...)`: sets the Python exception that fits.
inline void translate_exception()
{
  try {
    throw;
  } catch (no_device_error const& e) {
    PyErr_SetString(no_device_type, e.what());
  } catch (unsupported_error const& e) {
    PyErr_SetString(unsupported_type, e.what());
  } catch (pool_closed_error const& e) {
    PyErr_SetString(closed_type, e.what());
  } catch (asyncmr::cuda_error const& e) {
    PyErr_SetString(cuda_error_type, e.what());
  } catch (std::bad_alloc const& e) {  // rmm::out_of_memory and rmm::bad_alloc too
    PyErr_SetString(PyExc_MemoryError, e.what());
  } catch (std::invalid_argument const& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (std::out_of_range const& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (std::exception const& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "asyncmr: unknown C++ exception");
  }
}

// ---- locations and pools ----------------------------------------------------------------------
inline location make_location(int kind, int id)
{
  return location{static_cast<location_kind>(kind), id};
}

inline mem_pool* new_pool(int source, int kind, int id, int type)
{
  auto const where = make_location(kind, id);
  auto const t     = static_cast<allocation_type>(type);
  return new mem_pool(source == 0 ? mem_pool::default_pool(where, t) : mem_pool::current(where, t));
}

inline mem_pool* new_created_pool(int kind,
                                  int id,
                                  int type,
                                  std::size_t max_size,
                                  int handle_types,
                                  bool has_threshold,
                                  std::uint64_t threshold)
{
  pool_properties props{.type                = static_cast<allocation_type>(type),
                        .where               = make_location(kind, id),
                        .max_size            = max_size,
                        .export_handle_types = handle_types};
  if (has_threshold) { props.release_threshold = threshold; }
  return new mem_pool(mem_pool::create(props));
}

inline mem_pool* new_adopted_pool(
  std::uintptr_t handle, bool owned, bool has_location, int kind, int id, int type)
{
  std::optional<location> where;
  std::optional<allocation_type> t;
  if (has_location) { where = make_location(kind, id); }
  if (type >= 0) { t = static_cast<allocation_type>(type); }
  return new mem_pool(
    mem_pool::from_handle(reinterpret_cast<cudaMemPool_t>(handle), owned, where, t));
}

inline mem_pool* copy_pool(mem_pool const& pool) { return new mem_pool(pool); }

inline std::uintptr_t pool_handle(mem_pool const& pool)
{
  return reinterpret_cast<std::uintptr_t>(pool.handle());
}

// -1 when unknown.
inline int pool_location_kind(mem_pool const& pool)
{
  auto const w = pool.where();
  return w ? static_cast<int>(w->kind) : -1;
}
inline int pool_location_id(mem_pool const& pool)
{
  auto const w = pool.where();
  return w ? w->id : 0;
}
inline int pool_type(mem_pool const& pool)
{
  auto const t = pool.type();
  return t ? static_cast<int>(*t) : -1;
}
inline bool pool_created(mem_pool const& pool) { return pool.properties().has_value(); }

inline std::uint64_t get_attribute(mem_pool const& pool, int index)
{
  return pool.get_attribute(static_cast<pool_attribute>(index));
}
inline void set_attribute(mem_pool& pool, int index, std::uint64_t value)
{
  pool.set_attribute(static_cast<pool_attribute>(index), value);
}
inline void set_access(mem_pool& pool, std::vector<int> const& devices, int mode)
{
  pool.set_access(devices, static_cast<access_mode>(mode));
}
inline int get_access(mem_pool const& pool, int device)
{
  return static_cast<int>(pool.access(device));
}
inline mem_pool* make_current(mem_pool const& pool) { return new mem_pool(pool.make_current()); }

// The attribute table, row by row, for Python.
inline std::size_t attribute_count() { return attribute_table.size(); }
inline char const* attribute_name(std::size_t i) { return attribute_table[i].name.data(); }
inline int attribute_kind_of(std::size_t i) { return static_cast<int>(attribute_table[i].kind); }
inline int attribute_access_of(std::size_t i)
{
  return static_cast<int>(attribute_table[i].access);
}
inline int attribute_min_driver(std::size_t i) { return attribute_table[i].min_driver; }
inline int attribute_cuda_value(std::size_t i) { return attribute_table[i].cuda_value; }

// ---- resources ---------------------------------------------------------------------------------
inline std::optional<int> opt_int(bool has, int value)
{
  return has ? std::optional<int>{value} : std::nullopt;
}
inline std::optional<std::uint64_t> opt_u64(bool has, std::uint64_t value)
{
  return has ? std::optional<std::uint64_t>{value} : std::nullopt;
}
inline std::optional<std::vector<int>> opt_devices(bool all, std::vector<int> const& devices)
{
  return all ? std::nullopt : std::optional<std::vector<int>>{devices};
}

inline async_managed_memory_resource* new_managed(mem_pool const* adopt,
                                                  bool has_device,
                                                  int device,
                                                  int source,
                                                  bool has_location,
                                                  int kind,
                                                  int id,
                                                  bool has_threshold,
                                                  std::uint64_t threshold,
                                                  bool all_devices,
                                                  std::vector<int> const& devices)
{
  managed_resource_options o{.device            = opt_int(has_device, device),
                             .source            = static_cast<pool_source>(source),
                             .release_threshold = opt_u64(has_threshold, threshold),
                             .accessible_from   = opt_devices(all_devices, devices)};
  if (has_location) { o.where = make_location(kind, id); }
  return adopt != nullptr ? new async_managed_memory_resource(*adopt, o)
                          : new async_managed_memory_resource(o);
}

inline async_pinned_memory_resource* new_pinned(mem_pool const* adopt,
                                                int source,
                                                bool has_numa,
                                                int numa_node,
                                                bool has_threshold,
                                                std::uint64_t threshold,
                                                bool all_devices,
                                                std::vector<int> const& devices)
{
  pinned_resource_options o{.source            = static_cast<pool_source>(source),
                            .numa_node         = opt_int(has_numa, numa_node),
                            .release_threshold = opt_u64(has_threshold, threshold),
                            .accessible_from   = opt_devices(all_devices, devices)};
  return adopt != nullptr ? new async_pinned_memory_resource(*adopt, o)
                          : new async_pinned_memory_resource(o);
}

inline async_device_memory_resource* new_device(mem_pool const* adopt,
                                                bool has_device,
                                                int device,
                                                int source,
                                                bool has_threshold,
                                                std::uint64_t threshold)
{
  device_resource_options o{.device            = opt_int(has_device, device),
                            .source            = static_cast<pool_source>(source),
                            .release_threshold = opt_u64(has_threshold, threshold)};
  return adopt != nullptr ? new async_device_memory_resource(*adopt, o)
                          : new async_device_memory_resource(o);
}

inline int driver_version() { return versions().driver; }
inline int runtime_version() { return versions().runtime; }

}  // namespace asyncmr_py

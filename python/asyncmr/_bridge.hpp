/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Glue between Cython and the C++ API, for what Cython cannot say itself: the one translator
// from C++ exceptions to Python's, the construction of any resource from its options (one
// template for the three resources), and calls that take a stream as an integer.

#include <Python.h>

#include <asyncmr/asyncmr.hpp>

#include <rmm/error.hpp>

#include <cuda/stream>

#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>

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

// ---- resources --------------------------------------------------------------------------------

/// Builds resource `R` from its options, on `adopt` when given (one path for the three).
template <class R, class Options>
std::shared_ptr<R> make_resource(mem_pool const* adopt, Options const& options)
{
  return adopt != nullptr ? std::make_shared<R>(*adopt, options) : std::make_shared<R>(options);
}

inline cudaStream_t as_stream(std::uintptr_t stream) noexcept
{
  return reinterpret_cast<cudaStream_t>(stream);
}

inline std::uintptr_t allocate(detail::pool_resource_base& mr, std::uintptr_t stream, std::size_t bytes)
{
  return reinterpret_cast<std::uintptr_t>(
    mr.allocate(cuda::stream_ref{as_stream(stream)}, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT));
}

/// The status of the free, for Python to raise on (C++'s deallocate only logs it).
inline cudaError_t deallocate(detail::pool_resource_base& mr,
                              std::uintptr_t stream,
                              std::uintptr_t ptr,
                              std::size_t bytes) noexcept
{
  return mr.deallocate_checked(cuda::stream_ref{as_stream(stream)}, reinterpret_cast<void*>(ptr),
                               bytes);
}

// ---- pools ------------------------------------------------------------------------------------

inline std::uintptr_t handle_of(mem_pool const& pool)
{
  return reinterpret_cast<std::uintptr_t>(pool.handle());
}

inline mem_pool adopt_handle(std::uintptr_t handle,
                             bool owned,
                             std::optional<location> where,
                             std::optional<allocation_type> type)
{
  return mem_pool::from_handle(reinterpret_cast<cudaMemPool_t>(handle), owned, where, type);
}

/// The attribute in row `index` of the table (table order is the enum's order).
inline std::uint64_t get_attribute(mem_pool const& pool, std::size_t index)
{
  return pool.get_attribute(static_cast<pool_attribute>(index));
}
inline void set_attribute(mem_pool const& pool, std::size_t index, std::uint64_t value)
{
  pool.set_attribute(static_cast<pool_attribute>(index), value);
}

// The attribute table, row by row (its names are null-terminated string literals).
inline std::size_t attribute_count() noexcept { return attribute_table.size(); }
inline attribute_info const& attribute_row(std::size_t i) { return attribute_table.at(i); }
inline char const* attribute_name(std::size_t i) { return attribute_table.at(i).name.data(); }

/// The location kind a driver `cudaMemLocationType` value names.
inline location_kind kind_from_cuda(int value)
{
  cudaMemLocation loc{};
  loc.type = static_cast<cudaMemLocationType>(value);
  return location::from_cuda(loc).kind;
}

inline char const* error_name(cudaError_t e) noexcept { return cudaGetErrorName(e); }
inline char const* error_text(cudaError_t e) noexcept { return cudaGetErrorString(e); }

}  // namespace asyncmr_py

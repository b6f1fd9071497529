/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Glue between Cython and the C++ API, for what Cython cannot say itself: the one translator
// from C++ exceptions to Python's, the construction of any resource from its options (one
// template for the three resources), and calls that take a stream as an integer.

#include <Python.h>

#include <asyncmr/asyncmr.hpp>
#include <asyncmr/detail/blocking.hpp>

#include <rmm/error.hpp>

#include <cuda/stream>

#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <span>
#include <string>
#include <thread>
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

// ---- placement (asyncmr/placement.hpp), from a vector of ranges and a raw stream ---------------

inline void prefetch_ranges(std::vector<memory_range> const& r, location to, std::uintptr_t s)
{
  asyncmr::prefetch(std::span<memory_range const>{r.data(), r.size()}, to,
                    cuda::stream_ref{as_stream(s)});
}

inline void discard_ranges(std::vector<memory_range> const& r, std::uintptr_t s)
{
  asyncmr::discard(std::span<memory_range const>{r.data(), r.size()}, cuda::stream_ref{as_stream(s)});
}

inline void discard_and_prefetch_ranges(std::vector<memory_range> const& r, location to,
                                        std::uintptr_t s)
{
  asyncmr::discard_and_prefetch(std::span<memory_range const>{r.data(), r.size()}, to,
                                cuda::stream_ref{as_stream(s)});
}

// `advice`: the index of an asyncmr::memory_advice (checked there).
inline void advise_ranges(std::vector<memory_range> const& r, int advice, location to)
{
  asyncmr::advise(std::span<memory_range const>{r.data(), r.size()},
                  static_cast<asyncmr::memory_advice>(advice), to);
}

inline std::uintptr_t allocate(pool_resource& mr, std::uintptr_t stream, std::size_t bytes)
{
  return reinterpret_cast<std::uintptr_t>(
    mr.allocate(cuda::stream_ref{as_stream(stream)}, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT));
}

/// What the free did, for Python to raise on (C++'s deallocate only logs it).
inline free_result deallocate(pool_resource& mr,
                                      std::uintptr_t stream,
                                      std::uintptr_t ptr,
                                      std::size_t bytes) noexcept
{
  return mr.deallocate_checked(cuda::stream_ref{as_stream(stream)}, reinterpret_cast<void*>(ptr),
                               bytes);
}

/// The message of a free that was not made (see `free_status`).
inline std::string free_failure(free_result const& result, std::uintptr_t ptr, std::size_t bytes)
{
  return describe_free_failure(result, reinterpret_cast<void const*>(ptr), bytes);
}

// ---- waits on the device release the GIL ----------------------------------------------------

// True once the interpreter has begun to finalize.
inline bool interpreter_finalizing() noexcept
{
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// A thread that let the GIL go for a wait and finds the interpreter finalizing when the wait
// ends never takes it back: PyEval_RestoreThread would end the thread by unwinding its stack
// (CPython 3.13 and older), and the unwind stops in asyncmr's and RMM's noexcept frames with
// std::terminate. The thread sleeps until the process exits instead, as CPython 3.14 parks
// such threads itself. Only a daemon thread can get here: the others are joined before
// finalization begins.
[[noreturn]] inline void park_until_exit() noexcept
{
  for (;;) { std::this_thread::sleep_for(std::chrono::hours{1}); }
}

// Every asyncmr wait on the device (detail/blocking.hpp) releases the GIL if the waiting thread
// holds it, so that a Python host function queued on a stream can run: called from Python,
// from RMM's C++ (a DeviceBuffer's destructor) or a resource's destructor alike. Not during
// interpreter shutdown, when another thread could not take the GIL anyway.
inline void* release_gil() noexcept
{
#if PY_VERSION_HEX >= 0x030D0000
  PyThreadState* const holder = PyThreadState_GetUnchecked();
#else
  PyThreadState* const holder = _PyThreadState_UncheckedGet();
#endif
  // In a build with the GIL, a thread has a current thread state exactly while it holds it.
  if (holder == nullptr || interpreter_finalizing()) { return nullptr; }
  return PyEval_SaveThread();
}

inline void take_gil_back(void* token) noexcept
{
  if (token == nullptr) { return; }
  if (interpreter_finalizing()) { park_until_exit(); }
  PyEval_RestoreThread(static_cast<PyThreadState*>(token));
}

inline void install_blocking_hooks() noexcept
{
  detail::set_blocking_hooks({&release_gil, &take_gil_back});
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

/// The attribute in row `index` of the table (table order is the enum's order); an index
/// outside the table is refused (std::out_of_range, a ValueError in Python).
inline pool_attribute attribute_at(std::size_t index)
{
  if (index >= attribute_table.size()) {
    throw std::out_of_range{"asyncmr: pool attribute index " + std::to_string(index) +
                            " is outside the table (" + std::to_string(attribute_table.size()) +
                            " attributes)"};
  }
  return static_cast<pool_attribute>(index);
}
inline std::uint64_t get_attribute(mem_pool const& pool, std::size_t index)
{
  return pool.get_attribute(attribute_at(index));
}
inline void set_attribute(mem_pool const& pool, std::size_t index, std::uint64_t value)
{
  pool.set_attribute(attribute_at(index), value);
}

// ---- imported allocations ---------------------------------------------------------------------

inline std::unique_ptr<imported_allocation> import_pointer(mem_pool const& pool,
                                                           exported_pointer const& data)
{
  return std::make_unique<imported_allocation>(pool.import_pointer(data));
}

inline void release_import(imported_allocation& imported, std::uintptr_t stream)
{
  imported.release(as_stream(stream));
}

inline void release_import_on_own_stream(imported_allocation& imported) { imported.release(); }

inline std::uintptr_t import_address(imported_allocation const& imported) noexcept
{
  return reinterpret_cast<std::uintptr_t>(imported.get());
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

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// What the interpreter needs around every call into libasyncmr.so: the one translator from C++
// exceptions to Python's, and the hooks that let the GIL go while asyncmr waits on the device.
//
// Only asyncmr._core.runtime includes this header. Extensions are built with hidden
// visibility, so every extension that compiled it would hold exception-type globals of its own,
// set only in the module that set them (a translation anywhere else would raise with a null
// type), and copies of its own of the hooks. So one module holds the types and installs the
// hooks, once per process, when it is imported; every other module reaches the translator through
// that module's C API (runtime.pxd's `translate_exception`, cimported).

#include <Python.h>

#include <asyncmr/error.hpp>
#include <asyncmr/detail/blocking.hpp>

#include <chrono>
#include <new>
#include <stdexcept>
#include <thread>

namespace asyncmr_py {

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

/// Called inside `catch (...)`: sets the Python exception that fits the one being handled.
inline void translate_current_exception() noexcept
{
  try {
    throw;
  } catch (asyncmr::no_device_error const& e) {
    PyErr_SetString(no_device_type, e.what());
  } catch (asyncmr::unsupported_error const& e) {
    PyErr_SetString(unsupported_type, e.what());
  } catch (asyncmr::pool_closed_error const& e) {
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
  asyncmr::detail::set_blocking_hooks({&release_gil, &take_gil_back});
}

}  // namespace asyncmr_py

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// The translator from C++ exceptions to Python's, named by every call that can throw
// (`except +translate_exception`). Each extension module compiles its own copy, and must: the
// rethrow that finds the exception being handled reads the C++ runtime's record of it, and a
// module built with libstdc++ linked statically has a record of its own, so a translator in
// another module finds none (std::terminate). The Python exception types are looked up in
// asyncmr._exceptions when an exception is translated, so no module holds state another sets.

#include <Python.h>

#include <asyncmr/error.hpp>

#include <new>
#include <stdexcept>

namespace asyncmr_py {

// Sets asyncmr._exceptions.<name>(message); RuntimeError if that type cannot be had.
inline void set_asyncmr_error(char const* name, char const* message) noexcept
{
  PyObject* const module = PyImport_ImportModule("asyncmr._exceptions");
  PyObject* const type   = module != nullptr ? PyObject_GetAttrString(module, name) : nullptr;
  Py_XDECREF(module);
  if (type == nullptr) {
    PyErr_Clear();
    PyErr_SetString(PyExc_RuntimeError, message);
    return;
  }
  PyErr_SetString(type, message);
  Py_DECREF(type);
}

/// Called inside `catch (...)`: sets the Python exception that fits the one being handled.
inline void translate_exception() noexcept
{
  try {
    throw;
  } catch (asyncmr::no_device_error const& e) {
    set_asyncmr_error("NoDeviceError", e.what());
  } catch (asyncmr::unsupported_error const& e) {
    set_asyncmr_error("UnsupportedError", e.what());
  } catch (asyncmr::pool_closed_error const& e) {
    set_asyncmr_error("PoolClosedError", e.what());
  } catch (asyncmr::cuda_error const& e) {
    set_asyncmr_error("CUDAError", e.what());
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

}  // namespace asyncmr_py

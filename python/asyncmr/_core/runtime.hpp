/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// The hooks that let the GIL go while asyncmr waits on the device, installed into libasyncmr.so
// once per process by asyncmr._core.runtime, which asyncmr._core imports first. Only that module
// includes this header (the exception translator, which every module compiles, is
// translate.hpp).

#include <Python.h>

#include <asyncmr/detail/blocking.hpp>

#include <chrono>
#include <thread>

namespace asyncmr_py {

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

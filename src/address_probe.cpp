/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "detail/pool_state.hpp"

#if defined(__linux__)
#include <fcntl.h>
#include <unistd.h>
#endif

#include <cerrno>
#include <cstddef>

namespace asyncmr::detail {

// The kernel copies the first bytes at `address` into a pipe and answers EFAULT if nothing is
// mapped there, so the probe never touches the address itself. An integer that is not a pool
// (0x1000, a stale number) would otherwise crash the process at the driver's first read; a
// mapped address that is not a pool cannot be told apart.
bool address_is_mapped(void const* address) noexcept
{
#if defined(__linux__)
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) { return true; }  // cannot check: trust it
  constexpr std::size_t probe = 64;
  ssize_t written             = -1;
  do {
    written = write(fds[1], address, probe);
  } while (written < 0 && errno == EINTR);
  int const error = written < 0 ? errno : 0;
  close(fds[0]);
  close(fds[1]);
  return error != EFAULT;
#else
  static_cast<void>(address);
  return true;
#endif
}

}  // namespace asyncmr::detail

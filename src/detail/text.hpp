/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Private to src/: how messages write a number of bytes.

#include <cstddef>
#include <cstdio>
#include <string>

namespace asyncmr::detail {

/// "12 B", "4.0 KiB", "64.0 MiB": the largest unit the value reaches, one decimal.
inline std::string human_bytes(std::size_t bytes)
{
  char text[32];
  if (bytes >= (std::size_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  } else if (bytes >= 1024) {
    std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(bytes) / 1024);
  } else {
    std::snprintf(text, sizeof text, "%zu B", bytes);
  }
  return text;
}

}  // namespace asyncmr::detail

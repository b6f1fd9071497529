/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// What the C++ benchmark programs (pool_floor, cache_bench) share: medians and percentiles of
// per-round values, JSON string escaping, and the text of a failed CUDA call.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace asyncmr_bench {

/// The median and the 10th and 90th percentiles of a set of rounds.
struct summary {
  double median;
  double p10;
  double p90;
};

/// `s` as the inside of a JSON string.
inline std::string json_escape(std::string const& s)
{
  std::string out;
  out.reserve(s.size() + 2);
  for (char const c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

/// The `q` quantile (0..1) of `v`, linearly interpolated.
inline double percentile(std::vector<double> v, double q)
{
  std::sort(v.begin(), v.end());
  double const pos = q * static_cast<double>(v.size() - 1);
  auto const lo    = static_cast<std::size_t>(pos);
  auto const hi    = std::min(lo + 1, v.size() - 1);
  double const f   = pos - static_cast<double>(lo);
  return v[lo] * (1.0 - f) + v[hi] * f;
}

inline summary summarize(std::vector<double> const& v)
{
  return {percentile(v, 0.5), percentile(v, 0.1), percentile(v, 0.9)};
}

/// "call failed: cudaErrorX (text)", with the runtime's last error cleared.
inline std::string cuda_failure(char const* call, cudaError_t e)
{
  cudaGetLastError();
  return std::string{call} + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
         ")";
}

}  // namespace asyncmr_bench

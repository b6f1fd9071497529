/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// What the C++ benchmark programs (pool_floor, cache_bench, block_cache_bench) share: medians and
// percentiles of per-round values, option values and the --sizes list, JSON string escaping, and how a program
// reports a failure (a failed CUDA call's text, the one-line JSON error document).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
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

inline double median(std::vector<double> v) { return percentile(std::move(v), 0.5); }

inline summary summarize(std::vector<double> const& v)
{
  return {percentile(v, 0.5), percentile(v, 0.1), percentile(v, 0.9)};
}

/// `text` as a decimal number in [1, max]. False, and `out` untouched, for anything else (empty,
/// a sign, other characters, a number out of range).
template <class T>
bool parse_positive(char const* text, T& out,
                    unsigned long long max = std::numeric_limits<T>::max())
{
  std::string const s{text};
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) { return false; }
  errno        = 0;
  auto const v = std::strtoull(s.c_str(), nullptr, 10);
  if (errno == ERANGE || v == 0 || v > max) { return false; }
  out = static_cast<T>(v);
  return true;
}

/// The value of the option at argv[i], the next argument (`i` is advanced past it), parsed as
/// `parse_positive` does; false when it is missing or not such a number.
template <class T>
bool option_value(int argc, char** argv, int& i, T& out)
{
  return i + 1 < argc && parse_positive(argv[++i], out);
}

/// Parses a --sizes list, "a,b,c": each a decimal byte count in [1, max_bytes]. False, and
/// `out` untouched, for anything else (an empty list or item, a sign, other characters, a
/// number out of range).
inline bool parse_sizes(char const* list, std::size_t max_bytes, std::vector<std::size_t>& out)
{
  std::vector<std::size_t> sizes;
  std::stringstream ss{list};
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t v = 0;
    if (!parse_positive(item.c_str(), v, max_bytes)) { return false; }
    sizes.push_back(v);
  }
  if (sizes.empty()) { return false; }
  out = std::move(sizes);
  return true;
}

/// "call failed: cudaErrorX (text)", with the runtime's last error cleared.
inline std::string cuda_failure(char const* call, cudaError_t e)
{
  cudaGetLastError();
  return std::string{call} + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
         ")";
}

/// A program's failure: `{"error": what}` as its one JSON document on stdout (what the Python
/// benchmark reads) and "program: what" on stderr. Returns the exit status, 1.
inline int report_failure(char const* program, std::string const& what)
{
  std::printf("{\"error\":\"%s\"}\n", json_escape(what).c_str());
  std::fprintf(stderr, "%s: %s\n", program, what.c_str());
  return 1;
}

}  // namespace asyncmr_bench

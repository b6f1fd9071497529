/*
 * SPDX-License-Identifier: Apache-2.0
 */

/**
 * @file pool_floor.cpp
 * @brief The raw floor of stream-ordered pool allocation, as one JSON object on stdout.
 *
 * For each pool asyncmr's resources use (the default managed pool of device 0, the default
 * pinned host pool, the device's default pool, and an owned pool of each kind) it times
 * alloc+free pairs on one non-blocking stream two ways, interleaved round by round so drift
 * hits both equally:
 *   - "floor":   cudaMallocFromPoolAsync + cudaFreeAsync on the pool handle, nothing else;
 *   - "via_ref": the same through rmm::device_async_resource_ref over the asyncmr resource,
 *                which is what RMM (and every RMM user) calls.
 * Output: {"meta":{...}, "params":{...}, "resources":{pool:resource},
 *          "floor":{pool:{bytes:{"median_us","p10_us","p90_us"}}}, "via_ref":{...},
 *          "via_ref_over_floor":{pool:{bytes:{"median","p10","p90"}}} (ratio of each round
 *          to the floor round next to it),
 *          "errors":{pool:message}}; sizes are keys in bytes ("256", "4096", ...).
 *
 * Usage: pool_floor [--quick] [--pairs N] [--rounds R] [--warmup W] [--sizes a,b,c]
 * Exit status: 0 when it measured, 1 without a usable CUDA device (stdout still holds one
 * JSON object, {"error": ...}), 2 on bad arguments.
 */

#include "bench_support.hpp"
#include "raw_pool_pairs.hpp"

#include <asyncmr/asyncmr.hpp>

#include <rmm/aligned.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda/stream>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

struct params {
  int pairs{2000};   // alloc+free pairs per timed round
  int rounds{41};    // timed rounds per (pool, size, way)
  int warmup{500};   // untimed pairs before the rounds
  std::vector<std::size_t> sizes{256, 4096, 1U << 20, 64U << 20};
};

/// One pool and the asyncmr resource over it.
struct subject {
  std::string key;       // e.g. "managed_default_dev0"
  std::string resource;  // e.g. "AsyncManagedMR"
  cudaMemPool_t pool{};
  std::optional<rmm::device_async_resource_ref> ref{};
  std::string error{};
};

using asyncmr_bench::cuda_failure;
using asyncmr_bench::json_escape;
using asyncmr_bench::option_value;
using asyncmr_bench::parse_sizes;
using asyncmr_bench::report_failure;
using asyncmr_bench::summarize;
using asyncmr_bench::summary;

/// Microseconds per pair of cudaMallocFromPoolAsync + cudaFreeAsync; throws on a CUDA error.
double floor_round(cudaMemPool_t pool, std::size_t bytes, cudaStream_t stream, int pairs)
{
  auto const r = asyncmr_bench::raw_pool_pairs(pool, stream, bytes, pairs);
  if (r.error != cudaSuccess) { throw std::runtime_error{cuda_failure(r.failed_call, r.error)}; }
  return static_cast<double>(r.elapsed_ns) / 1e3 / pairs;
}

/// The same through RMM's type-erased reference (virtual dispatch into the asyncmr resource).
double ref_round(rmm::device_async_resource_ref ref,
                 std::size_t bytes,
                 cudaStream_t stream,
                 int pairs)
{
  cuda::stream_ref const s{stream};
  auto const t0 = clock_type::now();
  for (int i = 0; i < pairs; ++i) {
    void* p = ref.allocate(s, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    ref.deallocate(s, p, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
  }
  auto const t1 = clock_type::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / pairs;
}

void sync(cudaStream_t stream)
{
  cudaError_t const e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) { throw std::runtime_error{cuda_failure("cudaStreamSynchronize", e)}; }
}

template <class Resource, class Options>
void add_subject(std::vector<subject>& out,
                 std::vector<std::shared_ptr<void>>& keep_alive,
                 std::string key,
                 std::string resource,
                 Options const& options)
{
  subject s{std::move(key), std::move(resource)};
  try {
    auto r = std::make_shared<Resource>(options);
    s.pool = r->pool_handle();
    s.ref.emplace(*r);
    keep_alive.push_back(std::move(r));
  } catch (std::exception const& e) {
    s.error = e.what();
  }
  out.push_back(std::move(s));
}

bool parse_args(int argc, char** argv, params& p)
{
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--quick") {
      p.pairs  = 1000;
      p.rounds = 15;
      p.warmup = 200;
    } else if (a == "--pairs") {
      if (!option_value(argc, argv, i, p.pairs)) { return false; }
    } else if (a == "--rounds") {
      if (!option_value(argc, argv, i, p.rounds)) { return false; }
    } else if (a == "--warmup") {
      if (!option_value(argc, argv, i, p.warmup)) { return false; }
    } else if (a == "--sizes") {
      if (i + 1 >= argc || !parse_sizes(argv[++i], SIZE_MAX, p.sizes)) { return false; }
    } else {
      return false;
    }
  }
  return true;
}

using table = std::map<std::string, std::map<std::size_t, summary>>;

/// Everything the program prints.
struct report {
  std::string gpu;
  asyncmr::cuda_versions versions{};
  params p;
  std::vector<subject> const* subjects{};
  table floor;
  table via_ref;
  table paired;  // via_ref / floor per round (the two alternate), unitless
  std::map<std::string, std::string> errors;
};

/// `unit` suffixes the field names: "_us" for times, "" for ratios.
void write_table(std::ostream& os,
                 std::vector<subject> const& subjects,
                 table const& t,
                 char const* unit = "_us")
{
  os << "{";
  bool first_pool = true;
  for (auto const& s : subjects) {
    auto const it = t.find(s.key);
    if (it == t.end()) { continue; }
    os << (first_pool ? "" : ",") << "\"" << s.key << "\":{";
    first_pool      = false;
    bool first_size = true;
    for (auto const& [bytes, v] : it->second) {
      os << (first_size ? "" : ",") << "\"" << bytes << "\":{\"median" << unit
         << "\":" << v.median << ",\"p10" << unit << "\":" << v.p10 << ",\"p90" << unit
         << "\":" << v.p90 << "}";
      first_size = false;
    }
    os << "}";
  }
  os << "}";
}

std::string to_json(report const& r)
{
  std::ostringstream os;
  os.precision(6);
  os << "{\"meta\":{\"gpu\":\"" << json_escape(r.gpu) << "\",\"driver\":" << r.versions.driver
     << ",\"runtime\":" << r.versions.runtime << ",\"clock\":\"steady_clock\""
     << ",\"optimized\":" << (asyncmr_bench::built_optimized ? "true" : "false") << "}";
  os << ",\"params\":{\"pairs\":" << r.p.pairs << ",\"rounds\":" << r.p.rounds
     << ",\"warmup\":" << r.p.warmup << ",\"stream\":\"one non-blocking stream\"}";
  os << ",\"resources\":{";
  auto const& subjects = *r.subjects;
  for (std::size_t i = 0; i < subjects.size(); ++i) {
    os << (i ? "," : "") << "\"" << subjects[i].key << "\":\"" << json_escape(subjects[i].resource)
       << "\"";
  }
  os << "},\"floor\":";
  write_table(os, subjects, r.floor);
  os << ",\"via_ref\":";
  write_table(os, subjects, r.via_ref);
  os << ",\"via_ref_over_floor\":";
  write_table(os, subjects, r.paired, "");
  os << ",\"errors\":{";
  bool first = true;
  for (auto const& [k, v] : r.errors) {
    os << (first ? "" : ",") << "\"" << json_escape(k) << "\":\"" << json_escape(v) << "\"";
    first = false;
  }
  os << "}}";
  return os.str();
}

}  // namespace

int main(int argc, char** argv)
{
  params p;
  if (!parse_args(argc, argv, p)) {
    std::fprintf(stderr,
                 "usage: pool_floor [--quick] [--pairs N] [--rounds R] [--warmup W] "
                 "[--sizes BYTES,BYTES,...]\n");
    return 2;
  }

  try {
    asyncmr::require_cuda();
  } catch (std::exception const& e) {
    return report_failure("pool_floor", e.what());
  }

  cudaSetDevice(0);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);

  cudaStream_t stream{};
  if (auto const e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return report_failure("pool_floor", cuda_failure("cudaStreamCreateWithFlags", e));
  }

  using namespace asyncmr;
  std::vector<subject> subjects;
  std::vector<std::shared_ptr<void>> keep_alive;
  add_subject<async_managed_memory_resource>(
    subjects, keep_alive, "managed_default_dev0", "AsyncManagedMR", managed_resource_options{});
  add_subject<async_pinned_memory_resource>(
    subjects, keep_alive, "pinned_default_host", "AsyncPinnedMR", pinned_resource_options{});
  add_subject<async_device_memory_resource>(
    subjects, keep_alive, "device_default_dev0", "AsyncDeviceMR", device_resource_options{});
  add_subject<async_managed_memory_resource>(subjects,
                                             keep_alive,
                                             "managed_owned_dev0",
                                             "AsyncManagedMR(pool='new')",
                                             managed_resource_options{.source = pool_source::new_pool});
  add_subject<async_pinned_memory_resource>(subjects,
                                            keep_alive,
                                            "pinned_owned_host",
                                            "AsyncPinnedMR(pool='new')",
                                            pinned_resource_options{.source = pool_source::new_pool});
  add_subject<async_device_memory_resource>(subjects,
                                            keep_alive,
                                            "device_owned_dev0",
                                            "AsyncDeviceMR(pool='new')",
                                            device_resource_options{.source = pool_source::new_pool});

  report out;
  out.gpu      = prop.name;
  out.versions = asyncmr::versions();
  out.p        = p;
  out.subjects = &subjects;

  for (auto& s : subjects) {
    if (!s.error.empty()) {
      out.errors[s.key] = s.error;
      continue;
    }
    for (std::size_t const bytes : p.sizes) {
      try {
        // Warm-up maps the pool's memory and the code paths; then interleaved rounds.
        floor_round(s.pool, bytes, stream, p.warmup);
        ref_round(*s.ref, bytes, stream, p.warmup);
        sync(stream);
        std::vector<double> floor_us;
        std::vector<double> ref_us;
        for (int r = 0; r < p.rounds; ++r) {
          if (r % 2 == 0) {
            floor_us.push_back(floor_round(s.pool, bytes, stream, p.pairs));
            sync(stream);
            ref_us.push_back(ref_round(*s.ref, bytes, stream, p.pairs));
          } else {
            ref_us.push_back(ref_round(*s.ref, bytes, stream, p.pairs));
            sync(stream);
            floor_us.push_back(floor_round(s.pool, bytes, stream, p.pairs));
          }
          sync(stream);
        }
        std::vector<double> ratio(floor_us.size());
        for (std::size_t i = 0; i < ratio.size(); ++i) { ratio[i] = ref_us[i] / floor_us[i]; }
        out.floor[s.key][bytes]   = summarize(floor_us);
        out.via_ref[s.key][bytes] = summarize(ref_us);
        out.paired[s.key][bytes]  = summarize(ratio);
      } catch (std::exception const& e) {
        out.errors[s.key + "@" + std::to_string(bytes)] = e.what();
        cudaGetLastError();
      }
    }
  }

  std::puts(to_json(out).c_str());

  keep_alive.clear();  // resources (and owned pools) go before the stream
  cudaStreamDestroy(stream);
  return 0;
}

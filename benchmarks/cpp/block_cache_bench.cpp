/*
 * SPDX-License-Identifier: Apache-2.0
 */

/**
 * @file block_cache_bench.cpp
 * @brief CPU cost of the front cache's hit path (detail/block_cache.hpp), as one JSON object.
 *
 * No GPU: blocks are fake pointers, so this times exactly what the cache adds to a hit
 * (take + put of a cached block), not the driver.
 *   - "single": ns per hit pair on one thread, per size.
 *   - "threads": T threads, each on its own stream key ("own_streams"), and all on one key
 *     ("shared_stream", the legacy null stream case), against one thread timed the same way
 *     in the same round; "scaling" = aggregate pairs/s over the one-thread pairs/s.
 *   - meta.control_scaling: the same ratio for pure arithmetic, the ceiling on this machine now
 *     (a busy or shared host shows here, not as a fault of the cache).
 * Targets (for the cache's share of a pair): single-thread hit pair < 150 ns, and
 * own_streams scaling >= 4 with 8 threads on a machine with >= 8 cores ("scaling_met" is null
 * when the machine has fewer cores than threads: the number then says nothing about the cache).
 *
 * Usage: block_cache_bench [--quick] [--pairs N] [--rounds R] [--threads T] [--sizes a,b,c]
 * Exit status: 0 when it measured, 2 on bad arguments.
 */

#include "bench_support.hpp"

#include <asyncmr/detail/block_cache.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using asyncmr::detail::block_cache;
using asyncmr::detail::stream_key;
using asyncmr_bench::median;
using asyncmr_bench::option_value;
using asyncmr_bench::parse_sizes;
using clock_type = std::chrono::steady_clock;

#ifdef __OPTIMIZE__
constexpr bool built_optimized = true;
#else
constexpr bool built_optimized = false;
#endif

struct params {
  long pairs{2'000'000};  // hit pairs per thread per timed round
  int rounds{9};
  int threads{8};
  std::vector<std::size_t> sizes{256, 4096, 65536};
};

/// Runs `pairs` take+put hits of `bytes` on `key`; returns the number that missed (must be 0).
long hit_pairs(block_cache& cache, stream_key key, std::size_t bytes, long pairs)
{
  long missed = 0;
  for (long i = 0; i < pairs; ++i) {
    void* const p = cache.take(key, bytes);
    if (p == nullptr || cache.put(key, p, bytes).status != asyncmr::detail::put_status::cached) { ++missed; }
  }
  return missed;
}

/// Puts one block per thread key so every take that follows hits (a fake 256-byte-aligned
/// address the cache records as handed out; it is never dereferenced).
void prime(block_cache& cache, std::size_t index, stream_key key, std::size_t bytes)
{
  void* const block =
    reinterpret_cast<void*>(std::uintptr_t{0x100000000} + std::uintptr_t{index} * 1048576);
  if (!cache.record(block, bytes) || cache.put(key, block, bytes).status != asyncmr::detail::put_status::cached) {
    std::fprintf(stderr, "block_cache_bench: priming put refused\n");
    std::exit(1);
  }
}

/// Aggregate pairs per second of `threads` threads on `keys[t]`, all released at once.
double aggregate_rate(block_cache& cache,
                      std::vector<stream_key> const& keys,
                      std::size_t bytes,
                      long pairs,
                      long& missed)
{
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::atomic<long> misses{0};
  std::vector<std::thread> pool;
  int const n = static_cast<int>(keys.size());
  for (int t = 0; t < n; ++t) {
    pool.emplace_back([&, t] {
      hit_pairs(cache, keys[t], bytes, 1000);  // warm the thread-local entry and the lines
      ++ready;
      while (!go.load(std::memory_order_acquire)) { std::this_thread::yield(); }
      misses += hit_pairs(cache, keys[t], bytes, pairs);
    });
  }
  while (ready.load() < n) { std::this_thread::yield(); }
  auto const t0 = clock_type::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) { th.join(); }
  double const s = std::chrono::duration<double>(clock_type::now() - t0).count();
  missed += misses.load();
  return static_cast<double>(pairs) * n / s;
}

/// Scaling of pure arithmetic on `threads` threads: the most any code can scale on this machine
/// now. A shared or busy machine shows here, so a low cache scaling can be told apart from it.
double control_scaling(int threads)
{
  auto const rate = [](int n) {
    std::vector<std::thread> pool;
    std::atomic<std::uint64_t> sink{0};
    constexpr std::uint64_t steps = 50'000'000;
    auto const t0                 = clock_type::now();
    for (int t = 0; t < n; ++t) {
      pool.emplace_back([&, t] {
        std::uint64_t x = static_cast<std::uint64_t>(t);
        for (std::uint64_t i = 0; i < steps; ++i) { x = x * 6364136223846793005ULL + i; }
        sink += x;
      });
    }
    for (auto& th : pool) { th.join(); }
    return static_cast<double>(steps) * n /
           std::chrono::duration<double>(clock_type::now() - t0).count();
  };
  return rate(threads) / rate(1);
}

bool parse_args(int argc, char** argv, params& p)
{
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--quick") {
      p.pairs  = 300'000;
      p.rounds = 5;
    } else if (a == "--pairs") {
      if (!option_value(argc, argv, i, p.pairs)) { return false; }
    } else if (a == "--rounds") {
      if (!option_value(argc, argv, i, p.rounds)) { return false; }
    } else if (a == "--threads") {
      if (!option_value(argc, argv, i, p.threads)) { return false; }
    } else if (a == "--sizes") {
      if (i + 1 >= argc || !parse_sizes(argv[++i], SIZE_MAX, p.sizes)) { return false; }
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv)
{
  params p;
  if (!parse_args(argc, argv, p)) {
    std::fprintf(stderr,
                 "usage: block_cache_bench [--quick] [--pairs N] [--rounds R] [--threads T] "
                 "[--sizes a,b,c]\n");
    return 2;
  }
  unsigned const cores = std::thread::hardware_concurrency();
  constexpr std::size_t cap = std::size_t{256} << 20;  // far above what the bench caches
  long missed               = 0;
  std::size_t primed = 0;  // fake block addresses handed out so far

  std::ostringstream single;
  std::ostringstream threads;
  bool single_met  = true;
  double min_scale = 1e30;
  for (std::size_t si = 0; si < p.sizes.size(); ++si) {
    std::size_t const bytes = p.sizes[si];
    block_cache cache{cap, block_cache::max_block_limit};
    if (cache.class_size(bytes) == 0) {
      std::fprintf(stderr, "block_cache_bench: %zu bytes is not cacheable\n", bytes);
      return 2;
    }
    // Keys: 1 for the one-thread runs, 100+t for own streams, 0 shared.
    prime(cache, primed++, 1, bytes);
    std::vector<stream_key> own;
    std::vector<stream_key> shared;
    for (int t = 0; t < p.threads; ++t) {
      own.push_back(100 + static_cast<stream_key>(t));
      shared.push_back(0);
      prime(cache, primed++, own.back(), bytes);
      prime(cache, primed++, 0, bytes);  // one block per sharer: each take finds one
    }
    hit_pairs(cache, 1, bytes, p.pairs / 4);  // warm-up

    std::vector<double> ns_single;
    std::vector<double> one_rate;
    std::vector<double> own_rate;
    std::vector<double> shared_rate;
    std::vector<double> scale;
    for (int r = 0; r < p.rounds; ++r) {
      auto const t0 = clock_type::now();
      missed += hit_pairs(cache, 1, bytes, p.pairs);
      ns_single.push_back(std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() /
                          static_cast<double>(p.pairs));
      double const one = aggregate_rate(cache, {1}, bytes, p.pairs, missed);
      double const agg = aggregate_rate(cache, own, bytes, p.pairs, missed);
      one_rate.push_back(one);
      own_rate.push_back(agg);
      shared_rate.push_back(aggregate_rate(cache, shared, bytes, p.pairs / 4, missed));
      scale.push_back(agg / one);
    }
    double const ns = median(ns_single);
    single_met      = single_met && ns < 150.0;
    min_scale       = std::min(min_scale, median(scale));
    single << (si ? "," : "") << "\"" << bytes << "\":{\"median_ns_per_pair\":" << ns
           << ",\"min_ns_per_pair\":" << *std::min_element(ns_single.begin(), ns_single.end())
           << "}";
    threads << (si ? "," : "") << "\"" << bytes << "\":{\"one_thread_mpairs_s\":"
            << median(one_rate) / 1e6 << ",\"own_streams_mpairs_s\":" << median(own_rate) / 1e6
            << ",\"own_streams_scaling\":" << median(scale)
            << ",\"shared_stream_mpairs_s\":" << median(shared_rate) / 1e6 << "}";
    static_cast<void>(cache.check_invariants());  // throws (and fails the run) if broken
  }
  double const control     = control_scaling(p.threads);
  bool const enough_cores = cores >= static_cast<unsigned>(p.threads);
  std::printf(
    "{\"meta\":{\"optimized\":%s,\"hardware_threads\":%u,\"threads\":%d,\"pairs\":%ld,"
    "\"rounds\":%d,\"missed_takes\":%ld,\"control_scaling\":%.3g},\"single\":{%s},\"threads\":{%s},"
    "\"targets\":{\"hit_pair_ns_max\":150,\"hit_pair_met\":%s,\"scaling_min\":4,"
    "\"scaling_met\":%s}}\n",
    built_optimized ? "true" : "false",
    cores,
    p.threads,
    p.pairs,
    p.rounds,
    missed,
    control,
    single.str().c_str(),
    threads.str().c_str(),
    single_met && missed == 0 ? "true" : "false",
    !enough_cores ? "null" : (min_scale >= 4.0 && missed == 0 ? "true" : "false"));
  return 0;
}

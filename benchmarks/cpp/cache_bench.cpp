/*
 * SPDX-License-Identifier: Apache-2.0
 */

/**
 * @file cache_bench.cpp
 * @brief What the front cache costs on a hit, on a GPU, as one JSON object on stdout.
 *
 * Measured in one run, warm-up first, then interleaved rounds (the order rotated each round, so
 * drift on a shared machine hits every way alike); every number is the median of the rounds,
 * with the 10th and 90th percentiles and the raw rounds beside it:
 *   - "pairs": ns per alloc+free pair of one size on one non-blocking stream, per pool kind
 *     (pinned, device, managed; one owned pool each), three ways on the same pool:
 *       "floor"    cudaMallocFromPoolAsync + cudaFreeAsync, nothing else;
 *       "uncached" the asyncmr resource without a cache, through rmm::device_async_resource_ref;
 *       "cached"   the resource with `cache` bytes of front cache, through the reference: every
 *                  allocation after the first is a hit (the block freed just before, same
 *                  stream). "cache" holds the cache's counters afterwards (hits, misses).
 *       "cached_legacy" the cached way on the legacy default stream (cudaStreamLegacy), whose
 *                  hits ask the driver nothing (the key is the cache's, taken when it was made);
 *                  its puts record their marker there, as on any stream.
 *       "uncached_recording", "cached_recording" (in "rounds_ns"): the same two while the
 *                  resource records its allocation history (record_history's C++ side).
 *       "cached_stamped", "cached_stamped_written" (in "rounds_ns"): the cached way with an
 *                  event's stamp (and its ring write) made beside each call, by the loop: what a
 *                  recording is made of in the company of the pair's driver calls.
 *                  "uncached_stamped_written": the stamps and ring writes beside the uncached way.
 *       "hits", "puts", "hits_recording", "puts_recording" (in "rounds_ns"): ns per hit and per
 *                  put of the cached resource timed apart (64 allocations, every one a hit,
 *                  then their 64 frees), without and with a recording: what recording adds to
 *                  a cached hit, the allocation alone, as the history target names it.
 *   - "calls": ns per call of what a hit adds besides the cache itself, each alone:
 *     the driver's cuStreamIsCapturing and cuStreamGetId (each made once per allocate and once
 *     per deallocate), cuEventRecord (the marker a put records), cuStreamQuery (not made: the
 *     idle-stream question that could replace the marker, 0 per pair) and the bare cache's take+put
 *     on the CPU (no CUDA); and what each event of a recording is made of (no CUDA): the
 *     stamp (history_stamp: the time-stamp counter where the kernel's clocksource is the TSC,
 *     else steady_clock) and history_ring::record into a ring as large as a recording round's
 *     ("calls_per_recorded_pair": twice each, an allocation and a free); beside them the stamp
 *     the recorder does not make on this machine (listed in "recording_candidates"); "meta"
 *     names the kernel's clocksource, the stamp made ("history_stamp") and the CPU ("cpu").
 *   - "resources": what each kind measured.
 *   - "threads": T threads (8), each on its own stream, released together, hit pairs of one size
 *     on ONE cached pinned resource; the same loop on 1 thread in the same round; aggregate
 *     pairs/s and "scaling" = the median of the per-round ratios. The same without a cache for
 *     reference; "calls": the same for cuStreamIsCapturing, cuStreamGetId, cuEventRecord and
 *     cuStreamQuery alone (calls/s),
 *     so a hit path that does not scale can be traced to the driver or to the cache; and
 *     "control_scaling": pure arithmetic on T threads over 1, the most any code scales on this
 *     machine now (a busy host shows there, not as a fault of the cache).
 * The targets (checked by the Python benchmark, targets.py): a pinned hit pair through the
 * reference <= 150 ns at 4 KiB and 64 KiB; 8 threads >= 4x one.
 *
 * Usage: cache_bench [--quick] [--pairs N] [--rounds R] [--warmup W] [--threads T]
 *                    [--sizes a,b,c] [--cache BYTES]
 * Exit status: 0 when it measured (a failed part is named under "errors"), 1 without a usable
 * CUDA device (stdout still holds one JSON object, {"error": ...}), 2 on bad arguments.
 */

#include "bench_support.hpp"
#include "raw_pool_pairs.hpp"

#include <asyncmr/asyncmr.hpp>
#include <asyncmr/detail/block_cache.hpp>
#include <asyncmr/detail/history.hpp>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <rmm/aligned.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda/stream>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

// Where the timed CUDA calls' outputs go (each loop stores once), so no loop computes nothing.
std::atomic<unsigned long long> sink{0};

struct params {
  int pairs{5000};        // pairs per timed round of "pairs"
  int rounds{41};         // timed rounds of "pairs", "calls" and (a quarter, at least 5) threads
  int warmup{1000};       // untimed pairs (or calls) before the rounds
  int threads{8};         // threads of "threads"
  double thread_ms{20};   // target length of one single-thread round of "threads"
  std::size_t cache{std::size_t{64} << 20};  // cap of every cached resource, bytes
  std::size_t thread_bytes{4096};
  std::vector<std::size_t> sizes{4096, 65536};
  long control_steps{50'000'000};
};

using asyncmr_bench::cuda_failure;
using asyncmr_bench::json_escape;
using asyncmr_bench::option_value;
using asyncmr_bench::parse_sizes;
using asyncmr_bench::report_failure;
using asyncmr_bench::summarize;
using asyncmr_bench::summary;

void check(cudaError_t e, char const* call)
{
  if (e != cudaSuccess) { throw std::runtime_error{cuda_failure(call, e)}; }
}

double since_ns(clock_type::time_point t0)
{
  return std::chrono::duration<double, std::nano>(clock_type::now() - t0).count();
}

// ---- the timed loops --------------------------------------------------------------------

/// ns per pair of cudaMallocFromPoolAsync + cudaFreeAsync (the one loop pool_floor times too).
double floor_round(cudaMemPool_t pool, cudaStream_t stream, std::size_t bytes, int pairs)
{
  auto const r = asyncmr_bench::raw_pool_pairs(pool, stream, bytes, pairs);
  if (r.error != cudaSuccess) { throw std::runtime_error{cuda_failure(r.failed_call, r.error)}; }
  return static_cast<double>(r.elapsed_ns) / pairs;
}

/// `pairs` alloc+free pairs through RMM's type-erased reference, untimed.
void ref_pairs(rmm::device_async_resource_ref ref,
               cudaStream_t stream,
               std::size_t bytes,
               long pairs)
{
  cuda::stream_ref const s{stream};
  for (long i = 0; i < pairs; ++i) {
    void* p = ref.allocate(s, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    ref.deallocate(s, p, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
  }
}

/// ns per pair through the reference.
double ref_round(rmm::device_async_resource_ref ref,
                 cudaStream_t stream,
                 std::size_t bytes,
                 int pairs)
{
  auto const t0 = clock_type::now();
  ref_pairs(ref, stream, bytes, pairs);
  return since_ns(t0) / pairs;
}

// ---- a: pairs, three ways on one pool -----------------------------------------------------

/// One pool kind: a cached and an uncached resource over the same owned pool.
struct kind_subject {
  std::string kind;  // "pinned", "device", "managed"
  std::string resource;
  cudaMemPool_t pool{};
  std::shared_ptr<asyncmr::pool_resource> cached_keep;
  std::shared_ptr<asyncmr::pool_resource> plain_keep;
  std::optional<rmm::device_async_resource_ref> cached;
  std::optional<rmm::device_async_resource_ref> plain;
  std::string error;
};

template <class Resource, class Options>
kind_subject make_kind(std::string kind, std::string resource, Options options, std::size_t cap)
{
  kind_subject k;
  k.kind     = std::move(kind);
  k.resource = std::move(resource);
  try {
    options.source = asyncmr::pool_source::new_pool;
    options.cache  = cap;
    auto cached    = std::make_shared<Resource>(options);
    // The uncached resource adopts the same pool: floor, uncached and cached differ only in
    // the path a pair takes.
    auto plain = std::make_shared<Resource>(cached->pool(), Options{});
    k.pool     = cached->pool_handle();
    k.cached.emplace(*cached);
    k.plain.emplace(*plain);
    k.cached_keep = cached;
    k.plain_keep  = plain;
  } catch (std::exception const& e) {
    k.error = e.what();
  }
  return k;
}

/// The rounds of one kind and size: ns per pair of each way, round by round (the two
/// "recording" ways: the same resources with an allocation history being recorded).
struct way_rounds {
  std::vector<double> floor, uncached, cached, uncached_recording, cached_recording;
  std::vector<double> cached_stamped, cached_stamped_written;  // the recording's parts, beside
  std::vector<double> uncached_stamped_written;                // the same beside an uncached pair
  // A hit and a put timed apart (split_round), without and with a recording.
  std::vector<double> hits, puts, hits_recording, puts_recording;
  // The cached way on the legacy default stream, whose puts set no marker (the stream outlives
  // the cache): where most CuPy, PyTorch and cuDF code allocates.
  std::vector<double> cached_legacy;
};

/// Every series of `way_rounds` by its name in "rounds_ns", in the order written.
constexpr std::pair<char const*, std::vector<double> way_rounds::*> round_series[] = {
  {"floor", &way_rounds::floor},
  {"uncached", &way_rounds::uncached},
  {"cached", &way_rounds::cached},
  {"cached_legacy", &way_rounds::cached_legacy},
  {"uncached_recording", &way_rounds::uncached_recording},
  {"cached_recording", &way_rounds::cached_recording},
  {"cached_stamped", &way_rounds::cached_stamped},
  {"cached_stamped_written", &way_rounds::cached_stamped_written},
  {"uncached_stamped_written", &way_rounds::uncached_stamped_written},
  {"hits", &way_rounds::hits},
  {"hits_recording", &way_rounds::hits_recording},
  {"puts", &way_rounds::puts},
  {"puts_recording", &way_rounds::puts_recording},
};

/// A round of `resource` while it records its history (the ring holds the whole round).
double recording_round(asyncmr::pool_resource& resource,
                       rmm::device_async_resource_ref ref,
                       cudaStream_t stream,
                       std::size_t bytes,
                       int pairs)
{
  resource.start_history(static_cast<std::size_t>(4 * pairs + 64));
  double const ns = ref_round(ref, stream, bytes, pairs);
  std::uint64_t dropped = 0;
  static_cast<void>(resource.stop_history(dropped));
  return ns;
}

/// A cached round with what a recording adds to each event made beside the resource, not by it:
/// a stamp before each allocate and each deallocate returns (`write`: and a ring write, into a
/// fresh ring as large as recording_round's). What the recording costs above this is the
/// resource's own bookkeeping (the history recorder); what this costs above the plain round
/// is the stamps and writes in the company of the pair's driver calls, not alone ("calls").
double beside_round(rmm::device_async_resource_ref ref,
                    cudaStream_t stream,
                    std::size_t bytes,
                    int pairs,
                    bool write)
{
  auto const ring = asyncmr::detail::history_ring::make(static_cast<std::size_t>(4 * pairs + 64));
  asyncmr::detail::history_event e{};
  e.action = asyncmr::detail::history_action::cache_hit;
  e.bytes  = bytes;
  e.stream = reinterpret_cast<std::uintptr_t>(stream);
  cuda::stream_ref const s{stream};
  std::uint64_t acc = 0;
  auto const t0     = clock_type::now();
  for (int i = 0; i < pairs; ++i) {
    void* p   = ref.allocate(s, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    e.time_ns = asyncmr::detail::history_stamp();
    e.address = reinterpret_cast<std::uintptr_t>(p);
    if (write) { ring->record(e); }
    acc += e.time_ns;
    ref.deallocate(s, p, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    e.time_ns = asyncmr::detail::history_stamp();
    if (write) { ring->record(e); }
    acc += e.time_ns;
  }
  double const ns = since_ns(t0) / pairs;
  sink.store(acc + ring->recorded(), std::memory_order_relaxed);
  return ns;
}

/// Blocks a split round holds at once: what the cache holds of one size and stream after
/// fill_for_split, so every allocation of a split round is a hit.
constexpr int split_batch = 64;

/// Leaves `split_batch` blocks of `bytes` in `ref`'s cache on `stream` (allocates that many,
/// then frees them all): the cache's misses of a size, after the first, are these.
void fill_for_split(rmm::device_async_resource_ref ref, cudaStream_t stream, std::size_t bytes)
{
  cuda::stream_ref const s{stream};
  void* held[split_batch];
  for (auto& p : held) { p = ref.allocate(s, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT); }
  for (auto* p : held) { ref.deallocate(s, p, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT); }
}

/// A hit and a put timed apart: batches of `split_batch` allocations, every one served from the
/// cache (fill_for_split), timed, then their frees (each a put), timed on their own; `pairs`
/// of each in all. ns per hit and per put; with `recording`, while `resource` records its
/// history (a ring as large as recording_round's). The hit is what the history target names.
std::pair<double, double> split_round(asyncmr::pool_resource& resource,
                                      rmm::device_async_resource_ref ref,
                                      cudaStream_t stream,
                                      std::size_t bytes,
                                      int pairs,
                                      bool recording)
{
  if (recording) { resource.start_history(static_cast<std::size_t>(4 * pairs + 64)); }
  cuda::stream_ref const s{stream};
  void* held[split_batch];
  double hit_ns = 0, put_ns = 0;
  int const batches = std::max(1, pairs / split_batch);
  for (int b = 0; b < batches; ++b) {
    auto const t0 = clock_type::now();
    for (auto& p : held) { p = ref.allocate(s, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT); }
    auto const t1 = clock_type::now();
    for (auto* p : held) { ref.deallocate(s, p, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT); }
    put_ns += since_ns(t1);
    hit_ns += std::chrono::duration<double, std::nano>(t1 - t0).count();
  }
  if (recording) {
    std::uint64_t dropped = 0;
    static_cast<void>(resource.stop_history(dropped));
  }
  double const n = static_cast<double>(batches) * split_batch;
  return {hit_ns / n, put_ns / n};
}

way_rounds measure_pairs(kind_subject const& k,
                         cudaStream_t stream,
                         std::size_t bytes,
                         params const& p)
{
  // Warm-up maps the pool's memory and puts the first block in the cache.
  floor_round(k.pool, stream, bytes, p.warmup);
  ref_round(*k.plain, stream, bytes, p.warmup);
  ref_round(*k.cached, stream, bytes, p.warmup);
  ref_round(*k.cached, cudaStreamLegacy, bytes, p.warmup);
  fill_for_split(*k.cached, stream, bytes);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
  way_rounds out;
  auto split = [&](bool recording) {
    auto const [hit, put] =
      split_round(*k.cached_keep, *k.cached, stream, bytes, p.pairs, recording);
    (recording ? out.hits_recording : out.hits).push_back(hit);
    (recording ? out.puts_recording : out.puts).push_back(put);
  };
  constexpr int way_count = 11;
  std::function<void()> const ways[way_count] = {
    [&] { out.floor.push_back(floor_round(k.pool, stream, bytes, p.pairs)); },
    [&] { out.uncached.push_back(ref_round(*k.plain, stream, bytes, p.pairs)); },
    [&] { out.cached.push_back(ref_round(*k.cached, stream, bytes, p.pairs)); },
    [&] {
      out.uncached_recording.push_back(
        recording_round(*k.plain_keep, *k.plain, stream, bytes, p.pairs));
    },
    [&] {
      out.cached_recording.push_back(
        recording_round(*k.cached_keep, *k.cached, stream, bytes, p.pairs));
    },
    [&] { out.cached_stamped.push_back(beside_round(*k.cached, stream, bytes, p.pairs, false)); },
    [&] {
      out.cached_stamped_written.push_back(beside_round(*k.cached, stream, bytes, p.pairs, true));
    },
    [&] { split(false); },
    [&] { split(true); },
    [&] {
      out.uncached_stamped_written.push_back(beside_round(*k.plain, stream, bytes, p.pairs, true));
    },
    [&] { out.cached_legacy.push_back(ref_round(*k.cached, cudaStreamLegacy, bytes, p.pairs)); },
  };
  for (int r = 0; r < p.rounds; ++r) {
    for (int i = 0; i < way_count; ++i) {
      ways[(r + i) % way_count]();
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
    }
  }
  return out;
}

// The host CPU's model name (/proc/cpuinfo), empty where there is none: what a locked
// instruction or a time-stamp-counter read costs depends on it.
std::string cpu_model()
{
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (f == nullptr) { return {}; }
  char line[256];
  std::string out;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    std::string const l{line};
    if (l.rfind("model name", 0) == 0 && l.find(':') != std::string::npos) {
      out = l.substr(l.find(':') + 1);
      break;
    }
  }
  std::fclose(f);
  while (!out.empty() && (out.front() == ' ' || out.front() == '\t')) { out.erase(0, 1); }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) { out.pop_back(); }
  return out;
}

// ---- b: the calls a hit makes --------------------------------------------------------------

// The hit path asks the driver directly (src/front_cache.cpp: through the runtime a stream
// query costs ~50 ns here, the driver's entry point ~16 ns), so these time the same entry points.
template <typename Fn>
Fn driver_fn(char const* symbol, int version)
{
  void* address                          = nullptr;
  cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
  check(cudaGetDriverEntryPointByVersion(symbol, &address, version, cudaEnableDefault, &result),
        symbol);
  if (result != cudaDriverEntryPointSuccess || address == nullptr) {
    throw std::runtime_error{std::string{"the driver has no "} + symbol};
  }
  return reinterpret_cast<Fn>(address);
}

void driver_check(int status, char const* what)
{
  if (status != 0) {
    throw std::runtime_error{std::string{what} + " failed: CUresult " + std::to_string(status)};
  }
}

void is_capturing_calls(cudaStream_t stream, long calls)
{
  static auto* const fn = driver_fn<int (*)(cudaStream_t, int*)>("cuStreamIsCapturing", 10000);
  int status             = 0;
  unsigned long long acc = 0;
  for (long i = 0; i < calls; ++i) {
    driver_check(fn(stream, &status), "cuStreamIsCapturing");
    acc += static_cast<unsigned long long>(status);
  }
  sink.store(acc, std::memory_order_relaxed);
}

void get_id_calls(cudaStream_t stream, long calls)
{
  static auto* const fn =
    driver_fn<int (*)(cudaStream_t, unsigned long long*)>("cuStreamGetId", 12000);
  unsigned long long id  = 0;
  unsigned long long acc = 0;
  for (long i = 0; i < calls; ++i) {
    driver_check(fn(stream, &id), "cuStreamGetId");
    acc += id;
  }
  sink.store(acc, std::memory_order_relaxed);
}

// Not made by a put: asking whether the stream has anything queued, the one way to skip the
// marker soundly (a stream with nothing queued has finished every block's use), measured so
// the choice is visible: it costs about as much as the record it would save, and scales worse
// on 8 threads (the benchmark's results files give the figures).
void stream_query_calls(cudaStream_t stream, long calls)
{
  static auto* const fn = driver_fn<int (*)(cudaStream_t)>("cuStreamQuery", 2000);
  for (long i = 0; i < calls; ++i) { driver_check(fn(stream), "cuStreamQuery"); }
}

// The front cache's marker: a put records its bucket's event (made with cudaEventDisableTiming)
// on the block's stream. Each call of the body makes its own event.
void event_record_calls(cudaStream_t stream, long calls)
{
  static auto* const fn = driver_fn<int (*)(cudaEvent_t, cudaStream_t)>("cuEventRecord", 2000);
  cudaEvent_t event{};
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  for (long i = 0; i < calls; ++i) { driver_check(fn(event, stream), "cuEventRecord"); }
  check(cudaEventDestroy(event), "cudaEventDestroy");
}

/// One call timed alone: its name in the JSON and its ns per call, round by round.
struct call_rounds {
  char const* name;
  std::vector<double> ns;
};

// What the kernel reads the steady clock from (tsc, kvm-clock, ...): a stamp's cost depends
// on it. Empty where the file is not there.
std::string clocksource()
{
  std::FILE* f = std::fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  if (f == nullptr) { return {}; }
  char buf[64] = {};
  std::size_t const n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  std::string out{buf, n};
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) { out.pop_back(); }
  return out;
}

// What a recorded event costs besides the resource's own bookkeeping: the stamp (stamp_round,
// clock_round), and the ring write (ring_round: each round records into a fresh ring as large
// as recording_round's, as the recording rounds do, so the ring's memory is as cold here as
// there).
template <typename Stamp>
double stamp_round(long calls, Stamp stamp)
{
  auto const t0     = clock_type::now();
  std::uint64_t acc = 0;
  for (long i = 0; i < calls; ++i) { acc += stamp(); }
  double const ns = since_ns(t0) / static_cast<double>(calls);
  sink.store(acc, std::memory_order_relaxed);
  return ns;
}

double clock_round(long calls)
{
  return stamp_round(calls, [] { return asyncmr::detail::history_stamp(); });
}

double ring_round(long calls, int pairs)
{
  auto const ring = asyncmr::detail::history_ring::make(static_cast<std::size_t>(4 * pairs + 64));
  asyncmr::detail::history_event e{};
  e.action      = asyncmr::detail::history_action::cache_hit;
  e.bytes       = 4096;
  auto const t0 = clock_type::now();
  for (long i = 0; i < calls; ++i) {
    e.address = static_cast<std::uint64_t>(i);
    ring->record(e);
  }
  double const ns = since_ns(t0) / static_cast<double>(calls);
  sink.store(ring->recorded(), std::memory_order_relaxed);
  return ns;
}

// The stamp the recorder does not make here, listed in "recording_candidates": steady_clock where
// events are stamped in ticks, a raw time-stamp-counter read (x86-64) where they are not; its
// name is null where there is none.
struct stamp_way {
  char const* name;
  double (*round)(long calls);
};

stamp_way other_stamp()
{
  if (asyncmr::detail::history_stamps_are_ticks()) {
    return {"steady_clock read (the other stamp)",
            [](long calls) { return stamp_round(calls, asyncmr::detail::history_now_ns); }};
  }
#if defined(__x86_64__)
  return {"tsc read (the other stamp)", [](long calls) {
            return stamp_round(calls, [] { return static_cast<std::uint64_t>(__rdtsc()); });
          }};
#else
  return {nullptr, nullptr};
#endif
}

std::vector<call_rounds> measure_calls(cudaStream_t stream, params const& p)
{
  int const n = std::max(p.pairs * 4, 1000);
  auto is_capturing = [stream](int calls) { is_capturing_calls(stream, calls); };
  auto get_id       = [stream](int calls) { get_id_calls(stream, calls); };
  auto event_record = [stream](int calls) { event_record_calls(stream, calls); };
  auto stream_query = [stream](int calls) { stream_query_calls(stream, calls); };
  // The bare cache (no CUDA): a fake block under one key, so every take hits.
  asyncmr::detail::block_cache cache{p.cache};
  void* const block = reinterpret_cast<void*>(std::uintptr_t{0x100000000});  // never dereferenced
  if (!cache.record(block, p.thread_bytes) ||
      cache.put(1, block, p.thread_bytes).status != asyncmr::detail::put_status::cached) {
    throw std::runtime_error{"front_cache put refused"};
  }
  auto take_put = [&](int pairs) {
    for (int i = 0; i < pairs; ++i) {
      void* const b = cache.take(1, p.thread_bytes);
      if (b == nullptr ||
          cache.put(1, b, p.thread_bytes).status != asyncmr::detail::put_status::cached) {
        throw std::runtime_error{"front_cache take+put missed"};
      }
    }
  };
  is_capturing(p.warmup);
  get_id(p.warmup);
  event_record(p.warmup);
  stream_query(p.warmup);
  take_put(p.warmup);
  auto timed = [n](auto& loop) {
    return [n, &loop] {
      auto const t0 = clock_type::now();
      loop(n);
      return since_ns(t0) / n;
    };
  };
  // A recording round makes two events a pair: as many here as in one of those rounds.
  long const events = 2L * p.pairs;
  clock_round(p.warmup);
  ring_round(p.warmup, p.warmup);
  std::vector<std::pair<char const*, std::function<double()>>> ways = {
    {"cuStreamIsCapturing", timed(is_capturing)},
    {"cuStreamGetId", timed(get_id)},
    {"cuEventRecord", timed(event_record)},
    {"cuStreamQuery", timed(stream_query)},
    {"front_cache take+put", timed(take_put)},
    {"history clock read", [&] { return clock_round(events); }},
    {"history ring record", [&] { return ring_round(events, p.pairs); }}};
  if (stamp_way const other = other_stamp(); other.name != nullptr) {
    other.round(p.warmup);
    ways.emplace_back(other.name, [other, events] { return other.round(events); });
  }
  std::vector<call_rounds> out;
  for (auto const& way : ways) { out.push_back({way.first, {}}); }
  std::size_t const way_count = ways.size();
  for (int r = 0; r < p.rounds; ++r) {
    for (std::size_t i = 0; i < way_count; ++i) {
      std::size_t const k = (static_cast<std::size_t>(r) + i) % way_count;
      out[k].ns.push_back(ways[k].second());
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // the recorded events
  }
  cache.detach_all();  // a fake block: parked, never freed
  return out;
}

// ---- c: threads, each on its own stream -----------------------------------------------------

/// What one thread runs: `count` operations (pairs, or calls) on `stream`.
using thread_body = std::function<void(cudaStream_t stream, long count)>;

/**
 * Aggregate operations/s of `streams.size()` threads, each running `body(its stream, count)`,
 * released together; wall = last end - first start (the threads' own clocks, so thread creation
 * and join are not counted).
 */
double thread_round(thread_body const& body, std::vector<cudaStream_t> const& streams, long count)
{
  int const n = static_cast<int>(streams.size());
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<clock_type::time_point> start(n), end(n);
  std::mutex error_mutex;
  std::string error;
  std::vector<std::thread> pool;
  pool.reserve(n);
  for (int t = 0; t < n; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1, std::memory_order_acq_rel);
      while (!go.load(std::memory_order_acquire)) { std::this_thread::yield(); }
      start[t] = clock_type::now();
      try {
        body(streams[t], count);
      } catch (std::exception const& e) {
        std::lock_guard<std::mutex> lock{error_mutex};
        error = e.what();
      }
      end[t] = clock_type::now();
    });
  }
  while (ready.load(std::memory_order_acquire) < n) { std::this_thread::yield(); }
  go.store(true, std::memory_order_release);
  for (auto& th : pool) { th.join(); }
  for (auto const s : streams) { check(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }
  if (!error.empty()) { throw std::runtime_error{error}; }
  auto const first = *std::min_element(start.begin(), start.end());
  auto const last  = *std::max_element(end.begin(), end.end());
  double const s   = std::chrono::duration<double>(last - first).count();
  return static_cast<double>(count) * n / s;
}

struct thread_result {
  long per_thread{};              // operations per thread per round
  std::vector<double> one, many;  // operations/s per round
  std::string error;
};

/// One thread against all of them, alternating which goes first, `rounds` times.
thread_result measure_threads(thread_body const& body,
                              std::vector<cudaStream_t> const& streams,
                              params const& p,
                              int rounds)
{
  thread_result out;
  try {
    std::vector<cudaStream_t> const first{streams.front()};
    for (auto const s : streams) { body(s, p.warmup); }  // every stream (the cache: every bucket)
    // Size the rounds from the single-thread rate: a one-thread round lasts about thread_ms.
    double const rate1 = thread_round(body, first, std::max(p.warmup, 1000));
    out.per_thread =
      std::clamp(static_cast<long>(rate1 * p.thread_ms * 1e-3), 1000L, 20'000'000L);
    for (int r = 0; r < rounds; ++r) {
      if (r % 2 == 0) {
        out.one.push_back(thread_round(body, first, out.per_thread));
        out.many.push_back(thread_round(body, streams, out.per_thread));
      } else {
        out.many.push_back(thread_round(body, streams, out.per_thread));
        out.one.push_back(thread_round(body, first, out.per_thread));
      }
    }
  } catch (std::exception const& e) {
    out.error = e.what();
  }
  return out;
}

/// Pure arithmetic on `threads` threads over one: the ceiling of scaling on this machine now.
double control_scaling(int threads, long steps)
{
  auto const rate = [steps](int n) {
    std::vector<std::thread> pool;
    std::atomic<std::uint64_t> total{0};
    auto const t0 = clock_type::now();
    for (int t = 0; t < n; ++t) {
      pool.emplace_back([&, t] {
        auto x = static_cast<std::uint64_t>(t);
        for (long i = 0; i < steps; ++i) {
          x = x * 6364136223846793005ULL + static_cast<std::uint64_t>(i);
        }
        total += x;
      });
    }
    for (auto& th : pool) { th.join(); }
    return static_cast<double>(steps) * n /
           std::chrono::duration<double>(clock_type::now() - t0).count();
  };
  return rate(threads) / rate(1);
}

// ---- JSON ----------------------------------------------------------------------------------

void write_rounds(std::ostream& os, std::vector<double> const& v)
{
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i) { os << (i ? "," : "") << v[i]; }
  os << "]";
}

/// {"median<unit>", "p10<unit>", "p90<unit>"} of v, and its rounds as "rounds<unit>" when
/// `with_rounds`; `unit` is "_ns", "_pairs_per_s" or "" (a ratio).
void write_summary(std::ostream& os,
                   std::vector<double> const& v,
                   char const* unit,
                   bool with_rounds = false)
{
  auto const s = summarize(v);
  os << "{\"median" << unit << "\":" << s.median << ",\"p10" << unit << "\":" << s.p10
     << ",\"p90" << unit << "\":" << s.p90;
  if (with_rounds) {
    os << ",\"rounds" << unit << "\":";
    write_rounds(os, v);
  }
  os << "}";
}

std::vector<double> per_round_ratio(std::vector<double> const& a, std::vector<double> const& b)
{
  std::vector<double> r;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (b[i] > 0) { r.push_back(a[i] / b[i]); }
  }
  return r;
}

bool parse_args(int argc, char** argv, params& p)
{
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--quick") {
      p.pairs         = 2000;
      p.rounds        = 15;
      p.warmup        = 500;
      p.thread_ms     = 8;
      p.control_steps = 20'000'000;
    } else if (a == "--pairs") {
      if (!option_value(argc, argv, i, p.pairs)) { return false; }
    } else if (a == "--rounds") {
      if (!option_value(argc, argv, i, p.rounds)) { return false; }
    } else if (a == "--warmup") {
      if (!option_value(argc, argv, i, p.warmup)) { return false; }
    } else if (a == "--threads") {
      if (!option_value(argc, argv, i, p.threads) || p.threads < 2) { return false; }
    } else if (a == "--cache") {
      if (!option_value(argc, argv, i, p.cache) || p.cache < (std::size_t{1} << 20)) {
        return false;  // room for every size's block
      }
    } else if (a == "--sizes") {
      // Cached sizes only.
      if (i + 1 >= argc || !parse_sizes(argv[++i], std::size_t{1} << 20, p.sizes)) {
        return false;
      }
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
                 "usage: cache_bench [--quick] [--pairs N] [--rounds R] [--warmup W] "
                 "[--threads T (>= 2)] [--sizes BYTES,... (each <= 1 MiB)] [--cache BYTES (>= 1 MiB)]\n");
    return 2;
  }

  try {
    asyncmr::require_cuda();
  } catch (std::exception const& e) {
    return report_failure("cache_bench", e.what());
  }

  cudaSetDevice(0);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  auto const versions = asyncmr::versions();
  unsigned const cores = std::thread::hardware_concurrency();

  std::vector<cudaStream_t> streams(static_cast<std::size_t>(p.threads));
  for (auto& s : streams) {
    if (auto const e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
      return report_failure("cache_bench", cuda_failure("cudaStreamCreateWithFlags", e));
    }
  }
  cudaStream_t const stream = streams.front();

  using namespace asyncmr;
  std::vector<kind_subject> kinds;
  kinds.push_back(make_kind<async_pinned_memory_resource>(
    "pinned", "async_pinned_memory_resource (owned pool)", pinned_resource_options{}, p.cache));
  kinds.push_back(make_kind<async_device_memory_resource>(
    "device", "async_device_memory_resource (owned pool)", device_resource_options{}, p.cache));
  kinds.push_back(make_kind<async_managed_memory_resource>(
    "managed", "async_managed_memory_resource (owned pool)", managed_resource_options{}, p.cache));

  std::map<std::string, std::string> errors;
  std::ostringstream os;
  os.precision(6);

  os << "\"resources\":{";
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    os << (i ? "," : "") << "\"" << kinds[i].kind << "\":\"" << json_escape(kinds[i].resource)
       << ", cache " << p.cache << " B, and the same pool without cache\"";
  }
  os << "},";

  // a. pairs
  os << "\"pairs\":{";
  bool first_kind = true;
  std::ostringstream cache_json;
  for (auto const& k : kinds) {
    if (!k.error.empty()) {
      errors[k.kind] = k.error;
      continue;
    }
    os << (first_kind ? "" : ",") << "\"" << k.kind << "\":{";
    first_kind      = false;
    bool first_size = true;
    for (std::size_t const bytes : p.sizes) {
      try {
        auto const r = measure_pairs(k, stream, bytes, p);
        os << (first_size ? "" : ",") << "\"" << bytes << "\":{\"floor\":";
        first_size = false;
        write_summary(os, r.floor, "_ns");
        os << ",\"uncached\":";
        write_summary(os, r.uncached, "_ns");
        os << ",\"cached\":";
        write_summary(os, r.cached, "_ns");
        os << ",\"cached_over_floor\":";
        write_summary(os, per_round_ratio(r.cached, r.floor), "");
        os << ",\"cached_over_uncached\":";
        write_summary(os, per_round_ratio(r.cached, r.uncached), "");
        os << ",\"cached_legacy\":";
        write_summary(os, r.cached_legacy, "_ns");
        os << ",\"rounds_ns\":{";
        for (std::size_t i = 0; i < std::size(round_series); ++i) {
          os << (i ? "," : "") << "\"" << round_series[i].first << "\":";
          write_rounds(os, r.*round_series[i].second);
        }
        os << "}}";
      } catch (std::exception const& e) {
        errors["pairs:" + k.kind + "@" + std::to_string(bytes)] = e.what();
        cudaGetLastError();
      }
    }
    os << "}";
    auto const st = k.cached_keep->cache_stats();
    cache_json << (cache_json.tellp() > 0 ? "," : "") << "\"" << k.kind << "\":{\"cap\":"
               << k.cached_keep->cache_capacity() << ",\"hits\":" << st->hits
               << ",\"misses\":" << st->misses << ",\"refused_cap\":" << st->refused_cap
               << ",\"cached_bytes\":" << st->cached_bytes
               << ",\"cached_blocks\":" << st->cached_blocks << "}";
  }
  os << "},\"cache\":{" << cache_json.str() << "}";

  // b. the calls of the hit path, alone
  os << ",\"calls\":{";
  try {
    auto const calls = measure_calls(stream, p);
    for (std::size_t i = 0; i < calls.size(); ++i) {
      os << (i ? "," : "") << "\"" << calls[i].name << "\":";
      write_summary(os, calls[i].ns, "_ns", true);
    }
  } catch (std::exception const& e) {
    errors["calls"] = e.what();
  }
  os << "},\"calls_per_hit_pair\":{\"cuStreamIsCapturing\":2,\"cuStreamGetId\":2,"
        "\"cuEventRecord\":1,\"cuStreamQuery\":0,\"front_cache take+put\":1}"
        ",\"calls_per_recorded_pair\":{\"history clock read\":2,\"history ring record\":2}";
  // Measured beside the recording's own calls, made by none of them: the other stamp's cost.
  os << ",\"recording_candidates\":[";
  if (char const* const other = other_stamp().name) { os << "\"" << other << "\""; }
  os << "]";

  // c. threads: hit pairs on the pinned kind, and the two CUDA calls of a hit, alone
  int const thread_rounds = std::max(5, p.rounds / 4);
  auto write_threads      = [&](std::ostream& out, thread_result const& t, char const* unit) {
    out << "{\"per_thread\":" << t.per_thread << ",\"1\":";
    write_summary(out, t.one, unit);
    out << ",\"" << p.threads << "\":";
    write_summary(out, t.many, unit);
    out << ",\"scaling\":";
    write_summary(out, per_round_ratio(t.many, t.one), "");
    out << ",\"rounds" << unit << "\":{\"1\":";
    write_rounds(out, t.one);
    out << ",\"" << p.threads << "\":";
    write_rounds(out, t.many);
    out << "}}";
  };
  os << ",\"threads\":{\"kind\":\"pinned\",\"bytes\":" << p.thread_bytes
     << ",\"threads\":" << p.threads << ",\"rounds\":" << thread_rounds << ",\"results\":{";
  if (kinds.front().error.empty()) {
    auto const& k    = kinds.front();
    bool first       = true;
    std::size_t const bytes = p.thread_bytes;
    auto const ways  = {std::pair{"cached", *k.cached}, std::pair{"uncached", *k.plain}};
    for (auto const& [way, ref] : ways) {
      auto const t = measure_threads(
        [ref = ref, bytes](cudaStream_t s, long n) { ref_pairs(ref, s, bytes, n); },
        streams,
        p,
        thread_rounds);
      if (!t.error.empty()) {
        errors[std::string{"threads:"} + way] = t.error;
        continue;
      }
      os << (first ? "" : ",") << "\"" << way << "\":";
      first = false;
      write_threads(os, t, "_pairs_per_s");
    }
  } else {
    errors["threads"] = "no pinned resource: " + kinds.front().error;
  }
  os << "},\"calls\":{";
  bool first_call = true;
  for (auto const& [name, body] :
       {std::pair<char const*, thread_body>{"cuStreamIsCapturing", is_capturing_calls},
        std::pair<char const*, thread_body>{"cuStreamGetId", get_id_calls},
        std::pair<char const*, thread_body>{"cuEventRecord", event_record_calls},
        std::pair<char const*, thread_body>{"cuStreamQuery", stream_query_calls}}) {
    auto const t = measure_threads(body, streams, p, thread_rounds);
    if (!t.error.empty()) {
      errors[std::string{"threads:"} + name] = t.error;
      continue;
    }
    os << (first_call ? "" : ",") << "\"" << name << "\":";
    first_call = false;
    write_threads(os, t, "_calls_per_s");
  }
  os << "},\"control_scaling\":" << control_scaling(p.threads, p.control_steps) << "}";

  // Resources (and their owned pools) go before the streams; the cached ones drain first.
  kinds.clear();

  std::ostringstream doc;
  doc.precision(6);
  doc << "{\"meta\":{\"gpu\":\"" << json_escape(prop.name) << "\",\"driver\":" << versions.driver
      << ",\"runtime\":" << versions.runtime << ",\"variant\":\"cu" << versions.runtime / 1000
      << "\",\"hardware_concurrency\":" << cores << ",\"clock\":\"steady_clock\""
      << ",\"clocksource\":\"" << json_escape(clocksource()) << "\""
      << ",\"cpu\":\"" << json_escape(cpu_model()) << "\""
      << ",\"history_stamp\":\""
      << (asyncmr::detail::history_stamps_are_ticks() ? "tsc" : "steady_clock") << "\""
      << ",\"optimized\":" << (asyncmr_bench::built_optimized ? "true" : "false") << "}";
  doc << ",\"params\":{\"pairs\":" << p.pairs << ",\"rounds\":" << p.rounds
      << ",\"warmup\":" << p.warmup << ",\"split_batch\":" << split_batch
      << ",\"cache_bytes\":" << p.cache << ",\"sizes\":[";
  for (std::size_t i = 0; i < p.sizes.size(); ++i) { doc << (i ? "," : "") << p.sizes[i]; }
  doc << "],\"threads\":" << p.threads << ",\"thread_ms\":" << p.thread_ms
      << ",\"stream\":\"non-blocking streams\",\"alignment\":" << rmm::CUDA_ALLOCATION_ALIGNMENT
      << "}," << os.str() << ",\"errors\":{";
  bool first = true;
  for (auto const& [k, v] : errors) {
    doc << (first ? "" : ",") << "\"" << json_escape(k) << "\":\"" << json_escape(v) << "\"";
    first = false;
  }
  doc << "}}";
  std::puts(doc.str().c_str());

  for (auto const s : streams) { cudaStreamDestroy(s); }
  return 0;
}

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file front_cache.hpp
 * @brief A per-stream cache of freed blocks that sits in front of a stream-ordered memory pool.
 *
 * No CUDA in here: a stream is an opaque 64-bit key and a block is a pointer plus a size, so the
 * whole mechanism is tested on a machine without a GPU. The resource that owns a cache does:
 *   - allocate(stream, bytes): when `class_size(bytes) != 0` and the stream is not capturing,
 *     `take(key, bytes)`; on a miss, allocate `class_size(bytes)` bytes from the pool.
 *   - deallocate(stream, ptr, bytes): `put(key, ptr, bytes)`; when it answers false, free `ptr`
 *     to the pool on `stream`.
 *   - trim / destruction: synchronize, then `drain(f)` and free every block `f` receives.
 * While a stream captures, the owner bypasses take AND put. A block allocated inside a capture
 * belongs to the graph (and has `bytes`, not the class size): its later deallocation must go to
 * the pool, never to `put`, or a relaunch finds its allocation unfreed and a larger request of
 * the same class overruns it. Such blocks are rare; the owner can remember them in a locked set
 * that `deallocate` consults only while it is non-empty.
 *
 * ## Size classes
 * Four classes per power of two from 256 bytes: 256, 320, 384, 448, 512, 640, 768, 896, 1024,
 * 1280, ... A request of `b >= 256` bytes gets the smallest class `>= b`; the class exceeds `b` by
 * less than `b / 4` (at most 25% waste; 19% on average over a doubling for uniform sizes).
 * Requests below 256 bytes get 256, the alignment every CUDA pool allocation has anyway.
 * Blocks above `max_block()` are not cached (`class_size` answers 0): the driver pool serves
 * them at a cost (~1 us) that is small next to the work a block that large feeds, and a cache of
 * large blocks would hold most of its cap in few blocks with up to 25% waste each.
 *
 * ## Cap
 * The bytes of cached blocks (counted at their class size) never exceed `cap()`, at any instant,
 * without a shared counter on the hit path: each stream's bucket holds *credit* reserved from a
 * global budget in chunks. `put` turns credit into cached bytes, `take` turns them back into
 * credit; a bucket goes to the global budget only when its credit runs out (reserve a chunk) or
 * piles up (return the excess). So cached bytes <= credit + cached bytes of all buckets
 * = cap - global budget <= cap. A put the bucket cannot cover, after reclaiming idle credit
 * from other buckets, is refused (the caller frees the block to the pool).
 *
 * ## Stream keys (what the owner must get right)
 * A block put for key K is handed out only to a `take` with key K, with no event: that is safe
 * exactly when K names one CUDA stream for the whole time the block sits in the cache, because
 * then the later allocation is ordered after the free on that stream. Two traps with raw
 * `cudaStream_t` values as keys:
 *   - `cudaStreamPerThread` (and the null stream under per-thread default-stream builds) is one
 *     handle value for a different stream in every thread; the legacy null stream is a different
 *     stream per device. A key of the raw handle would hand a block freed on thread 1's stream
 *     to thread 2's stream with no ordering: a data race on the GPU.
 *   - CUDA reuses the handle value of a destroyed stream. `cudaStreamDestroy` returns at once
 *     while work queued on the stream still runs. A block freed on stream A just before
 *     destroying A could be handed to a new stream B that got A's handle value while A's work
 *     still reads or writes the block.
 * Keying by `cudaStreamGetId` (CUDA 12.0+; "unique for the life of the program", and it resolves
 * the special handles to the calling thread's / device's stream) removes both: a new stream
 * never sees an old stream's blocks. Blocks of a destroyed stream then stay cached (counted
 * against the cap) until `drain` (trim / destruction, after synchronizing) or `drain_stream`
 * (which the owner may offer to users as "release this stream's blocks before I destroy it").
 * If the owner keys by handle value instead, the rule it must state is: a block freed on a
 * stream that is then destroyed may be handed to a later stream with the same handle value;
 * this is safe only if all work queued on the destroyed stream before it was destroyed has
 * completed before the new stream's work uses the block (synchronize a stream before destroying
 * it, or release its blocks first), and `cudaStreamPerThread` must never be cached.
 *
 * ## Threads
 * `take` and `put` take no global lock: a thread-local table maps (cache id, key) to the key's
 * bucket; only the first time a thread meets a key does it visit the registry (a mutex). The
 * cache id is unique per cache object for the life of the process, so a table entry of a
 * destroyed cache never matches a new cache built at the same address. Each bucket has its own
 * small lock: threads that share a key (the legacy null stream) serialise on it; threads on
 * different keys never touch the same cache line on a hit.
 */

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace asyncmr::detail {

/// @brief Identifies one CUDA stream for the cache (see "Stream keys" in front_cache.hpp).
using stream_key = std::uint64_t;

/// @brief Counters of one `front_cache`, summed over its streams when read.
struct front_cache_stats {
  std::uint64_t hits{};                 ///< takes served from the cache
  std::uint64_t misses{};               ///< takes that returned nullptr (empty class or uncacheable)
  std::uint64_t refused_cap{};          ///< puts refused because the cap was reached
  std::uint64_t refused_uncacheable{};  ///< puts of sizes the cache does not hold (or nullptr)
  std::size_t cached_bytes{};           ///< bytes of cached blocks now (class sizes)
  std::size_t cached_blocks{};          ///< number of cached blocks now
  /// Bytes charged against the cap now: cached bytes plus credit the buckets hold (<= cap).
  std::size_t charged_bytes{};
  /// Peak of `charged_bytes` since construction or `reset_peaks()`. An exact peak of the cached
  /// bytes alone would need a shared counter on every hit; this one is exact for what it counts,
  /// bounds the cached-bytes peak from above, and never exceeds the cap.
  std::size_t charged_high{};
  std::size_t streams{};  ///< buckets in use (keys met and not recycled)
};

/// @brief A test-and-test-and-set lock for a bucket: uncontended, one atomic exchange and one
/// store; contended, it spins briefly and yields. With `std::mutex` in its place a hit pair in
/// front_cache_bench cost ~48 ns instead of ~27-37 ns (2-core Xeon VM, 2026-11-30).
class bucket_lock {
 public:
  void lock() noexcept
  {
    if (!locked_.exchange(true, std::memory_order_acquire)) { return; }
    lock_slow();
  }
  [[nodiscard]] bool try_lock() noexcept
  {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  void lock_slow() noexcept;
  std::atomic<bool> locked_{false};
};

/**
 * @brief Per-stream front cache of freed blocks, by size class, under a byte cap.
 * See the file comment for the size classes, the cap, stream keys and threads.
 */
class front_cache {
 public:
  static constexpr std::size_t min_class_bytes      = 256;  ///< smallest class, bytes
  static constexpr unsigned classes_per_doubling    = 4;
  static constexpr std::size_t default_max_block    = std::size_t{1} << 20;  ///< 1 MiB
  static constexpr std::size_t max_block_limit      = std::size_t{1} << 26;  ///< 64 MiB
  static constexpr std::size_t max_cap              = std::size_t{1} << 50;  ///< 1 PiB
  /// Number of classes from 256 bytes to `max_block_limit`.
  static constexpr std::size_t class_count = (26 - 8) * classes_per_doubling + 1;

  /**
   * @brief A cache that holds at most `cap_bytes` bytes of freed blocks.
   * @param cap_bytes the cap, bytes; at least `min_class_bytes`. 0 means "no cache": the owner
   *   then constructs none, so 0 is refused here.
   * @param max_block_bytes the largest request cached, bytes; 0 picks
   *   min(1 MiB, cap / 8), and never below 256. Rounded down to a class; must not exceed the cap
   *   or 64 MiB.
   * @throws std::invalid_argument naming the bad value
   */
  explicit front_cache(std::size_t cap_bytes, std::size_t max_block_bytes = 0);
  /// @brief Drops the bookkeeping. Blocks still cached are NOT freed (no CUDA here): the owner
  /// drains first. No thread may be inside take/put/drain of this cache.
  ~front_cache();
  front_cache(front_cache const&)            = delete;
  front_cache& operator=(front_cache const&) = delete;
  front_cache(front_cache&&)                 = delete;
  front_cache& operator=(front_cache&&)      = delete;

  /// @brief The class a request of `bytes` (> 0) maps to, bytes, whatever the cap.
  [[nodiscard]] static constexpr std::size_t round_to_class(std::size_t bytes) noexcept
  {
    return class_bytes(class_index(bytes));
  }
  /// @brief Bytes the owner allocates from the pool for a request of `bytes` on a miss; 0 when
  /// the request is not cacheable (0 bytes, or above `max_block()`): allocate `bytes` then.
  [[nodiscard]] std::size_t class_size(std::size_t bytes) const noexcept
  {
    return (bytes == 0 || bytes > max_block_) ? 0 : round_to_class(bytes);
  }

  /**
   * @brief A cached block of `class_size(bytes)` bytes last freed for `stream`, or nullptr (a
   * miss: the class is empty, or the size is not cacheable). Lock-free except for the stream's
   * own bucket lock.
   */
  [[nodiscard]] void* take(stream_key stream, std::size_t bytes) noexcept;

  /**
   * @brief Offers a block freed on `stream` to the cache. `bytes` is the size the block was
   * requested with; it must have been allocated with at least `class_size(bytes)` bytes (every
   * block from `take` or from a miss is). True: the cache owns it now. False (uncacheable size,
   * nullptr, or the cap is reached): the caller still owns it and frees it to the pool.
   * A pointer put twice is not detected (it would be handed out twice): it is the caller's
   * double free, which the pool would have reported.
   */
  [[nodiscard]] bool put(stream_key stream, void* ptr, std::size_t bytes) noexcept;

  /**
   * @brief Empties the cache, calling `f(stream_key, void* ptr, std::size_t class_bytes)` once
   * for every block it held. `f` runs with no cache lock held (it may call CUDA and may touch
   * the cache); it must not throw.
   *
   * Concurrency: safe against concurrent take/put/drain. Every block cached when `drain` began
   * and not taken meanwhile is passed to exactly one `f` of one drain call; a block put while
   * `drain` runs may stay cached. With no concurrent put, the cache is empty on return and its
   * whole cap is back in the global budget.
   *
   * The key passed to `f` says which stream freed the block; it is not a handle to free it on
   * (the stream may be gone). The owner synchronizes first and frees on a live stream.
   */
  template <class F>
  void drain(F&& f)
  {
    static_assert(std::is_nothrow_invocable_v<F&, stream_key, void*, std::size_t>,
                  "drain's callback must be noexcept (a throw would lose the remaining blocks)");
    drain_impl(false, 0, &call<std::remove_reference_t<F>>, erase(f));
  }
  /**
   * @brief Like `drain`, for the blocks of one stream only. The owner may free them on that
   * stream in stream order (no synchronization) while the stream is alive.
   */
  template <class F>
  void drain_stream(stream_key stream, F&& f)
  {
    static_assert(std::is_nothrow_invocable_v<F&, stream_key, void*, std::size_t>,
                  "drain_stream's callback must be noexcept");
    drain_impl(true, stream, &call<std::remove_reference_t<F>>, erase(f));
  }

  /// @brief Bytes of cached blocks now (class sizes); sums the buckets under their locks.
  [[nodiscard]] std::size_t bytes() const;
  /// @brief All counters (see `front_cache_stats`); sums the buckets under their locks.
  [[nodiscard]] front_cache_stats stats() const;
  /// @brief Restarts `charged_high` from the bytes charged now.
  void reset_peaks() noexcept;
  /**
   * @brief For tests and debugging: locks every bucket at once (stalling all takes and puts)
   * and checks that the buckets' charges plus the global budget equal the cap and that each
   * bucket's counts match its lists.
   * @return the exact bytes cached at that instant (<= cap)
   * @throws std::logic_error naming the broken invariant
   */
  [[nodiscard]] std::size_t check_invariants() const;

  [[nodiscard]] std::size_t cap() const noexcept { return cap_; }
  [[nodiscard]] std::size_t max_block() const noexcept { return max_block_; }
  /// @brief Credit a bucket reserves from the global budget at a time, bytes.
  [[nodiscard]] std::size_t chunk() const noexcept { return chunk_; }
  /// @brief This cache's id: unique among all caches of the process, never reused.
  [[nodiscard]] std::uint64_t id() const noexcept { return id_; }

  /// @brief Class index of a request of `bytes` bytes: 0 for <= 256, then 4 per doubling.
  [[nodiscard]] static constexpr std::size_t class_index(std::size_t bytes) noexcept
  {
    if (bytes <= min_class_bytes) { return 0; }
    // b - 1 = 2^e + r: the class is 2^e plus the next multiple of 2^(e-2) above r.
    std::size_t const b = bytes - 1;
    unsigned const e    = bit_floor_log2(b);
    return (e - 8) * classes_per_doubling + (b >> (e - 2)) - 3;
  }
  /// @brief Bytes of class `index`.
  [[nodiscard]] static constexpr std::size_t class_bytes(std::size_t index) noexcept
  {
    if (index == 0) { return min_class_bytes; }
    std::size_t const e   = 8 + (index - 1) / classes_per_doubling;
    std::size_t const sub = (index - 1) % classes_per_doubling + 1;
    return (std::size_t{1} << e) + (sub << (e - 2));
  }

 private:
  struct bucket;
  using drain_fn = void (*)(void* ctx, stream_key, void*, std::size_t) noexcept;

  template <class F>
  static void call(void* ctx, stream_key k, void* p, std::size_t n) noexcept
  {
    (*static_cast<F*>(ctx))(k, p, n);  // F keeps the callback's constness
  }
  template <class F>
  static void* erase(F& f) noexcept
  {
    return const_cast<void*>(static_cast<void const*>(std::addressof(f)));
  }
  static constexpr unsigned bit_floor_log2(std::size_t v) noexcept
  {
    return static_cast<unsigned>(63 - __builtin_clzll(v));
  }

  bucket* find(stream_key stream) noexcept;
  bucket* find_slow(stream_key stream) noexcept;
  bool reserve(bucket& b, std::size_t need) noexcept;
  void give_back_excess(bucket& b) noexcept;
  void reclaim_idle_credit(bucket const* except) noexcept;
  void drain_impl(bool one, stream_key stream, drain_fn f, void* ctx);

  std::size_t cap_;
  std::size_t max_block_;
  std::size_t chunk_;
  std::size_t keep_credit_;  // a bucket holding more idle credit than this returns the excess
  std::uint64_t id_;

  alignas(64) std::atomic<std::size_t> available_;  // the global budget, bytes
  std::atomic<std::size_t> charged_high_;

  alignas(64) mutable std::mutex registry_mutex_;
  std::unordered_map<stream_key, bucket*> by_key_;
  std::vector<std::unique_ptr<bucket>> buckets_;  // never shrinks while the cache lives
};

}  // namespace asyncmr::detail

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file block_cache.hpp
 * @brief A per-stream cache of freed blocks in front of a stream-ordered memory pool, with an
 * ownership record: it takes back only blocks it can show it handed out.
 *
 * No CUDA in here: a stream is an opaque 64-bit key and a block is a pointer plus a size, so the
 * whole mechanism is tested on a machine without a GPU (tests/cpp/block_cache_test.cpp). The
 * front cache (src/detail/front_cache.hpp) binds it to CUDA streams and to a pool.
 *
 * ## How the mechanism keeps the front cache's rules
 * What the cache promises its users is stated once, in the user guide
 * (docs/user_guide/front_cache.md, "The rules", numbered there). This is how the mechanism
 * keeps them:
 * 1. **Only recorded blocks are cached** (the user guide's rule 1). The owner records every
 *    block it allocates from the pool for a cacheable request (`record`, at the class size). `put` accepts a block only if
 *    the record holds it as handed out, at the class the free names; anything else (a graph's
 *    allocation, another pool's block, a block of the pool that an uncached sibling allocated at
 *    its exact size, a wrong size, a second free of a cached block) is answered without any
 *    change, and the owner decides: a pool free, or a refusal to the caller. A captured
 *    allocation is never recorded as the cache's; it is noted as a graph's (`record_graph`), so
 *    its frees after every launch go to the pool without the owner asking the driver whose
 *    block it is. A note is only that shortcut, and it may be lost: `record` takes a note's
 *    slot when none near its pointer is empty (notes of destroyed graphs would otherwise fill
 *    the record, and nothing would be cached any more). A free whose note is gone is answered
 *    `not_recorded`, and the owner asks the driver, which names no other pool for a graph's
 *    block, and frees it to the pool: the same free, one driver question later.
 * 2. **A block goes only to the stream it was freed on** (the page's opening paragraph). A block
 *    put for key K is handed out only to a `take` with key K, with no event: stream order on K
 *    makes that safe, as long as K names one stream for the block's whole time in the cache
 *    (see "Stream keys").
 * 3. **A block leaves the cache for the pool only when no stream can still use it** (rule 3): in
 *    the order of its own stream (`drain_stream`, whose callback frees on that stream), or in
 *    the order of the owner's release stream once that stream waits for the block's own
 *    stream (see "Markers": `detach_all` / `detach_stale` park a bucket's blocks only after
 *    ordering the release after its marker; then `begin_proof` and `free_parked`; the owner
 *    calls `release` and `reclaim_stale`, which do all three under one lock). A block put
 *    after the park is not covered, so it stays cached; so do a bucket's newer blocks while
 *    its parked ones wait for their proof (one generation parked per bucket: a proof frees all
 *    that was parked before it, whatever is parked after). No device-wide synchronization is
 *    ever needed: one would refuse, and invalidate, any capture running on the device.
 * 4. **The record forgets a block exactly when it goes back to the pool**, so an address the pool
 *    hands out again is never mistaken for one the cache still owns.
 * 5. **Nothing here allocates or throws on the hit path,** and every operation the owner calls
 *    from a `noexcept` path is `noexcept` (the bookkeeping that could fail to allocate refuses
 *    instead: a block the record has no room for is simply never cached).
 *
 * ## Size classes
 * Four classes per power of two from 256 bytes: 256, 320, 384, 448, 512, 640, 768, 896, 1024,
 * 1280, ... A request of `b >= 256` bytes gets the smallest class `>= b` (under 25% waste).
 * Requests below 256 bytes get 256, the alignment every CUDA pool allocation has anyway. Blocks
 * above `max_block()` are not cached (`class_size` answers 0).
 *
 * ## Cap
 * The bytes of cached and parked blocks (class sizes) never exceed `cap()`, at any instant,
 * without a shared counter on the hit path: each stream's bucket holds *credit* reserved from a
 * global budget in chunks. `put` turns credit into cached bytes, `take` turns them back into
 * credit; a bucket goes to the global budget only when its credit runs out (reserve a chunk) or
 * piles up (return the excess). A bucket's chunk starts at one block and doubles with each
 * reservation up to `chunk()`, so short-lived streams hold little idle credit.
 *
 * ## Stream keys (what the owner must get right)
 * Keys come from `cudaStreamGetId`: unique for the life of the process, and the special
 * handles (`cudaStreamPerThread`, the legacy stream) resolve to the calling thread's / device's
 * stream, so a new stream never sees an old stream's blocks. The legacy stream of the owner's own
 * context is keyed once, when the owner is made: while a blocking stream captures, the driver
 * answers no question about the legacy stream, and a hit there needs none (a put sets its marker,
 * below, so the owner refuses it while such a capture runs, as CUDA refuses a free there).
 *
 * ## Markers
 * A stream may be destroyed the moment a free on it returns, so its order must be captured
 * while it is alive: every put first sets its bucket's *marker* on the block's stream (the
 * owner's `stream_markers::mark`: a CUDA event recorded there), under the bucket's lock and
 * before the block can be seen. Parking a bucket first orders the owner's release after the
 * marker (`stream_markers::order`: the release stream waits for the event), so every parked
 * block's last use precedes its free. A put whose marker cannot be set is refused (the owner
 * frees the block on its own stream, which is always safe); a bucket whose release cannot be
 * ordered keeps its blocks cached. Without markers (the CPU tests) both steps are skipped.
 * The owner makes markers only in primary contexts: a context the user made (`cuCtxCreate`)
 * may be destroyed while blocks wait, and its events with it, so a free on its streams is
 * refused (freed to the pool in that stream's own order). A thread remembers the last context
 * it found not primary (only the "no": a refusal is always sound).
 *
 * The legacy default stream is no exception, though it lives as long as its context: a free
 * there is ordered after the earlier work of *every blocking stream* of the context (its implicit
 * synchronization), so a block a kernel on a blocking stream used last may be freed there with no
 * wait, and only an event recorded on the legacy stream at the free captures that order (an
 * event on one of the owner's blocking streams would follow the legacy stream's own work only:
 * tests/test_cache_soundness.py).
 *
 * ## Dead and idle streams
 * Blocks of a destroyed stream cannot be freed in its order any more. Every take and put stamps
 * its bucket with the current *epoch*; `detach_stale` parks the blocks (and returns the credit)
 * of every bucket not stamped since the previous call, then starts a new epoch. So a bucket is
 * reclaimed once a whole epoch passed without it being used. The owner calls it from a
 * background thread when refused puts say the cap is under pressure (`note_pressure`), and
 * frees the parked blocks in its release stream's order. `note_pressure` says so only once the
 * epoch is `stale_after_ns` old (the owner's is 100 ms), so a stream loses its blocks only
 * after that long unused, however fast another stream's refusals come; without that bound two
 * requests microseconds apart would reclaim a live stream that was merely waiting for a
 * kernel. Buckets emptied that way are reused for new streams (a bucket keeps its marker; the
 * owner remakes one that its new stream cannot record).
 *
 * ## Threads
 * `take` and `put` take no global lock: a thread-local table maps (cache id, key) to the key's
 * bucket; only the first time a thread meets a key does it take the registry lock. The cache id
 * is unique per cache object for the life of the process. Each bucket has its own small lock;
 * the ownership record is a lock-free table whose slots a thread mostly keeps to itself. The
 * way out (`release`, `reclaim_stale`) takes one more lock, a mutex held from the park to the
 * last block handed over, so a release never finds blocks another thread parked and has not
 * handed over yet (lock order: that mutex, then the registry's, then a bucket's).
 */

#include <asyncmr/front_cache_stats.hpp>

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

/// @brief Identifies one CUDA stream for the cache (see "Stream keys").
using stream_key = std::uint64_t;

using front_cache_stats = asyncmr::front_cache_stats;

/// @brief What `block_cache::put` did with a block.
enum class put_status {
  cached,          ///< the cache owns it now
  refused,         ///< not kept (cap, or no host memory): the caller frees it to the pool
  uncacheable,     ///< nullptr or a size the cache does not hold: the caller frees it
  not_recorded,    ///< the cache never handed it out; nothing changed
  wrong_size,      ///< handed out at another size class (`put_result::recorded_bytes`)
  already_cached,  ///< it is in the cache already (a double free); nothing changed
  graph,           ///< a graph's allocation (`record_graph`): never cached; the caller frees it
};

/// @brief `put`'s answer: the status, and the class bytes the record holds for the block (0 when
/// it holds none).
struct put_result {
  put_status status;
  std::size_t recorded_bytes;
};

/**
 * @brief How the owner captures a stream's order (see "Markers" above). Every function is called
 * under the lock of the bucket concerned and must not throw or call back into the cache;
 * `context` is passed to each. Null functions: no markers (for tests without a GPU).
 */
/// @brief What `stream_markers::mark` made of a stream's order.
enum class mark_result {
  marked,      ///< the marker holds the stream's order now
  unmarkable,  ///< no marker could be set: the put is refused (counted `refused_unmarked`)
  capturing,   ///< the stream began capturing: cached, its bucket unordered until the next put
};

struct stream_markers {
  void* context{nullptr};
  /// Before a block freed on `stream` (the handle `put` was given) enters the bucket: sets
  /// `marker` there, making it on first use (or remaking it). The marker takes the new order
  /// only once the stream is known not to capture; a stream that began capturing after the
  /// owner's look (`capturing`) leaves the marker with no order (`order` then answers false and
  /// the bucket's blocks stay cached) until a later put records one.
  mark_result (*mark)(void* context, void*& marker, void* stream) noexcept = nullptr;
  /// As the bucket's blocks are parked: orders every free the owner makes later after
  /// `marker`. False leaves them cached.
  bool (*order)(void* context, void* marker) noexcept = nullptr;
  /// When the cache is destroyed, for each marker made.
  void (*destroy)(void* context, void* marker) noexcept = nullptr;
};

/**
 * @brief A test-and-test-and-set lock: uncontended, one atomic exchange and one store;
 * contended, it spins briefly and yields. Never throws (a `std::mutex` may), so it guards the
 * paths that must be `noexcept`, and costs a hit pair less than a `std::mutex` in a bucket's
 * place (block_cache_bench).
 */
class spin_lock {
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
 * @brief Per-stream front cache of freed blocks, by size class, under a byte cap, taking back
 * only the blocks it recorded. See the file comment for the rules.
 */
class block_cache {
 public:
  static constexpr std::size_t min_class_bytes   = 256;  ///< smallest class, bytes
  static constexpr unsigned classes_per_doubling = 4;
  static constexpr std::size_t default_max_block = std::size_t{1} << 20;  ///< 1 MiB
  static constexpr std::size_t max_block_limit   = std::size_t{1} << 26;  ///< 64 MiB
  static constexpr std::size_t max_cap           = std::size_t{1} << 50;  ///< 1 PiB
  /// Number of classes from 256 bytes to `max_block_limit`.
  static constexpr std::size_t class_count = (26 - 8) * classes_per_doubling + 1;
  /// Refused puts between two requests for a stale reclaim (`note_pressure`).
  static constexpr unsigned pressure_window = 4;

  /**
   * @brief A cache that holds at most `cap_bytes` bytes of freed blocks.
   * @param cap_bytes the cap, bytes, in [256 B, 1 PiB]. 0 means "no cache": the owner then
   *   constructs none, so 0 is refused here.
   * @param max_block_bytes the largest request cached, bytes; 0 picks min(1 MiB, cap / 8), and
   *   never below 256. Rounded down to a class; must not exceed the cap or 64 MiB.
   * @param record_slots slots of the ownership record (rounded up to a power of two, at least
   *   1024); 0 picks one slot per KiB of cap, between 4096 and 1 Mi slots (8 bytes each).
   * @param markers how the owner captures a stream's order (see "Markers"); none by default
   * @param stale_after_ns the shortest epoch, steady-clock nanoseconds: `note_pressure` asks for
   *   a stale reclaim only once the epoch (begun at construction or the last `detach_stale`) is
   *   this old; 0, the default, at every `pressure_window` refusals
   * @throws std::invalid_argument naming the bad value; std::bad_alloc
   */
  explicit block_cache(std::size_t cap_bytes,
                       std::size_t max_block_bytes = 0,
                       std::size_t record_slots    = 0,
                       stream_markers markers      = {},
                       std::uint64_t stale_after_ns = 0);
  /// @brief Drops the bookkeeping and destroys the markers. Blocks still cached or parked are NOT
  /// freed (no CUDA here): the owner releases them first. No thread may be inside another call
  /// of this cache.
  ~block_cache();
  block_cache(block_cache const&)            = delete;
  block_cache& operator=(block_cache const&) = delete;
  block_cache(block_cache&&)                 = delete;
  block_cache& operator=(block_cache&&)      = delete;

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
   * miss: the class is empty, or the size is not cacheable). The block is recorded as handed
   * out again. Lock-free except for the stream's own bucket lock.
   */
  [[nodiscard]] void* take(stream_key stream, std::size_t bytes) noexcept;

  /**
   * @brief Records `ptr`, which the owner just allocated from the pool with
   * `class_size(bytes)` bytes, as handed out, so that its free may be cached.
   * A graph's note near the pointer's slot gives way when no slot there is empty (rule 1).
   * @return false when the record has no room near the pointer's slot (or the pointer is not
   * 256-byte aligned): the block is untracked and its free must go to the pool. Never throws.
   */
  [[nodiscard]] bool record(void* ptr, std::size_t bytes) noexcept;

  /**
   * @brief Notes that `ptr` is a graph's allocation (made inside a stream capture), so that its
   * frees, which come back at every launch, are recognised without asking the driver: `put`
   * answers `put_status::graph` and never caches it. Nothing is allocated; a pointer the record
   * has no room for is simply not noted. A later `record` of the same address (the pool
   * handed it out) replaces the note, and a `record` of another address that finds no empty
   * slot may take the note's (rule 1): the graph's frees are then `not_recorded`.
   */
  void record_graph(void* ptr) noexcept;

  /**
   * @brief Drops the record of a handed-out block (or a graph note) the owner gives to the pool
   * itself (a free made inside a stream capture). False if the record does not hold it so.
   */
  bool forget(void* ptr) noexcept;

  /**
   * @brief For a block the owner frees to the pool itself, never into the cache (a free made
   * inside a stream capture, or on a stream it cannot key): the record's word on it, as `put`
   * would give it. `refused`: the record held it as handed out at the class `bytes` names and
   * has let it go, and `graph`: a graph's allocation, whose note has gone; the caller frees
   * either to the pool (and may `record` / `record_graph` it again if that free fails).
   * `already_cached` (cached or parked: a second free) and `wrong_size` change nothing and the
   * caller frees nothing; `not_recorded`: the record knows nothing of it.
   */
  [[nodiscard]] put_result unrecord(void* ptr, std::size_t bytes) noexcept;

  /// @brief The class bytes the record holds for `ptr` (handed out, cached or parked), or 0.
  [[nodiscard]] std::size_t recorded_bytes(void const* ptr) const noexcept;

  /**
   * @brief Offers a block freed on `stream` to the cache; `bytes` is the size the caller says it
   * was requested with, `handle` the stream as the owner's markers know it. See `put_status` for
   * the answers: only `refused` and `uncacheable` leave the block with the caller to free to the
   * pool (and `refused` also drops its record); the others change nothing.
   */
  [[nodiscard]] put_result put(stream_key stream,
                               void* ptr,
                               std::size_t bytes,
                               void* handle = nullptr) noexcept;

  /**
   * @brief After a refused put: answers true once `pressure_window` refusals for the cap (not
   * for an unmarkable stream or no host memory) came since it last did and the epoch is
   * `stale_after_ns` old, when the owner should ask for a stale reclaim (`detach_stale`).
   * Refusals in a younger epoch wait for it to age.
   */
  [[nodiscard]] bool note_pressure() noexcept;

  // ---- leaving for the pool ------------------------------------------------------------------

  /**
   * @brief Moves every cached block out of reach of `take` ("parks" it), each bucket once its
   * release is ordered (see "Markers"); parked blocks stay charged against the cap and recorded
   * until `free_parked` frees them. A bucket whose earlier parked blocks are not freed yet keeps
   * its cached ones (rule 3). Returns how many blocks were parked now.
   */
  std::size_t detach_all() noexcept;
  /**
   * @brief Parks the blocks, and returns the idle credit, of every bucket not used since the
   * previous call (see "Dead and idle streams"), recycles the buckets that become empty, and
   * starts a new epoch. Returns how many blocks were parked now.
   */
  std::size_t detach_stale() noexcept;
  /**
   * @brief The value returned covers every block parked before this call (each parked after its
   * release was ordered: see "Markers"), for `free_parked`.
   */
  [[nodiscard]] std::uint64_t begin_proof() noexcept;
  /**
   * @brief Frees the blocks parked before the `begin_proof` that returned `proven`:
   * `f(stream_key, void* ptr, std::size_t class_bytes)` once per block, with no lock of the
   * cache held; their record is dropped first and their charge returns to the budget once `f`
   * freed them. `f` must not throw; it returns void (always freed) or a bool: false says the
   * free failed, and the block goes back to the cache, recorded and charged, parked for the
   * next release (a block `drain_stream` could not free goes back among its stream's cached
   * blocks). Returns how many blocks `f` received.
   */
  template <class F>
  std::size_t free_parked(std::uint64_t proven, F&& f) noexcept
  {
    static_assert(callback<F>, "free_parked's callback must be noexcept (a throw would lose blocks)");
    return free_parked_impl(false, proven, 0, &call<std::remove_reference_t<F>>, erase(f));
  }
  /**
   * @brief Frees the cached blocks of one stream, for the owner to give to the pool in that
   * stream's order (no synchronization needed while the stream is alive): `f` as for
   * `free_parked`. Returns how many blocks `f` received.
   */
  template <class F>
  std::size_t drain_stream(stream_key stream, F&& f) noexcept
  {
    static_assert(callback<F>, "drain_stream's callback must be noexcept");
    return free_parked_impl(true, 0, stream, &call<std::remove_reference_t<F>>, erase(f));
  }

  /**
   * @brief A release as the owner makes it: `detach_all`, then every parked block to `f` (as
   * `free_parked` under a proof begun after the park), all under one hold of the cache's
   * release lock, which `reclaim_stale` takes too. So no block is parked outside a hold: this
   * parks every cached block whose release can be ordered, and when it returns, every block
   * parked before it began has been given to an `f`, this call's or one that ended before it.
   * (The owner's wait for its release stream after this then covers them all.) A thread that
   * finds the lock held waits in a `blocking_region`: the holder's `f` makes driver calls that
   * may wait for the device. `f` as for `free_parked`, except that it runs under the release
   * lock: it must not call `release` or `reclaim_stale`. Returns how many blocks `f` received.
   */
  template <class F>
  std::size_t release(F&& f) noexcept
  {
    static_assert(callback<F>, "release's callback must be noexcept");
    return release_impl(false, &call<std::remove_reference_t<F>>, erase(f));
  }
  /**
   * @brief The background reclaim as the owner makes it: `detach_stale`, then what it parked to
   * `f`, under the same hold as `release`. Returns how many blocks `f` received.
   */
  template <class F>
  std::size_t reclaim_stale(F&& f) noexcept
  {
    static_assert(callback<F>, "reclaim_stale's callback must be noexcept");
    return release_impl(true, &call<std::remove_reference_t<F>>, erase(f));
  }

  // ---- statistics ------------------------------------------------------------------------------

  /// @brief Bytes of cached blocks now (class sizes); sums the buckets under their locks.
  [[nodiscard]] std::size_t bytes() const noexcept;
  /// @brief Blocks cached or parked now (what a release would free).
  [[nodiscard]] std::size_t held_blocks() const noexcept;
  /// @brief All counters (see `front_cache_stats`); sums the buckets under their locks.
  [[nodiscard]] front_cache_stats stats() const noexcept;
  /// @brief Restarts `charged_high` from the bytes charged now.
  void reset_peaks() noexcept;
  /**
   * @brief For tests and debugging: locks every bucket at once and checks that the buckets'
   * charges plus the global budget equal the cap, that each bucket's counts match its lists,
   * and that every cached or parked block is recorded as such.
   * @return the exact bytes cached at that instant (<= cap)
   * @throws std::logic_error naming the broken invariant
   */
  [[nodiscard]] std::size_t check_invariants() const;

  [[nodiscard]] std::size_t cap() const noexcept { return cap_; }
  /// @brief Bytes charged against the cap now (`front_cache_stats::charged_bytes`), with no lock.
  [[nodiscard]] std::size_t charged_bytes() const noexcept
  {
    return cap_ - available_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t max_block() const noexcept { return max_block_; }
  /// @brief The most credit a bucket reserves from the global budget at a time, bytes.
  [[nodiscard]] std::size_t chunk() const noexcept { return chunk_; }
  /// @brief Slots of the ownership record.
  [[nodiscard]] std::size_t record_slots() const noexcept { return slot_mask_ + 1; }
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
  using drain_fn = bool (*)(void* ctx, stream_key, void*, std::size_t) noexcept;

  // A callback of the way out: noexcept, returning void (the free always works) or a bool.
  template <class F>
  static constexpr bool callback =
    std::is_nothrow_invocable_r_v<bool, F&, stream_key, void*, std::size_t> ||
    (std::is_nothrow_invocable_v<F&, stream_key, void*, std::size_t> &&
     std::is_void_v<std::invoke_result_t<F&, stream_key, void*, std::size_t>>);

  template <class F>
  static bool call(void* ctx, stream_key k, void* p, std::size_t n) noexcept
  {
    auto& f = *static_cast<F*>(ctx);  // F keeps the callback's constness
    if constexpr (std::is_void_v<std::invoke_result_t<F&, stream_key, void*, std::size_t>>) {
      f(k, p, n);
      return true;
    } else {
      return static_cast<bool>(f(k, p, n));
    }
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

  // The ownership record (the ownership record, src/block_cache.cpp).
  [[nodiscard]] std::atomic<std::uint64_t>* find_slot(void const* ptr) const noexcept;
  /// The slot holding `ptr`'s record and the value read there in the same load (a second load
  /// could find another block's record: the slot may be freed and reused in between), or
  /// {nullptr, 0}.
  struct record_view {
    std::atomic<std::uint64_t>* slot;
    std::uint64_t value;
  };
  [[nodiscard]] record_view find_record(void const* ptr) const noexcept;
  /// Claims a slot of the record for `value` (near `address`'s home); nullptr when none is free.
  [[nodiscard]] std::atomic<std::uint64_t>* claim_slot(std::uint64_t address, std::uint64_t value,
                                                       bool over_notes) noexcept;

  bucket* find(stream_key stream) noexcept;
  bucket* find_slow(stream_key stream) noexcept;
  bucket* spare_or_new(stream_key stream) noexcept;
  bool reserve(bucket& b, std::size_t need) noexcept;
  [[nodiscard]] bool epoch_younger_than_stale() const noexcept;
  void give_back_excess(bucket& b) noexcept;
  void reclaim_idle_credit(bucket const* except) noexcept;
  std::size_t park(bucket& b) noexcept;
  void unbind(bucket& b) noexcept;
  void retire(bucket& b) noexcept;  // unbinds b and files it with the spares
  std::size_t free_parked_impl(bool one, std::uint64_t proven, stream_key stream, drain_fn f,
                               void* ctx) noexcept;
  std::size_t release_impl(bool stale, drain_fn f, void* ctx) noexcept;

  std::size_t cap_;
  std::size_t max_block_;
  std::size_t chunk_;
  std::uint64_t id_;
  stream_markers markers_;

  alignas(64) std::atomic<std::size_t> available_;  // the global budget, bytes
  std::atomic<std::size_t> charged_high_;

  // Read on every take and put (a line nobody writes on the hit path); advanced by
  // detach_stale.
  alignas(64) std::atomic<std::uint64_t> epoch_{1};
  std::atomic<std::uint64_t> epoch_began_ns_{0};  // steady clock, set with each epoch
  std::uint64_t stale_after_ns_{0};
  std::atomic<std::uint64_t> proof_{1};  // begin_proof's counter (see park / free_parked)

  alignas(64) std::atomic<std::uint64_t> refusals_{0};
  std::atomic<std::uint64_t> refused_since_hint_{0};
  std::atomic<std::size_t> recorded_{0};
  std::atomic<std::uint64_t> untracked_{0};
  // Refusals for no host memory that found no bucket to count them in (refused_no_memory).
  std::atomic<std::uint64_t> bucketless_no_memory_{0};
  std::atomic<std::uint64_t> reclaims_{0};
  std::atomic<std::uint64_t> reclaimed_blocks_{0};

  // The ownership record: slot_mask_ + 1 slots of (pointer | class index | cached bit).
  std::unique_ptr<std::atomic<std::uint64_t>[]> slots_;
  std::size_t slot_mask_{0};

  std::mutex releases_;  // held by release / reclaim_stale from their park to their last free

  alignas(64) mutable spin_lock registry_lock_;
  std::unordered_map<stream_key, bucket*> by_key_;
  std::vector<std::unique_ptr<bucket>> buckets_;  // never shrinks while the cache lives
  std::vector<bucket*> spare_;                    // emptied stale buckets, reused first
  std::size_t recycle_cursor_{0};
};

}  // namespace asyncmr::detail

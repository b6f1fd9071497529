/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The block cache (detail/block_cache.hpp): its bucket and block lists, the ownership record, the
// lookup, budget and hot path, and the way out to the pool with the statistics.

#include <asyncmr/detail/block_cache.hpp>

#include <asyncmr/detail/blocking.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace asyncmr::detail {

namespace {

struct lock_scope {
  explicit lock_scope(spin_lock& l) noexcept : lock{l} { lock.lock(); }
  ~lock_scope() { lock.unlock(); }
  lock_scope(lock_scope const&)            = delete;
  lock_scope& operator=(lock_scope const&) = delete;
  spin_lock& lock;
};

/// Allocates whole cache lines: the block lists of two streams' buckets never share a line (a
/// list of a few pointers from plain malloc would sit next to another stream's, and every put
/// writes into it: false sharing between threads that otherwise touch nothing in common).
template <class T>
struct line_allocator {
  using value_type                  = T;
  static constexpr std::size_t line = 64;
  line_allocator() noexcept         = default;
  template <class U>
  line_allocator(line_allocator<U> const&) noexcept
  {
  }
  [[nodiscard]] T* allocate(std::size_t n)
  {
    return static_cast<T*>(::operator new(rounded(n), std::align_val_t{line}));
  }
  void deallocate(T* p, std::size_t n) noexcept
  {
    ::operator delete(p, rounded(n), std::align_val_t{line});
  }
  static std::size_t rounded(std::size_t n) noexcept
  {
    return (n * sizeof(T) + line - 1) / line * line;
  }
  template <class U>
  bool operator==(line_allocator<U> const&) const noexcept
  {
    return true;
  }
};

// A cached block is listed by its slot in the ownership record (the slot holds its address and
// class), so a hit reads the address and marks it handed out with no search of the record.
using record_slot = std::atomic<std::uint64_t>;
using block_list  = std::vector<record_slot*, line_allocator<record_slot*>>;
using block_lists = std::array<block_list, block_cache::class_count>;

// ---- the ownership record's slots -----------------------------------------------------------
//
// An open-addressing table of 64-bit slots: 0 is empty, anything else is a block's address
// (256-byte aligned, as every CUDA pool allocation is) with its class index in bits 1-7 and bit
// 0 set while the block is cached or parked. A pointer lives in one of the `probe` slots
// starting at the first slot of its home cache line; a block that finds them all taken by other
// blocks is not recorded (and so never cached); a graph's note there gives way to it. Slots
// change by compare-and-swap, so records of different blocks never interfere; the few blocks a
// thread recycles keep their lines in its core.

inline constexpr std::uint64_t cached_bit   = 1;
inline constexpr std::uint64_t class_shift  = 1;
inline constexpr std::uint64_t class_mask   = 0x7f;
inline constexpr std::uint64_t address_mask = ~std::uint64_t{0xff};
inline constexpr std::size_t probe          = 16;  // two cache lines of 8 slots
inline constexpr std::size_t graph_class    = class_mask;  // marks a graph's allocation, not a class
static_assert(block_cache::class_count <= graph_class);

// The epoch's clock (block_cache::stale_after_ns): steady, nanoseconds.
inline std::uint64_t steady_ns() noexcept
{
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      std::chrono::steady_clock::now().time_since_epoch())
                                      .count());
}

inline std::uint64_t address_of(void const* p) noexcept
{
  return reinterpret_cast<std::uintptr_t>(p);
}

inline std::size_t home_slot(std::uint64_t address, std::size_t mask) noexcept
{
  std::uint64_t const h = (address >> 8) * 0x9E3779B97F4A7C15ULL;
  return static_cast<std::size_t>(h >> 20) & mask & ~std::size_t{7};
}

inline std::size_t class_of(std::uint64_t slot) noexcept
{
  return (slot >> class_shift) & class_mask;
}

inline std::uint64_t slot_value(void const* p, std::size_t cls, bool cached) noexcept
{
  return address_of(p) | (std::uint64_t{cls} << class_shift) | (cached ? cached_bit : 0);
}

inline void* address_in(std::uint64_t slot) noexcept
{
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(slot & address_mask));
}

inline std::size_t record_size(std::size_t cap, std::size_t requested)
{
  std::size_t want =
    requested != 0 ? requested : std::clamp<std::size_t>(cap >> 10, 4096, 1 << 20);
  want             = std::max<std::size_t>(want, 1024);
  std::size_t n    = 1024;
  while (n < want) { n <<= 1; }
  return n;
}

inline constexpr auto class_table = [] {
  std::array<std::size_t, block_cache::class_count> t{};
  for (std::size_t i = 0; i < t.size(); ++i) { t[i] = block_cache::class_bytes(i); }
  return t;
}();

}  // namespace

struct alignas(64) block_cache::bucket {
  // Guarded by `lock`. `key` and `bound` change under both `lock` and the registry lock (when a
  // bucket is bound to a stream, or unbound for reuse).
  spin_lock lock;
  stream_key key{};
  bool bound{false};
  std::size_t cached{};  // bytes of blocks in `free`, at class size
  std::size_t blocks{};
  std::size_t credit{};  // bytes reserved from the global budget and not used by a block
  std::size_t grant{};   // credit the next reservation asks for (doubles up to chunk_)
  std::size_t parked_bytes{};
  std::size_t parked_blocks{};
  std::size_t freeing{};  // bytes of blocks handed to a free callback now, charged until it returns
  std::uint64_t parked_proof{};  // proof_ as read after the last park (see park)
  std::uint64_t seen{};          // epoch of the last take or put
  std::uint64_t hits{};
  std::uint64_t misses{};
  std::uint64_t refused_cap{};
  std::uint64_t refused_uncacheable{};
  std::uint64_t refused_not_recorded{};
  std::uint64_t refused_wrong_size{};
  std::uint64_t refused_double_free{};
  std::uint64_t refused_unmarked{};
  std::uint64_t refused_no_memory{};
  void* marker{nullptr};  // the owner's marker of this bucket's stream (see "Markers")
  block_lists free;    // LIFO per class: the warmest block first
  block_lists parked;  // detached, their release ordered (free_parked)
};

// ---- the lock, the lookup, the budget and the hot path ------------------------------------------

// ---- the lock -------------------------------------------------------------------------------

void spin_lock::lock_slow() noexcept
{
  for (;;) {
    // Critical sections are a few dozen instructions: a short spin usually wins; after that the
    // holder is probably descheduled, so give it the core.
    for (int i = 0; i < 64; ++i) {
      if (!locked_.load(std::memory_order_relaxed) &&
          !locked_.exchange(true, std::memory_order_acquire)) {
        return;
      }
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      asm volatile("yield");
#endif
    }
    std::this_thread::yield();
  }
}

// ---- the thread-local lookup ----------------------------------------------------------------

namespace {

// A bucket pointer is trusted only together with the id of the cache it came from; ids are never
// reused, so an entry of a destroyed cache can never match again.
struct tls_entry {
  std::uint64_t cache_id;
  stream_key key;
  void* bucket;
};

constexpr unsigned tls_slots = 16;  // a thread meeting more (cache, stream) pairs pays a lock
constexpr unsigned tls_ways  = 4;   // entries probed per lookup

struct tls_table {
  std::array<tls_entry, tls_slots> entries;
  unsigned next_victim;
};

// Trivially constructible and destructible: no guard or TLS wrapper on access, nothing to run
// at thread exit.
thread_local constinit tls_table t_lookup{};

std::atomic<std::uint64_t> next_cache_id{1};  // 0 marks an empty tls_entry

unsigned first_tls_slot(std::uint64_t cache_id, stream_key key) noexcept
{
  std::uint64_t const h = (key ^ (cache_id * 0x9E3779B97F4A7C15ULL)) * 0xBF58476D1CE4E5B9ULL;
  return static_cast<unsigned>(h >> 60);  // 16 slots
}

void forget_entry(std::uint64_t cache_id, stream_key key) noexcept
{
  unsigned const s = first_tls_slot(cache_id, key);
  for (unsigned w = 0; w < tls_ways; ++w) {
    auto& e = t_lookup.entries[(s + w) % tls_slots];
    if (e.cache_id == cache_id && e.key == key) { e = tls_entry{}; }
  }
}

// Beyond this many buckets an empty bound one is reused before a new one is made, so a program
// that creates and destroys streams forever (stream ids are never reused) does not grow the
// registry forever.
constexpr std::size_t recycle_after = 64;
constexpr std::size_t recycle_scan  = 64;  // buckets one lookup inspects for reuse

std::size_t largest_class_at_most(std::size_t bytes) noexcept
{
  std::size_t i = block_cache::class_index(bytes);
  if (block_cache::class_bytes(i) > bytes) { --i; }
  return block_cache::class_bytes(i);
}

}  // namespace

// ---- construction ---------------------------------------------------------------------------

block_cache::block_cache(std::size_t cap_bytes,
                         std::size_t max_block_bytes,
                         std::size_t record_slots,
                         stream_markers markers,
                         std::uint64_t stale_after_ns)
  : cap_{cap_bytes},
    id_{next_cache_id.fetch_add(1, std::memory_order_relaxed)},
    markers_{markers},
    epoch_began_ns_{steady_ns()},
    stale_after_ns_{stale_after_ns}
{
  if (cap_bytes == 0) {
    throw std::invalid_argument{
      "asyncmr: a front cache cap of 0 bytes means no cache; construct none"};
  }
  if (cap_bytes < min_class_bytes || cap_bytes > max_cap) {
    throw std::invalid_argument{"asyncmr: front cache cap " + std::to_string(cap_bytes) +
                                " bytes is outside [256 B, 1 PiB]"};
  }
  if (max_block_bytes == 0) {
    max_block_bytes = std::max(min_class_bytes, std::min(default_max_block, cap_bytes / 8));
  } else if (max_block_bytes < min_class_bytes || max_block_bytes > max_block_limit ||
             max_block_bytes > cap_bytes) {
    throw std::invalid_argument{"asyncmr: front cache max_block " +
                                std::to_string(max_block_bytes) + " bytes is outside [256 B, " +
                                "min(cap = " + std::to_string(cap_bytes) + " B, 64 MiB)]"};
  }
  if (record_slots > (std::size_t{1} << 30)) {
    throw std::invalid_argument{"asyncmr: front cache record of " + std::to_string(record_slots) +
                                " slots is above 2^30"};
  }
  max_block_ = largest_class_at_most(max_block_bytes);
  chunk_     = std::clamp(cap_bytes / 16, min_class_bytes, default_max_block);
  available_.store(cap_bytes, std::memory_order_relaxed);
  charged_high_.store(0, std::memory_order_relaxed);
  std::size_t const n = record_size(cap_bytes, record_slots);
  slots_.reset(new std::atomic<std::uint64_t>[n]);
  for (std::size_t i = 0; i < n; ++i) { slots_[i].store(0, std::memory_order_relaxed); }
  slot_mask_ = n - 1;
}

block_cache::~block_cache()
{
  if (markers_.destroy == nullptr) { return; }
  for (auto const& b : buckets_) {
    if (b->marker != nullptr) { markers_.destroy(markers_.context, b->marker); }
  }
}

// ---- lookup ---------------------------------------------------------------------------------

block_cache::bucket* block_cache::find(stream_key stream) noexcept
{
  unsigned const s = first_tls_slot(id_, stream);
  for (unsigned w = 0; w < tls_ways; ++w) {
    auto const& e = t_lookup.entries[(s + w) % tls_slots];
    if (e.cache_id == id_ && e.key == stream) { return static_cast<bucket*>(e.bucket); }
  }
  return find_slow(stream);
}

block_cache::bucket* block_cache::spare_or_new(stream_key stream) noexcept
{
  // Caller holds the registry lock. Lock order registry -> bucket holds everywhere; nobody waits
  // for the registry while holding a bucket.
  bucket* b = nullptr;
  if (!spare_.empty()) {
    b = spare_.back();
    spare_.pop_back();
  } else if (buckets_.size() >= recycle_after) {
    for (std::size_t n = 0; n < recycle_scan && b == nullptr; ++n) {
      bucket* const c = buckets_[recycle_cursor_++ % buckets_.size()].get();
      lock_scope const g{c->lock};
      if (c->bound && c->blocks == 0 && c->parked_blocks == 0) {
        unbind(*c);
        b = c;
      }
    }
  }
  if (b == nullptr) {
    try {
      buckets_.reserve(buckets_.size() + 1);
      spare_.reserve(buckets_.size() + 1);  // so unbinding a bucket never allocates
      buckets_.push_back(std::make_unique<bucket>());
    } catch (...) {
      return nullptr;  // out of host memory: a miss / a refusal
    }
    b = buckets_.back().get();
  }
  lock_scope const g{b->lock};
  b->key   = stream;
  b->bound = true;
  b->grant = 0;
  b->seen  = epoch_.load(std::memory_order_relaxed);
  return b;
}

void block_cache::unbind(bucket& b) noexcept
{
  // Caller holds the registry lock and b.lock; b holds no block.
  by_key_.erase(b.key);
  available_.fetch_add(b.credit, std::memory_order_relaxed);
  b.credit = 0;
  b.grant  = 0;
  b.bound  = false;
}

void block_cache::retire(bucket& b) noexcept
{
  // Caller holds the registry lock and b.lock; b holds no block.
  unbind(b);
  spare_.push_back(&b);  // spare_ holds room for every bucket (reserved as one is made)
}

block_cache::bucket* block_cache::find_slow(stream_key stream) noexcept
{
  bucket* found = nullptr;
  {
    lock_scope const registry{registry_lock_};
    if (auto const it = by_key_.find(stream); it != by_key_.end()) {
      found = it->second;
    } else {
      // The map's entry first, a bucket bound to the stream only after: once bound, another
      // thread whose own table still names that bucket for this stream (from before it went
      // idle and to the spares) may put a block into it, so nothing may fail and unbind it
      // after that. Out of host memory: a miss / a refusal (rule 5), nothing bound.
      decltype(by_key_)::iterator entry;
      try {
        by_key_.reserve(by_key_.size() + 1);
        entry = by_key_.try_emplace(stream, nullptr).first;
      } catch (...) {
        return nullptr;
      }
      found = spare_or_new(stream);  // allocates nothing once a bucket exists to bind
      if (found == nullptr) {
        by_key_.erase(entry);
        return nullptr;
      }
      entry->second = found;
    }
  }
  unsigned const s = first_tls_slot(id_, stream);
  auto& table      = t_lookup;
  auto& victim     = table.entries[(s + table.next_victim++ % tls_ways) % tls_slots];
  victim           = tls_entry{id_, stream, found};
  return found;
}

namespace {

// Finds and locks the bound bucket of `stream`, or nullptr (out of host memory). A
// thread-local entry may point to a bucket since unbound or bound to another stream: the key,
// checked under the bucket's lock, tells.
template <class Bucket, class Find>
Bucket* lock_bucket(std::uint64_t cache_id, stream_key stream, Find&& find) noexcept
{
  for (;;) {
    Bucket* b = find(stream);
    if (b == nullptr) { return b; }
    b->lock.lock();
    if (b->bound && b->key == stream) { return b; }
    b->lock.unlock();
    forget_entry(cache_id, stream);
  }
}

}  // namespace

// ---- the budget -----------------------------------------------------------------------------

bool block_cache::reserve(bucket& b, std::size_t need) noexcept
{
  std::size_t const missing = need - b.credit;
  std::size_t const want    = std::max(missing, b.grant);
  std::size_t cur           = available_.load(std::memory_order_relaxed);
  std::size_t got           = 0;
  do {
    if (cur < missing) { return false; }
    got = std::min(cur, want);
  } while (!available_.compare_exchange_weak(cur, cur - got, std::memory_order_relaxed));
  b.credit += got;
  b.grant = std::min(chunk_, std::max(2 * b.grant, min_class_bytes));
  std::size_t const charged = cap_ - (cur - got);
  std::size_t high          = charged_high_.load(std::memory_order_relaxed);
  while (high < charged &&
         !charged_high_.compare_exchange_weak(high, charged, std::memory_order_relaxed)) {}
  return true;
}

void block_cache::give_back_excess(bucket& b) noexcept
{
  std::size_t const keep = std::max(2 * b.grant, min_class_bytes);
  if (b.credit > keep) {
    std::size_t const excess = b.credit - b.grant;
    b.credit -= excess;
    available_.fetch_add(excess, std::memory_order_relaxed);
  }
}

void block_cache::reclaim_idle_credit(bucket const* except) noexcept
{
  // try_lock: a busy bucket is in use anyway.
  lock_scope const registry{registry_lock_};
  for (auto const& b : buckets_) {
    if (b.get() == except || !b->lock.try_lock()) { continue; }
    available_.fetch_add(b->credit, std::memory_order_relaxed);
    b->credit = 0;
    b->lock.unlock();
  }
}

// ---- the hot path ---------------------------------------------------------------------------

void* block_cache::take(stream_key stream, std::size_t bytes) noexcept
{
  auto const find_ = [this](stream_key k) { return find(k); };
  bucket* const b  = lock_bucket<bucket>(id_, stream, find_);
  if (b == nullptr) { return nullptr; }
  b->seen = epoch_.load(std::memory_order_relaxed);
  if (bytes == 0 || bytes > max_block_) {
    ++b->misses;
    b->lock.unlock();
    return nullptr;
  }
  std::size_t const idx = class_index(bytes);
  auto& list            = b->free[idx];
  if (list.empty()) {
    ++b->misses;
    b->lock.unlock();
    return nullptr;
  }
  record_slot* const slot = list.back();
  list.pop_back();
  std::size_t const c = class_table[idx];
  b->cached -= c;
  --b->blocks;
  b->credit += c;
  ++b->hits;
  give_back_excess(*b);
  // Handed out again. Only this bucket lists the block, and its lock is held: a plain store.
  std::uint64_t const v = slot->load(std::memory_order_acquire);
  slot->store(v & ~cached_bit, std::memory_order_release);
  b->lock.unlock();
  return address_in(v);
}

put_result block_cache::put(stream_key stream, void* ptr, std::size_t bytes, void* handle) noexcept
{
  if (ptr == nullptr || bytes == 0 || bytes > max_block_) {
    auto const [slot, v] = ptr == nullptr ? record_view{nullptr, 0} : find_record(ptr);
    if (slot != nullptr && class_of(v) == graph_class) { return {put_status::graph, 0}; }
    // A recorded block freed with an uncacheable size: the record knows better (a cached one is
    // a second free, whatever size it names).
    std::size_t const rec = slot == nullptr ? 0 : class_bytes(class_of(v));
    bool const twice      = slot != nullptr && (v & cached_bit) != 0;
    if (auto* const b = lock_bucket<bucket>(id_, stream, [this](stream_key k) { return find(k); })) {
      ++(twice ? b->refused_double_free
               : rec != 0 ? b->refused_wrong_size : b->refused_uncacheable);
      b->lock.unlock();
    }
    return {twice ? put_status::already_cached
                  : rec != 0 ? put_status::wrong_size : put_status::uncacheable,
            rec};
  }
  std::size_t const idx = class_index(bytes);
  std::size_t const c   = class_table[idx];
  auto const [slot, v]  = find_record(ptr);  // one load: the slot may change under us
  if (slot != nullptr && class_of(v) == graph_class) { return {put_status::graph, 0}; }
  auto const find_      = [this](stream_key k) { return find(k); };
  bucket* b             = lock_bucket<bucket>(id_, stream, find_);
  if (b == nullptr) {
    // No bucket (no host memory): the block goes to the pool, so the record answers and lets
    // go of it as for a free that bypasses the cache (a second free and a wrong size refused).
    put_result const r = unrecord(ptr, bytes);
    if (r.status == put_status::refused) {
      bucketless_no_memory_.fetch_add(1, std::memory_order_relaxed);
    }
    return r;
  }
  b->seen = epoch_.load(std::memory_order_relaxed);
  if (slot == nullptr) {
    ++b->refused_not_recorded;
    b->lock.unlock();
    return {put_status::not_recorded, 0};
  }
  std::size_t const rec = class_table[class_of(v)];
  if ((v & cached_bit) != 0) {
    ++b->refused_double_free;
    b->lock.unlock();
    return {put_status::already_cached, rec};
  }
  if (class_of(v) != idx) {
    ++b->refused_wrong_size;
    b->lock.unlock();
    return {put_status::wrong_size, rec};
  }
  auto const refuse = [&](std::uint64_t bucket::*counter) noexcept -> put_result {
    ++(b->*counter);
    b->lock.unlock();
    // Only the cap's refusals are pressure (note_pressure): an unmarkable stream or no host
    // memory says nothing of what a stale reclaim would free room for.
    if (counter == &bucket::refused_cap) {
      refused_since_hint_.fetch_add(1, std::memory_order_relaxed);
    }
    // Back to the pool: the record forgets it first. A concurrent second free that cached it
    // meanwhile wins; then the caller must not free it.
    std::uint64_t expected = v;
    if (slot->compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) {
      recorded_.fetch_sub(1, std::memory_order_relaxed);
      return {put_status::refused, rec};
    }
    return {put_status::already_cached, rec};
  };
  if (b->credit < c && !reserve(*b, c)) {
    // Idle credit of other buckets is looked for once every few refusals, not on each (a scan
    // of every bucket). Never wait for the registry while holding a bucket.
    if (refusals_.fetch_add(1, std::memory_order_relaxed) % pressure_window != 0) {
      return refuse(&bucket::refused_cap);
    }
    b->lock.unlock();
    reclaim_idle_credit(b);
    b = lock_bucket<bucket>(id_, stream, find_);
    if (b == nullptr) {  // no host memory for the bucket's lookup this time
      if (!forget(ptr)) { return {put_status::already_cached, rec}; }
      bucketless_no_memory_.fetch_add(1, std::memory_order_relaxed);
      return {put_status::refused, rec};
    }
    if (b->credit < c && !reserve(*b, c)) { return refuse(&bucket::refused_cap); }
  }
  // The stream's order, captured before the block can be seen (see "Markers"). A stream that
  // began capturing after the owner looked has its bucket's order dropped by the owner: the
  // block is cached, and the bucket waits for its stream's next put to be ordered again.
  if (markers_.mark != nullptr) {
    switch (markers_.mark(markers_.context, b->marker, handle)) {
      case mark_result::marked:
      case mark_result::capturing: break;
      case mark_result::unmarkable: return refuse(&bucket::refused_unmarked);
    }
  }
  try {
    b->free[idx].push_back(slot);
  } catch (...) {
    return refuse(&bucket::refused_no_memory);  // no host memory for the list
  }
  std::uint64_t expected = v;
  if (!slot->compare_exchange_strong(expected, v | cached_bit, std::memory_order_acq_rel)) {
    // Another thread freed the same block at the same time (a double free) and won.
    b->free[idx].pop_back();
    ++b->refused_double_free;
    b->lock.unlock();
    return {put_status::already_cached, rec};
  }
  b->credit -= c;
  b->cached += c;
  ++b->blocks;
  b->lock.unlock();
  return {put_status::cached, c};
}

bool block_cache::epoch_younger_than_stale() const noexcept
{
  if (stale_after_ns_ == 0) { return false; }
  // The start first, then the clock: read the other way round, a start stored in between is
  // later than the clock and the difference wraps to "old".
  std::uint64_t const began = epoch_began_ns_.load(std::memory_order_acquire);
  std::uint64_t const now   = steady_ns();
  return now < began || now - began < stale_after_ns_;
}

bool block_cache::note_pressure() noexcept
{
  std::uint64_t n = refused_since_hint_.load(std::memory_order_relaxed);
  if (n < pressure_window) { return false; }
  // A young epoch: its refusals stay counted, and the first one after it ages asks.
  if (epoch_younger_than_stale()) { return false; }
  return refused_since_hint_.compare_exchange_strong(n, 0, std::memory_order_relaxed);
}

// ---- the ownership record ----------------------------------------------------------------------

block_cache::record_view block_cache::find_record(void const* ptr) const noexcept
{
  std::uint64_t const a = address_of(ptr);
  if (a == 0 || (a & ~address_mask) != 0) { return {nullptr, 0}; }
  std::size_t const home = home_slot(a, slot_mask_);
  for (std::size_t i = 0; i < probe; ++i) {
    auto& slot            = slots_[(home + i) & slot_mask_];
    std::uint64_t const v = slot.load(std::memory_order_acquire);
    if ((v & address_mask) == a) { return {&slot, v}; }
  }
  return {nullptr, 0};
}

std::atomic<std::uint64_t>* block_cache::find_slot(void const* ptr) const noexcept
{
  return find_record(ptr).slot;
}

// Puts `value` into the first empty slot of `address`'s probe sequence; with `over_notes`, when
// none is empty, into a slot holding a graph's note (rule 1: a note only saves the owner a
// driver question, and a destroyed graph's notes would otherwise fill the record for good).
// False when no slot is either.
std::atomic<std::uint64_t>* block_cache::claim_slot(std::uint64_t address,
                                                    std::uint64_t value,
                                                    bool over_notes) noexcept
{
  std::size_t const home = home_slot(address, slot_mask_);
  for (std::size_t i = 0; i < probe; ++i) {
    auto& slot             = slots_[(home + i) & slot_mask_];
    std::uint64_t expected = 0;
    if (slot.load(std::memory_order_relaxed) == 0 &&
        slot.compare_exchange_strong(expected, value, std::memory_order_acq_rel)) {
      return &slot;
    }
  }
  if (!over_notes) { return nullptr; }
  for (std::size_t i = 0; i < probe; ++i) {
    auto& slot         = slots_[(home + i) & slot_mask_];
    std::uint64_t seen = slot.load(std::memory_order_relaxed);
    // Only from the exact value read: a note that another thread forgot, unrecorded or replaced
    // meanwhile is not taken from it. A note is never cached, so no bucket lists its slot.
    if ((seen == 0 || class_of(seen) == graph_class) &&
        slot.compare_exchange_strong(seen, value, std::memory_order_acq_rel)) {
      return &slot;
    }
  }
  return nullptr;
}

bool block_cache::record(void* ptr, std::size_t bytes) noexcept
{
  std::uint64_t const a = address_of(ptr);
  std::size_t const c   = class_size(bytes);
  if (a == 0 || (a & ~address_mask) != 0 || c == 0) {
    untracked_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  std::uint64_t const value = slot_value(ptr, class_index(bytes), false);
  // The pool hands out an address only once until it is freed to the pool, and the record
  // forgets a block before it goes back there; a slot still holding this address would be a
  // stale record of an address the pool reused: it is replaced.
  if (auto [stale, v] = find_record(ptr); stale != nullptr) {
    // A stale record of a cached block would mean the block went to the pool behind the
    // cache's back; its bucket still lists it, so the new hand-out stays untracked instead.
    if ((v & cached_bit) != 0 || !stale->compare_exchange_strong(v, value)) {
      untracked_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (class_of(v) == graph_class) { recorded_.fetch_add(1, std::memory_order_relaxed); }
    return true;
  }
  if (claim_slot(a, value, true) != nullptr) {
    recorded_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  untracked_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void block_cache::record_graph(void* ptr) noexcept
{
  std::uint64_t const a = address_of(ptr);
  if (a == 0 || (a & ~address_mask) != 0) { return; }
  std::uint64_t const value = slot_value(ptr, graph_class, false);
  if (auto [existing, v] = find_record(ptr); existing != nullptr) {
    // The same graph again (its address comes back), or a stale record of a block the pool
    // has handed to the graph's memory since: note the graph. Never over a cached block.
    if ((v & cached_bit) == 0 && existing->compare_exchange_strong(v, value) &&
        class_of(v) != graph_class) {
      recorded_.fetch_sub(1, std::memory_order_relaxed);
    }
    return;
  }
  // No room: simply not noted. A note never takes another note's slot: the newest graph's is
  // worth no more than an older one's, and a record's is never given up for a note.
  static_cast<void>(claim_slot(a, value, false));
}

bool block_cache::forget(void* ptr) noexcept
{
  auto [slot, v] = find_record(ptr);
  if (slot == nullptr) { return false; }
  if ((v & cached_bit) != 0 || !slot->compare_exchange_strong(v, 0, std::memory_order_acq_rel)) {
    return false;
  }
  if (class_of(v) != graph_class) { recorded_.fetch_sub(1, std::memory_order_relaxed); }
  return true;
}

put_result block_cache::unrecord(void* ptr, std::size_t bytes) noexcept
{
  auto [slot, v] = find_record(ptr);
  if (slot == nullptr) { return {put_status::not_recorded, 0}; }
  for (;;) {  // again only when another thread changed the slot meanwhile
    if ((v & address_mask) != address_of(ptr)) { return {put_status::not_recorded, 0}; }
    std::size_t const cls = class_of(v);
    if (cls == graph_class) {
      if (slot->compare_exchange_weak(v, 0, std::memory_order_acq_rel)) {
        return {put_status::graph, 0};
      }
      continue;
    }
    std::size_t const rec = class_bytes(cls);
    if ((v & cached_bit) != 0) { return {put_status::already_cached, rec}; }
    if (class_size(bytes) == 0 || class_index(bytes) != cls) {
      return {put_status::wrong_size, rec};
    }
    if (slot->compare_exchange_weak(v, 0, std::memory_order_acq_rel)) {
      recorded_.fetch_sub(1, std::memory_order_relaxed);
      return {put_status::refused, rec};
    }
  }
}

std::size_t block_cache::recorded_bytes(void const* ptr) const noexcept
{
  auto const [slot, v] = find_record(ptr);
  if (slot == nullptr) { return 0; }
  std::size_t const c = class_of(v);
  return c == graph_class ? 0 : class_bytes(c);
}

// ---- leaving for the pool, and the statistics ---------------------------------------------------

// ---- leaving for the pool -------------------------------------------------------------------

std::size_t block_cache::park(bucket& b) noexcept
{
  // Caller holds b.lock.
  std::size_t const moved = b.blocks;
  // One generation of parked blocks per bucket: while earlier ones wait for their proof, newer
  // blocks stay cached (always safe) until those are freed. Appending them would leave the
  // bucket one proof, and either the older blocks would wait for a proof newer than the one
  // their release began (a release_cache that returns with memory still parked) or the newer
  // ones would be freed under a proof begun before they were parked.
  if (moved == 0 || b.parked_blocks != 0) { return 0; }
  // The owner's later frees wait for this bucket's stream first (see "Markers"); if they cannot,
  // the blocks stay cached, which is always safe.
  if (markers_.order != nullptr && !markers_.order(markers_.context, b.marker)) {
    return 0;
  }
  b.free.swap(b.parked);  // no allocation: the lists trade their buffers (parked was empty)
  b.parked_bytes  = b.cached;
  b.parked_blocks = b.blocks;
  b.cached        = 0;
  b.blocks        = 0;
  // Read after the move (sequentially consistent with begin_proof's increment): a proof taken
  // after this read covers these blocks; one taken before does not (see free_parked_impl).
  b.parked_proof = proof_.load(std::memory_order_seq_cst);
  return moved;
}

std::size_t block_cache::detach_all() noexcept
{
  std::size_t moved = 0;
  lock_scope const registry{registry_lock_};
  for (auto const& b : buckets_) {
    lock_scope const g{b->lock};
    moved += park(*b);
    available_.fetch_add(b->credit, std::memory_order_relaxed);  // an emptied cache holds none
    b->credit = 0;
    b->grant  = 0;
  }
  return moved;
}

std::size_t block_cache::detach_stale() noexcept
{
  std::size_t moved = 0;
  lock_scope const registry{registry_lock_};
  // A request made while the epoch was old may run after another reclaim began a new one: a
  // young epoch says nothing of which streams are idle, so it is left to age.
  if (epoch_younger_than_stale()) { return 0; }
  std::uint64_t const epoch = epoch_.load(std::memory_order_relaxed);
  for (auto const& b : buckets_) {
    lock_scope const g{b->lock};
    if (!b->bound || b->seen >= epoch) { continue; }  // used during this epoch
    moved += park(*b);
    available_.fetch_add(b->credit, std::memory_order_relaxed);
    b->credit = 0;
    b->grant  = 0;
    if (b->blocks == 0 && b->parked_blocks == 0) {
      retire(*b);
    }
  }
  epoch_.store(epoch + 1, std::memory_order_relaxed);
  epoch_began_ns_.store(steady_ns(), std::memory_order_release);
  if (moved != 0) {
    reclaims_.fetch_add(1, std::memory_order_relaxed);
    reclaimed_blocks_.fetch_add(moved, std::memory_order_relaxed);
  }
  return moved;
}

std::uint64_t block_cache::begin_proof() noexcept
{
  // Blocks parked with parked_proof <= the value returned were parked (their release ordered
  // after their streams' markers) before this increment, in the single order of sequentially
  // consistent operations.
  return proof_.fetch_add(1, std::memory_order_seq_cst);
}

std::size_t block_cache::free_parked_impl(bool one,
                                          std::uint64_t proven,
                                          stream_key stream,
                                          drain_fn f,
                                          void* ctx) noexcept
{
  // One bucket at a time: its lists are swapped out under the locks, then `f` runs with no lock
  // held (it calls CUDA, and may even use this cache). Indices stay valid: buckets_ only grows.
  // The blocks stay charged to their bucket (`freeing`) while `f` runs: a block's charge returns
  // to the budget only once `f` freed it, and one whose free failed goes back to the cache still
  // charged, so the cap holds at every instant and every change of the budget is made under a
  // bucket's lock.
  std::size_t freed = 0;
  block_lists taken;  // empty vectors: constructing them allocates nothing
  for (std::size_t i = 0;; ++i) {
    stream_key key            = 0;
    bucket* from              = nullptr;
    std::uint64_t taken_proof = 0;
    std::size_t taken_bytes   = 0;
    {
      lock_scope const registry{registry_lock_};
      if (one) {
        if (i != 0) { break; }
        auto const it = by_key_.find(stream);
        if (it == by_key_.end()) { break; }
        bucket& b = *it->second;
        lock_scope const g{b.lock};
        taken.swap(b.free);
        available_.fetch_add(b.credit, std::memory_order_relaxed);
        taken_bytes = b.cached;
        b.freeing += b.cached;
        b.cached = 0;
        b.blocks = 0;
        b.credit = 0;
        key      = b.key;
        from     = &b;
      } else {
        if (i >= buckets_.size()) { break; }
        bucket& b = *buckets_[i];
        lock_scope const g{b.lock};
        if (b.parked_blocks == 0 || b.parked_proof > proven) { continue; }
        taken.swap(b.parked);
        taken_proof = b.parked_proof;
        taken_bytes = b.parked_bytes;
        b.freeing += b.parked_bytes;
        b.parked_bytes  = 0;
        b.parked_blocks = 0;
        key             = b.key;
        from            = &b;
      }
    }
    block_lists kept;  // blocks whose free failed, recorded again (allocates only then)
    std::size_t kept_bytes = 0, kept_blocks = 0;
    for (std::size_t c = 0; c < class_count; ++c) {
      for (record_slot* const slot : taken[c]) {
        // The record forgets the block before the pool can hand its address out again.
        std::uint64_t const value = slot->load(std::memory_order_acquire);
        void* const p             = address_in(value);
        slot->store(0, std::memory_order_release);
        recorded_.fetch_sub(1, std::memory_order_relaxed);
        ++freed;
        if (f(ctx, key, p, class_table[c])) { continue; }
        // Still the pool's allocation: recorded again (in its old slot when free) and kept.
        record_slot* again     = nullptr;
        std::uint64_t expected = 0;
        if (slot->compare_exchange_strong(expected, value, std::memory_order_acq_rel)) {
          again = slot;
        } else {
          again = claim_slot(address_of(p), value, true);
        }
        if (again == nullptr) {  // no room in the record: lost to the cache
          untracked_.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        recorded_.fetch_add(1, std::memory_order_relaxed);
        try {
          kept[c].push_back(again);
          kept_bytes += class_table[c];
          ++kept_blocks;
        } catch (...) {  // no host memory for the list: lost to the cache
          again->store(0, std::memory_order_release);
          recorded_.fetch_sub(1, std::memory_order_relaxed);
          untracked_.fetch_add(1, std::memory_order_relaxed);
        }
      }
      taken[c].clear();
    }
    {
      lock_scope const registry{registry_lock_};
      bucket& b = *from;
      lock_scope const g{b.lock};
      b.freeing -= taken_bytes;
      // A block its own stream could not free (drain_stream) is cached there again while the
      // bucket still serves that stream (its order on it holds); once the bucket serves another,
      // the block has no order the cache could keep, and stays out (lost, never reused wrongly).
      // Parked blocks were ordered already: they stay parked, joining a generation parked since
      // (freed under the later proof, which is never too early).
      bool const back = kept_blocks != 0 && (!one || (b.bound && b.key == key));
      if (kept_blocks != 0 && !back) {
        for (std::size_t c = 0; c < class_count; ++c) {
          for (record_slot* const slot : kept[c]) {
            slot->store(0, std::memory_order_release);
            recorded_.fetch_sub(1, std::memory_order_relaxed);
            untracked_.fetch_add(1, std::memory_order_relaxed);
          }
        }
      }
      if (back) {
        auto& lists = one ? b.free : b.parked;
        for (std::size_t c = 0; c < class_count; ++c) {
          for (record_slot* const slot : kept[c]) {
            try {
              lists[c].push_back(slot);
            } catch (...) {  // no host memory: lost to the cache
              slot->store(0, std::memory_order_release);
              recorded_.fetch_sub(1, std::memory_order_relaxed);
              untracked_.fetch_add(1, std::memory_order_relaxed);
              kept_bytes -= class_table[c];
              --kept_blocks;
            }
          }
        }
        if (one) {
          b.cached += kept_bytes;
          b.blocks += kept_blocks;
        } else {
          if (b.parked_blocks == 0) { b.parked_proof = taken_proof; }
          b.parked_bytes += kept_bytes;
          b.parked_blocks += kept_blocks;
        }
      } else {
        kept_bytes = 0;
      }
      available_.fetch_add(taken_bytes - kept_bytes, std::memory_order_relaxed);
      // A bucket a stale reclaim emptied belongs to a stream idle since before that reclaim:
      // free it for another stream now rather than at the next reclaim.
      if (!one && b.bound && b.blocks == 0 && b.parked_blocks == 0 && b.freeing == 0 &&
          b.seen + 1 < epoch_.load(std::memory_order_relaxed)) {
        retire(b);
      }
    }
  }
  return freed;
}

std::size_t block_cache::release_impl(bool stale, drain_fn f, void* ctx) noexcept
{
  std::unique_lock hold{releases_, std::try_to_lock};
  if (!hold.owns_lock()) {
    blocking_region wait;  // the holder's frees may wait for the device (see release)
    hold.lock();
  }
  // Under the hold nothing is parked (every park is freed before its hold ends), so detach_all
  // parks every cached block it can order, and a proof begun now covers all that is parked.
  std::size_t const parked = stale ? detach_stale() : detach_all();
  if (stale && parked == 0) { return 0; }
  return free_parked_impl(false, begin_proof(), 0, f, ctx);
}

// ---- statistics -----------------------------------------------------------------------------

// Both read from the one pass over the buckets that stats() makes (under the same locks).
std::size_t block_cache::bytes() const noexcept { return stats().cached_bytes; }

std::size_t block_cache::held_blocks() const noexcept
{
  auto const s = stats();
  return s.cached_blocks + s.parked_blocks;
}

front_cache_stats block_cache::stats() const noexcept
{
  front_cache_stats s{};
  lock_scope const registry{registry_lock_};
  for (auto const& b : buckets_) {
    lock_scope const g{b->lock};
    s.hits += b->hits;
    s.misses += b->misses;
    s.refused_cap += b->refused_cap;
    s.refused_uncacheable += b->refused_uncacheable;
    s.refused_not_recorded += b->refused_not_recorded;
    s.refused_wrong_size += b->refused_wrong_size;
    s.refused_double_free += b->refused_double_free;
    s.refused_unmarked += b->refused_unmarked;
    s.refused_no_memory += b->refused_no_memory;
    s.cached_bytes += b->cached;
    s.cached_blocks += b->blocks;
    s.parked_bytes += b->parked_bytes;
    s.parked_blocks += b->parked_blocks;
  }
  s.refused_no_memory += bucketless_no_memory_.load(std::memory_order_relaxed);
  s.untracked        = untracked_.load(std::memory_order_relaxed);
  s.reclaims         = reclaims_.load(std::memory_order_relaxed);
  s.reclaimed_blocks = reclaimed_blocks_.load(std::memory_order_relaxed);
  s.recorded_blocks  = recorded_.load(std::memory_order_relaxed);
  s.charged_bytes    = cap_ - available_.load(std::memory_order_relaxed);
  s.charged_high     = std::max(s.charged_bytes, charged_high_.load(std::memory_order_relaxed));
  s.streams          = by_key_.size();
  return s;
}

void block_cache::reset_peaks() noexcept
{
  charged_high_.store(cap_ - available_.load(std::memory_order_relaxed),
                      std::memory_order_relaxed);
}

std::size_t block_cache::check_invariants() const
{
  // Every change of the budget happens under some bucket's lock, so with all of them held the
  // snapshot is exact.
  lock_scope const registry{registry_lock_};
  for (auto const& b : buckets_) { b->lock.lock(); }
  std::size_t cached = 0;
  std::size_t held   = 0;
  std::string error;
  for (auto const& b : buckets_) {
    std::size_t bytes = 0, blocks = 0, pbytes = 0, pblocks = 0;
    for (std::size_t i = 0; i < class_count; ++i) {
      bytes += b->free[i].size() * class_bytes(i);
      blocks += b->free[i].size();
      pbytes += b->parked[i].size() * class_bytes(i);
      pblocks += b->parked[i].size();
      for (auto const* lists : {&b->free, &b->parked}) {
        for (record_slot const* const slot : (*lists)[i]) {
          std::uint64_t const v = slot->load();
          if ((v & cached_bit) == 0 || class_of(v) != i || find_slot(address_in(v)) != slot) {
            error = "a cached or parked block is not recorded as such at its class";
          }
        }
      }
    }
    if (bytes != b->cached || blocks != b->blocks || pbytes != b->parked_bytes ||
        pblocks != b->parked_blocks) {
      error = "a bucket's byte or block count disagrees with its lists";
    }
    if (!b->bound && (blocks != 0 || pblocks != 0 || b->credit != 0)) {
      error = "an unbound bucket holds blocks or credit";
    }
    cached += b->cached;
    held += b->cached + b->parked_bytes + b->credit + b->freeing;
  }
  std::size_t const available = available_.load(std::memory_order_relaxed);
  for (auto const& b : buckets_) { b->lock.unlock(); }
  if (held + available != cap_) { error = "bucket charges plus the global budget != cap"; }
  if (cached > cap_) { error = "cached bytes exceed the cap"; }
  if (!error.empty()) { throw std::logic_error{"asyncmr: front cache: " + error}; }
  return cached;
}

}  // namespace asyncmr::detail

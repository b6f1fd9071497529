/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include <asyncmr/detail/front_cache.hpp>

#include <algorithm>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

namespace asyncmr::detail {

// ---- the bucket lock ------------------------------------------------------------------------

void bucket_lock::lock_slow() noexcept
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

// ---- one stream's bucket --------------------------------------------------------------------

namespace {

/// Allocates whole cache lines: the block lists of two streams' buckets never share a line (a
/// list of a few pointers from plain malloc would sit next to another stream's, and every put
/// writes into it: false sharing between threads that otherwise touch nothing in common).
template <class T>
struct line_allocator {
  using value_type                = T;
  static constexpr std::size_t line = 64;
  line_allocator() noexcept       = default;
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

using block_list = std::vector<void*, line_allocator<void*>>;

}  // namespace

struct alignas(64) front_cache::bucket {
  // Everything below is guarded by `lock`; `key` is written under both `lock` and the registry
  // mutex (only when an empty bucket is recycled for another stream).
  bucket_lock lock;
  stream_key key{};
  std::size_t cached{};  // bytes of blocks in `free`, at class size
  std::size_t blocks{};
  std::size_t credit{};  // bytes reserved from the global budget and not used by a block
  std::uint64_t hits{};
  std::uint64_t misses{};
  std::uint64_t refused_cap{};
  std::uint64_t refused_uncacheable{};
  std::array<block_list, class_count> free;  // LIFO per class: the warmest block first
};

// ---- the thread-local lookup ----------------------------------------------------------------

namespace {

// A bucket pointer is trusted only together with the id of the cache it came from; ids are never
// reused, so an entry of a destroyed cache can never match again.
struct tls_entry {
  std::uint64_t cache_id;
  stream_key key;
  void* bucket;
};

constexpr unsigned tls_slots = 16;  // a thread meeting more (cache, stream) pairs pays a mutex
constexpr unsigned tls_ways  = 4;   // entries probed per lookup

struct tls_table {
  std::array<tls_entry, tls_slots> entries;
  unsigned next_victim;
};

// Trivially constructible and destructible: no guard or TLS wrapper on access, nothing to run
// at thread exit.
thread_local constinit tls_table t_lookup{};

std::atomic<std::uint64_t> next_cache_id{1};  // 0 marks an empty tls_entry

unsigned first_slot(std::uint64_t cache_id, stream_key key) noexcept
{
  std::uint64_t const h = (key ^ (cache_id * 0x9E3779B97F4A7C15ULL)) * 0xBF58476D1CE4E5B9ULL;
  return static_cast<unsigned>(h >> 60);  // 16 slots
}

void forget_entry(std::uint64_t cache_id, stream_key key) noexcept
{
  unsigned const s = first_slot(cache_id, key);
  for (unsigned w = 0; w < tls_ways; ++w) {
    auto& e = t_lookup.entries[(s + w) % tls_slots];
    if (e.cache_id == cache_id && e.key == key) { e = tls_entry{}; }
  }
}

// Buckets beyond this count are recycled from empty ones before new ones are made, so a program
// that creates and destroys streams forever (stream ids are never reused) does not grow the
// registry forever.
constexpr std::size_t recycle_after = 64;

constexpr auto class_table = [] {
  std::array<std::size_t, front_cache::class_count> t{};
  for (std::size_t i = 0; i < t.size(); ++i) { t[i] = front_cache::class_bytes(i); }
  return t;
}();

std::size_t largest_class_at_most(std::size_t bytes) noexcept
{
  std::size_t i = front_cache::class_index(bytes);
  if (front_cache::class_bytes(i) > bytes) { --i; }
  return front_cache::class_bytes(i);
}

}  // namespace

// ---- construction ---------------------------------------------------------------------------

front_cache::front_cache(std::size_t cap_bytes, std::size_t max_block_bytes)
  : cap_{cap_bytes}, id_{next_cache_id.fetch_add(1, std::memory_order_relaxed)}
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
  max_block_   = largest_class_at_most(max_block_bytes);
  chunk_       = std::clamp(cap_bytes / 16, min_class_bytes, default_max_block);
  keep_credit_ = 2 * chunk_;
  available_.store(cap_bytes, std::memory_order_relaxed);
  charged_high_.store(0, std::memory_order_relaxed);
}

front_cache::~front_cache() = default;

// ---- lookup ---------------------------------------------------------------------------------

front_cache::bucket* front_cache::find(stream_key stream) noexcept
{
  unsigned const s = first_slot(id_, stream);
  for (unsigned w = 0; w < tls_ways; ++w) {
    auto const& e = t_lookup.entries[(s + w) % tls_slots];
    if (e.cache_id == id_ && e.key == stream) { return static_cast<bucket*>(e.bucket); }
  }
  return find_slow(stream);
}

front_cache::bucket* front_cache::find_slow(stream_key stream) noexcept
{
  bucket* found = nullptr;
  try {
    std::lock_guard const registry{registry_mutex_};
    if (auto const it = by_key_.find(stream); it != by_key_.end()) {
      found = it->second;
    } else {
      by_key_.reserve(by_key_.size() + 1);  // the only throwing step before any change
      if (buckets_.size() >= recycle_after) {
        for (auto const& b : buckets_) {
          // Lock order registry -> bucket holds everywhere; nobody waits for the registry while
          // holding a bucket, so this cannot deadlock.
          b->lock.lock();
          if (b->blocks == 0) {
            by_key_.erase(b->key);
            available_.fetch_add(b->credit, std::memory_order_relaxed);
            b->credit = 0;
            b->key    = stream;
            found     = b.get();
          }
          b->lock.unlock();
          if (found != nullptr) { break; }
        }
      }
      if (found == nullptr) {
        buckets_.reserve(buckets_.size() + 1);
        auto fresh = std::make_unique<bucket>();
        fresh->key = stream;
        found      = fresh.get();
        buckets_.push_back(std::move(fresh));
      }
      by_key_.emplace(stream, found);  // cannot throw: reserved above
    }
  } catch (...) {
    return nullptr;  // out of host memory: the caller treats it as a miss / a refusal
  }
  unsigned const s = first_slot(id_, stream);
  auto& table      = t_lookup;
  auto& victim     = table.entries[(s + table.next_victim++ % tls_ways) % tls_slots];
  victim           = tls_entry{id_, stream, found};
  return found;
}

namespace {

// Finds and locks the bucket of `stream`, or nullptr (out of host memory). A thread-local
// entry may point to a bucket since recycled for another stream: the key, checked under the
// bucket's lock, tells.
template <class Find>
auto* lock_bucket(std::uint64_t cache_id, stream_key stream, Find&& find) noexcept
{
  for (;;) {
    auto* b = find(stream);
    if (b == nullptr) { return b; }
    b->lock.lock();
    if (b->key == stream) { return b; }
    b->lock.unlock();
    forget_entry(cache_id, stream);
  }
}

}  // namespace

// ---- the budget -----------------------------------------------------------------------------

bool front_cache::reserve(bucket& b, std::size_t need) noexcept
{
  std::size_t const missing = need - b.credit;
  std::size_t cur           = available_.load(std::memory_order_relaxed);
  std::size_t got           = 0;
  do {
    if (cur < missing) { return false; }
    got = std::min(cur, std::max(missing, chunk_));
  } while (!available_.compare_exchange_weak(cur, cur - got, std::memory_order_relaxed));
  b.credit += got;
  std::size_t const charged = cap_ - (cur - got);
  std::size_t high          = charged_high_.load(std::memory_order_relaxed);
  while (high < charged &&
         !charged_high_.compare_exchange_weak(high, charged, std::memory_order_relaxed)) {}
  return true;
}

void front_cache::give_back_excess(bucket& b) noexcept
{
  if (b.credit > keep_credit_) {
    std::size_t const excess = b.credit - chunk_;
    b.credit -= excess;
    available_.fetch_add(excess, std::memory_order_relaxed);
  }
}

void front_cache::reclaim_idle_credit(bucket const* except) noexcept
{
  // Reached only when a put found the global budget empty: other streams may sit on credit
  // they do not use (at most keep_credit_ each). try_lock: a busy bucket is in use anyway.
  try {
    std::lock_guard const registry{registry_mutex_};
    for (auto const& b : buckets_) {
      if (b.get() == except || !b->lock.try_lock()) { continue; }
      available_.fetch_add(b->credit, std::memory_order_relaxed);
      b->credit = 0;
      b->lock.unlock();
    }
  } catch (...) {
    // std::mutex::lock failed (system error): nothing reclaimed, the put is refused.
  }
}

// ---- the hot path ---------------------------------------------------------------------------

void* front_cache::take(stream_key stream, std::size_t bytes) noexcept
{
  auto const find_ = [this](stream_key k) { return find(k); };
  bucket* const b  = lock_bucket(id_, stream, find_);
  if (b == nullptr) { return nullptr; }
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
  void* const ptr = list.back();
  list.pop_back();
  std::size_t const c = class_table[idx];
  b->cached -= c;
  --b->blocks;
  b->credit += c;
  ++b->hits;
  give_back_excess(*b);
  b->lock.unlock();
  return ptr;
}

bool front_cache::put(stream_key stream, void* ptr, std::size_t bytes) noexcept
{
  auto const find_ = [this](stream_key k) { return find(k); };
  bucket* b        = lock_bucket(id_, stream, find_);
  if (b == nullptr) { return false; }
  if (ptr == nullptr || bytes == 0 || bytes > max_block_) {
    ++b->refused_uncacheable;
    b->lock.unlock();
    return false;
  }
  std::size_t const idx = class_index(bytes);
  std::size_t const c   = class_table[idx];
  if (b->credit < c && !reserve(*b, c)) {
    // Never wait for the registry while holding a bucket (drain and recycling lock the other
    // way round).
    b->lock.unlock();
    reclaim_idle_credit(b);
    b = lock_bucket(id_, stream, find_);
    if (b == nullptr) { return false; }
    if (b->credit < c && !reserve(*b, c)) {
      ++b->refused_cap;
      b->lock.unlock();
      return false;
    }
  }
  try {
    b->free[idx].push_back(ptr);
  } catch (...) {
    ++b->refused_cap;  // no host memory for the list: as good as full
    b->lock.unlock();
    return false;
  }
  b->credit -= c;
  b->cached += c;
  ++b->blocks;
  b->lock.unlock();
  return true;
}

// ---- drain and statistics -------------------------------------------------------------------

void front_cache::drain_impl(bool one, stream_key stream, drain_fn f, void* ctx)
{
  std::vector<bucket*> list;
  {
    std::lock_guard const registry{registry_mutex_};
    if (one) {
      if (auto const it = by_key_.find(stream); it != by_key_.end()) {
        list.push_back(it->second);
      }
    } else {
      list.reserve(buckets_.size());
      for (auto const& b : buckets_) { list.push_back(b.get()); }
    }
  }
  // Nothing below throws: a drain either happens per bucket in full or not at all.
  std::array<block_list, class_count> taken;
  for (bucket* const b : list) {
    b->lock.lock();
    if (one && b->key != stream) {  // recycled since the registry said so: nothing of ours
      b->lock.unlock();
      continue;
    }
    stream_key const key = b->key;
    for (std::size_t i = 0; i < class_count; ++i) { taken[i].swap(b->free[i]); }
    available_.fetch_add(b->cached + b->credit, std::memory_order_relaxed);
    b->cached = 0;
    b->blocks = 0;
    b->credit = 0;
    b->lock.unlock();
    // Outside the lock: f may call CUDA (a free) and may even put into this cache.
    for (std::size_t i = 0; i < class_count; ++i) {
      for (void* const p : taken[i]) { f(ctx, key, p, class_bytes(i)); }
      taken[i].clear();
    }
  }
}

std::size_t front_cache::bytes() const
{
  std::size_t total = 0;
  std::lock_guard const registry{registry_mutex_};
  for (auto const& b : buckets_) {
    b->lock.lock();
    total += b->cached;
    b->lock.unlock();
  }
  return total;
}

front_cache_stats front_cache::stats() const
{
  front_cache_stats s{};
  std::lock_guard const registry{registry_mutex_};
  for (auto const& b : buckets_) {
    b->lock.lock();
    s.hits += b->hits;
    s.misses += b->misses;
    s.refused_cap += b->refused_cap;
    s.refused_uncacheable += b->refused_uncacheable;
    s.cached_bytes += b->cached;
    s.cached_blocks += b->blocks;
    b->lock.unlock();
  }
  s.charged_bytes = cap_ - available_.load(std::memory_order_relaxed);
  s.charged_high  = std::max(s.charged_bytes, charged_high_.load(std::memory_order_relaxed));
  s.streams       = by_key_.size();
  return s;
}

void front_cache::reset_peaks() noexcept
{
  charged_high_.store(cap_ - available_.load(std::memory_order_relaxed),
                      std::memory_order_relaxed);
}

std::size_t front_cache::check_invariants() const
{
  // Every change of the budget happens under some bucket's lock, so with all of them held the
  // snapshot is exact.
  std::lock_guard const registry{registry_mutex_};
  for (auto const& b : buckets_) { b->lock.lock(); }
  std::size_t cached = 0;
  std::size_t held   = 0;
  std::string error;
  for (auto const& b : buckets_) {
    std::size_t bytes  = 0;
    std::size_t blocks = 0;
    for (std::size_t i = 0; i < class_count; ++i) {
      bytes += b->free[i].size() * class_bytes(i);
      blocks += b->free[i].size();
    }
    if (bytes != b->cached || blocks != b->blocks) {
      error = "a bucket's byte or block count disagrees with its lists";
    }
    cached += b->cached;
    held += b->cached + b->credit;
  }
  std::size_t const available = available_.load(std::memory_order_relaxed);
  for (auto const& b : buckets_) { b->lock.unlock(); }
  if (held + available != cap_) { error = "bucket charges plus the global budget != cap"; }
  if (cached > cap_) { error = "cached bytes exceed the cap"; }
  if (!error.empty()) { throw std::logic_error{"asyncmr: front cache: " + error}; }
  return cached;
}

}  // namespace asyncmr::detail

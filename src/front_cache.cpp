/*
 * SPDX-License-Identifier: Apache-2.0
 */
// The front cache's lookup, budget and hot path (the rest: front_cache_record.cpp,
// front_cache_release.cpp; the shared pieces: detail/front_cache_parts.hpp).

#include "detail/front_cache_parts.hpp"

#include <stdexcept>
#include <string>
#include <thread>

namespace asyncmr::detail {

using namespace front_cache_parts;

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
  std::size_t i = front_cache::class_index(bytes);
  if (front_cache::class_bytes(i) > bytes) { --i; }
  return front_cache::class_bytes(i);
}

}  // namespace

// ---- construction ---------------------------------------------------------------------------

front_cache::front_cache(std::size_t cap_bytes,
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

front_cache::~front_cache()
{
  if (markers_.destroy == nullptr) { return; }
  for (auto const& b : buckets_) {
    if (b->marker != nullptr) { markers_.destroy(markers_.context, b->marker); }
  }
}

// ---- lookup ---------------------------------------------------------------------------------

front_cache::bucket* front_cache::find(stream_key stream) noexcept
{
  unsigned const s = first_tls_slot(id_, stream);
  for (unsigned w = 0; w < tls_ways; ++w) {
    auto const& e = t_lookup.entries[(s + w) % tls_slots];
    if (e.cache_id == id_ && e.key == stream) { return static_cast<bucket*>(e.bucket); }
  }
  return find_slow(stream);
}

front_cache::bucket* front_cache::spare_or_new(stream_key stream) noexcept
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

void front_cache::unbind(bucket& b) noexcept
{
  // Caller holds the registry lock and b.lock; b holds no block.
  by_key_.erase(b.key);
  available_.fetch_add(b.credit, std::memory_order_relaxed);
  b.credit = 0;
  b.grant  = 0;
  b.bound  = false;
}

void front_cache::retire(bucket& b) noexcept
{
  // Caller holds the registry lock and b.lock; b holds no block.
  unbind(b);
  spare_.push_back(&b);  // spare_ holds room for every bucket (reserved as one is made)
}

front_cache::bucket* front_cache::find_slow(stream_key stream) noexcept
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

bool front_cache::reserve(bucket& b, std::size_t need) noexcept
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

void front_cache::give_back_excess(bucket& b) noexcept
{
  std::size_t const keep = std::max(2 * b.grant, min_class_bytes);
  if (b.credit > keep) {
    std::size_t const excess = b.credit - b.grant;
    b.credit -= excess;
    available_.fetch_add(excess, std::memory_order_relaxed);
  }
}

void front_cache::reclaim_idle_credit(bucket const* except) noexcept
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

void* front_cache::take(stream_key stream, std::size_t bytes) noexcept
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

put_result front_cache::put(stream_key stream, void* ptr, std::size_t bytes, void* handle) noexcept
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
    if (counter != nullptr) { ++(b->*counter); }
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
  // The stream's order, captured before the block can be seen (see "Markers"). A capturing
  // stream's free is the graph's: it goes to the pool, as a free that bypasses the cache.
  if (markers_.mark != nullptr) {
    switch (markers_.mark(markers_.context, b->marker, handle)) {
      case mark_result::marked: break;
      case mark_result::unmarkable: return refuse(&bucket::refused_unmarked);
      case mark_result::capturing: return refuse(nullptr);
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

bool front_cache::epoch_younger_than_stale() const noexcept
{
  if (stale_after_ns_ == 0) { return false; }
  // The start first, then the clock: read the other way round, a start stored in between is
  // later than the clock and the difference wraps to "old".
  std::uint64_t const began = epoch_began_ns_.load(std::memory_order_acquire);
  std::uint64_t const now   = steady_ns();
  return now < began || now - began < stale_after_ns_;
}

bool front_cache::note_pressure() noexcept
{
  std::uint64_t n = refused_since_hint_.load(std::memory_order_relaxed);
  if (n < pressure_window) { return false; }
  // A young epoch: its refusals stay counted, and the first one after it ages asks.
  if (epoch_younger_than_stale()) { return false; }
  return refused_since_hint_.compare_exchange_strong(n, 0, std::memory_order_relaxed);
}

}  // namespace asyncmr::detail

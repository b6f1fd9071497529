/*
 * SPDX-License-Identifier: Apache-2.0
 */
// The front cache's way out to the pool (parking, proofs, frees) and its statistics.

#include "detail/front_cache_parts.hpp"

#include <asyncmr/detail/blocking.hpp>

#include <stdexcept>
#include <string>

namespace asyncmr::detail {

using namespace front_cache_parts;

// ---- leaving for the pool -------------------------------------------------------------------

std::size_t front_cache::park(bucket& b) noexcept
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

std::size_t front_cache::detach_all() noexcept
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

std::size_t front_cache::detach_stale() noexcept
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

std::uint64_t front_cache::begin_proof() noexcept
{
  // Blocks parked with parked_proof <= the value returned were parked (their release ordered
  // after their streams' markers) before this increment, in the single order of sequentially
  // consistent operations.
  return proof_.fetch_add(1, std::memory_order_seq_cst);
}

std::size_t front_cache::free_parked_impl(bool one,
                                          std::uint64_t proven,
                                          stream_key stream,
                                          drain_fn f,
                                          void* ctx) noexcept
{
  // One bucket at a time: its lists are swapped out under the locks, then `f` runs with no lock
  // held (it calls CUDA, and may even use this cache). Indices stay valid: buckets_ only grows.
  // A block's charge returns to the budget only once `f` freed it: one whose free failed goes
  // back to the cache still charged, so the cap holds at every instant.
  std::size_t freed = 0;
  block_lists taken;  // empty vectors: constructing them allocates nothing
  // Puts back into `b` the blocks of `key` whose free failed, charged still. A block its own
  // stream could not free (drain_stream) is cached there again while the bucket still serves
  // that stream (its order on it holds). Parked blocks were ordered already: they stay parked,
  // joining a generation parked since (freed under the later proof, which is never too early).
  // A drained block whose bucket serves another stream by now has no order the cache could
  // keep: it stays out of the lists (untracked, its charge returned) rather than risk a reuse.
  auto const keep = [this](bucket& b, bool own_stream, stream_key key, std::uint64_t proof,
                           block_lists& kept, std::size_t bytes, std::size_t blocks) noexcept {
    lock_scope const registry{registry_lock_};
    lock_scope const g{b.lock};
    if (own_stream && !(b.bound && b.key == key)) {
      for (std::size_t c = 0; c < class_count; ++c) {
        for (record_slot* const slot : kept[c]) {
          slot->store(0, std::memory_order_release);
          recorded_.fetch_sub(1, std::memory_order_relaxed);
          untracked_.fetch_add(1, std::memory_order_relaxed);
        }
      }
      available_.fetch_add(bytes, std::memory_order_relaxed);
      return;
    }
    bool const cached = own_stream;
    auto& lists       = cached ? b.free : b.parked;
    for (std::size_t c = 0; c < class_count; ++c) {
      for (record_slot* const slot : kept[c]) {
        try {
          lists[c].push_back(slot);
        } catch (...) {  // no host memory: it cannot be listed (lost to the cache)
          slot->store(0, std::memory_order_release);
          recorded_.fetch_sub(1, std::memory_order_relaxed);
          untracked_.fetch_add(1, std::memory_order_relaxed);
          available_.fetch_add(class_table[c], std::memory_order_relaxed);
          bytes -= class_table[c];
          --blocks;
        }
      }
    }
    if (cached) {
      b.cached += bytes;
      b.blocks += blocks;
      return;
    }
    if (b.parked_blocks == 0) { b.parked_proof = proof; }
    b.parked_bytes += bytes;
    b.parked_blocks += blocks;
  };
  for (std::size_t i = 0;; ++i) {
    stream_key key            = 0;
    bucket* from              = nullptr;
    std::uint64_t taken_proof = 0;
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
        taken_proof     = b.parked_proof;
        b.parked_bytes  = 0;
        b.parked_blocks = 0;
        key             = b.key;
        from            = &b;
      }
    }
    std::size_t returned = 0;  // bytes freed: their charge goes back to the budget
    block_lists kept;          // blocks whose free failed (allocates only then)
    std::size_t kept_bytes = 0, kept_blocks = 0;
    for (std::size_t c = 0; c < class_count; ++c) {
      for (record_slot* const slot : taken[c]) {
        // The record forgets the block before the pool can hand its address out again.
        std::uint64_t const value = slot->load(std::memory_order_acquire);
        void* const p             = address_in(value);
        slot->store(0, std::memory_order_release);
        recorded_.fetch_sub(1, std::memory_order_relaxed);
        ++freed;
        if (f(ctx, key, p, class_table[c])) {
          returned += class_table[c];
          continue;
        }
        // Still the pool's allocation: recorded again (in its old slot when free) and kept.
        record_slot* again = nullptr;
        std::uint64_t expected = 0;
        if (slot->compare_exchange_strong(expected, value, std::memory_order_acq_rel)) {
          again = slot;
        } else {
          again = claim_slot(address_of(p), value, true);
        }
        if (again == nullptr) {  // no room in the record: it cannot be listed (lost to the cache)
          untracked_.fetch_add(1, std::memory_order_relaxed);
          returned += class_table[c];
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
          returned += class_table[c];
        }
      }
      taken[c].clear();
    }
    available_.fetch_add(returned, std::memory_order_relaxed);
    if (kept_blocks != 0) { keep(*from, one, key, taken_proof, kept, kept_bytes, kept_blocks); }
    if (!one) {
      // A bucket a stale reclaim emptied belongs to a stream idle since before that reclaim:
      // free it for another stream now rather than at the next reclaim.
      lock_scope const registry{registry_lock_};
      bucket& b = *buckets_[i];
      lock_scope const g{b.lock};
      if (b.bound && b.blocks == 0 && b.parked_blocks == 0 &&
          b.seen + 1 < epoch_.load(std::memory_order_relaxed)) {
        retire(b);
      }
    }
  }
  return freed;
}

std::size_t front_cache::release_impl(bool stale, drain_fn f, void* ctx) noexcept
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
std::size_t front_cache::bytes() const noexcept { return stats().cached_bytes; }

std::size_t front_cache::held_blocks() const noexcept
{
  auto const s = stats();
  return s.cached_blocks + s.parked_blocks;
}

front_cache_stats front_cache::stats() const noexcept
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

void front_cache::reset_peaks() noexcept
{
  charged_high_.store(cap_ - available_.load(std::memory_order_relaxed),
                      std::memory_order_relaxed);
}

std::size_t front_cache::check_invariants() const
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
    held += b->cached + b->parked_bytes + b->credit;
  }
  std::size_t const available = available_.load(std::memory_order_relaxed);
  for (auto const& b : buckets_) { b->lock.unlock(); }
  if (held + available != cap_) { error = "bucket charges plus the global budget != cap"; }
  if (cached > cap_) { error = "cached bytes exceed the cap"; }
  if (!error.empty()) { throw std::logic_error{"asyncmr: front cache: " + error}; }
  return cached;
}

}  // namespace asyncmr::detail

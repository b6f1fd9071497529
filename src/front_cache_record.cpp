/*
 * SPDX-License-Identifier: Apache-2.0
 */
// The front cache's ownership record (see "The rules that make it sound" in front_cache.hpp).

#include "detail/front_cache_parts.hpp"

namespace asyncmr::detail {

using namespace front_cache_parts;


front_cache::record_view front_cache::find_record(void const* ptr) const noexcept
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

std::atomic<std::uint64_t>* front_cache::find_slot(void const* ptr) const noexcept
{
  return find_record(ptr).slot;
}

// Puts `value` into the first empty slot of `address`'s probe sequence; with `over_notes`, when
// none is empty, into a slot holding a graph's note (rule 1: a note only saves the owner a
// driver question, and a destroyed graph's notes would otherwise fill the record for good).
// False when no slot is either.
std::atomic<std::uint64_t>* front_cache::claim_slot(std::uint64_t address,
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

bool front_cache::record(void* ptr, std::size_t bytes) noexcept
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

void front_cache::record_graph(void* ptr) noexcept
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

bool front_cache::forget(void* ptr) noexcept
{
  auto [slot, v] = find_record(ptr);
  if (slot == nullptr) { return false; }
  if ((v & cached_bit) != 0 || !slot->compare_exchange_strong(v, 0, std::memory_order_acq_rel)) {
    return false;
  }
  if (class_of(v) != graph_class) { recorded_.fetch_sub(1, std::memory_order_relaxed); }
  return true;
}

put_result front_cache::unrecord(void* ptr, std::size_t bytes) noexcept
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

std::size_t front_cache::recorded_bytes(void const* ptr) const noexcept
{
  auto const [slot, v] = find_record(ptr);
  if (slot == nullptr) { return 0; }
  std::size_t const c = class_of(v);
  return c == graph_class ? 0 : class_bytes(c);
}

}  // namespace asyncmr::detail

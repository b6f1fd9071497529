/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The replaceable global allocation functions of the test binary: plain malloc/free, except
// that a thread inside a `failing_allocations` scope gets std::bad_alloc.

#include "alloc_failure.hpp"

#include <cstddef>
#include <cstdlib>
#include <new>

namespace {

thread_local int t_failing          = 0;
thread_local unsigned long t_refused = 0;
thread_local unsigned long t_count   = 0;
thread_local void (*t_at_refusal)(void*) noexcept = nullptr;
thread_local void* t_at_refusal_context          = nullptr;

void* allocate(std::size_t n, std::size_t align)
{
  ++t_count;
  if (t_failing > 0) {
    if (auto* const hook = t_at_refusal) {
      t_at_refusal = nullptr;
      int const failing = t_failing;
      t_failing         = 0;  // the hook may allocate
      hook(t_at_refusal_context);
      t_failing = failing;
    }
    ++t_refused;
    throw std::bad_alloc{};
  }
  if (n == 0) { n = 1; }
  void* p = align <= alignof(std::max_align_t) ? std::malloc(n)
                                               : std::aligned_alloc(align, (n + align - 1) / align * align);
  if (p == nullptr) { throw std::bad_alloc{}; }
  return p;
}

}  // namespace

namespace asyncmr::test {

counting_allocations::counting_allocations() noexcept : before_{t_count} {}
counting_allocations::~counting_allocations() = default;
unsigned long counting_allocations::count() const noexcept { return t_count - before_; }

failing_allocations::failing_allocations() noexcept : before_{t_refused} { ++t_failing; }
failing_allocations::failing_allocations(void (*at_refusal)(void*) noexcept, void* context) noexcept
  : before_{t_refused}
{
  ++t_failing;
  t_at_refusal         = at_refusal;
  t_at_refusal_context = context;
}
failing_allocations::~failing_allocations()
{
  --t_failing;
  t_at_refusal = nullptr;
}
unsigned long failing_allocations::refused() const noexcept { return t_refused - before_; }

}  // namespace asyncmr::test

void* operator new(std::size_t n) { return allocate(n, alignof(std::max_align_t)); }
void* operator new[](std::size_t n) { return allocate(n, alignof(std::max_align_t)); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, std::nothrow_t const&) noexcept
{
  try { return allocate(n, alignof(std::max_align_t)); } catch (...) { return nullptr; }
}
void* operator new[](std::size_t n, std::nothrow_t const&) noexcept
{
  try { return allocate(n, alignof(std::max_align_t)); } catch (...) { return nullptr; }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

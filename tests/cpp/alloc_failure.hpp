/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file alloc_failure.hpp
 * @brief Makes host allocations of the calling thread fail on purpose: while a
 * `failing_allocations` scope lives, every `operator new` on this thread throws
 * `std::bad_alloc` (the test binary replaces the global allocation functions,
 * alloc_failure.cpp). It proves that a path which must not allocate (a `noexcept` function, the
 * step after a graph allocation) does not, or survives when it does.
 */

namespace asyncmr::test {

/// @brief While alive, counts the `operator new` calls of this thread.
class counting_allocations {
 public:
  counting_allocations() noexcept;
  ~counting_allocations();
  counting_allocations(counting_allocations const&)            = delete;
  counting_allocations& operator=(counting_allocations const&) = delete;

  /// @brief How many allocations this thread made while this scope lived.
  [[nodiscard]] unsigned long count() const noexcept;

 private:
  unsigned long before_;
};

/// @brief While alive, `operator new` on this thread throws `std::bad_alloc`; `at_refusal`,
/// when given, runs (once, with this thread's allocations working) just before the first
/// refusal throws: a test puts another thread's step exactly there.
class failing_allocations {
 public:
  failing_allocations() noexcept;
  explicit failing_allocations(void (*at_refusal)(void*) noexcept, void* context) noexcept;
  ~failing_allocations();
  failing_allocations(failing_allocations const&)            = delete;
  failing_allocations& operator=(failing_allocations const&) = delete;

  /// @brief How many allocations were refused while this scope lived.
  [[nodiscard]] unsigned long refused() const noexcept;

 private:
  unsigned long before_;
};

}  // namespace asyncmr::test

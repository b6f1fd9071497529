/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Private to src/: a resource's recording (pool_resource_base::start_history), shared by its
// copies. Its rings come and go through a history_owner: a stopped ring's memory goes back with
// its handle, and the ring is freed once no thread can write into it any more
// (detail/history.hpp).

#include <asyncmr/detail/history.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace asyncmr::detail {

// The longest a recording goes without reading the pool's reserved and used bytes (while events
// come): trims the driver makes at synchronizations are seen at most this late.
inline constexpr std::uint64_t history_pool_read_ns = 100'000;

struct history_state {
  history_owner recordings;  // record into recordings.active(), with &recordings
  // The pool's reserved bytes at the last event that read them, to notice growth and trims.
  std::atomic<std::uint64_t> last_reserved{0};
  // The pool's used bytes as last read, moved since by each allocation's and free's bytes.
  std::atomic<std::uint64_t> last_used{0};
  std::atomic<std::uint64_t> last_read{0};    // history_stamp() of the last read of the pool
  std::atomic<std::uint64_t> read_period{0};  // history_pool_read_ns in stamps, at most
  // Whether read_period is at the counter's measured rate; until then (the first ~100 us of a
  // process's first recording) each read of the pool takes it again.
  std::atomic<bool> period_settled{false};
  std::mutex lock;  // start, stop and reads of the events

  // Sets read_period (and period_settled) from the counter's rate as measured now: at a
  // recording's start, then at each read of the pool until the rate is settled.
  void measure_read_period() noexcept
  {
    history_stamp_converter const rate;
    read_period.store(rate.stamps_in(history_pool_read_ns), std::memory_order_relaxed);
    period_settled.store(rate.settled(), std::memory_order_relaxed);
  }
};

}  // namespace asyncmr::detail

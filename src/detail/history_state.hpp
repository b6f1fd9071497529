/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Private to src/: a resource's recording (pool_resource_base::start_history), shared by its
// copies. Rings are kept until the resource goes: a thread may still be writing into one that
// was just stopped, so a stopped ring is retired, never freed, while the resource lives.

#include <asyncmr/detail/history.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace asyncmr::detail {

// The longest a recording goes without reading the pool's reserved and used bytes (while events
// come): trims the driver makes at synchronizations are seen at most this late.
inline constexpr std::uint64_t history_pool_read_ns = 100'000;

struct history_state {
  std::atomic<history_ring*> active{nullptr};
  // The pool's reserved bytes at the last event that read them, to notice growth and trims.
  std::atomic<std::uint64_t> last_reserved{0};
  // The pool's used bytes as last read, moved since by each allocation's and free's bytes.
  std::atomic<std::uint64_t> last_used{0};
  std::atomic<std::uint64_t> last_read{0};    // history_stamp() of the last read of the pool
  std::atomic<std::uint64_t> read_period{0};  // history_pool_read_ns in stamps
  std::mutex lock;  // start and stop
  std::vector<std::unique_ptr<history_ring>> rings;
};

}  // namespace asyncmr::detail

/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file test_kernels.hpp
 * @brief Kernels the tests launch, behind plain host functions so the test sources compile with
 * the host compiler alone. The kernels (test_kernels.cu) are built into a fatbin that the test
 * binary embeds and launches through the driver API (test_kernels.cpp), so the tests link no
 * CUDA runtime but asyncmr's own, whichever CUDA major that is.
 */

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace asyncmr::test {

#if defined(__CUDACC__)
#define ASYNCMR_TEST_HOST_DEVICE __host__ __device__
#else
#define ASYNCMR_TEST_HOST_DEVICE
#endif

/// @brief The 32-bit word the fill kernel writes at index `i` for `seed`.
// clang-format off: it cannot parse the attribute macro and folds the body onto one line
ASYNCMR_TEST_HOST_DEVICE constexpr std::uint32_t pattern_word(std::size_t i,
                                                              std::uint32_t seed) noexcept
{
  return seed ^ (static_cast<std::uint32_t>(i) * 2654435761u);
}
// clang-format on

/**
 * @brief Launches a kernel on `stream` that writes `pattern_word(i, seed)` to `words[i]` for
 * every `i < count`. Returns the launch status (the driver's, as the runtime's error code of the
 * same number; loading the kernels on first use included).
 */
cudaError_t launch_fill(std::uint32_t* words,
                        std::size_t count,
                        std::uint32_t seed,
                        cudaStream_t stream);

/**
 * @brief Launches a kernel on `stream` that adds to `*mismatches` the number of `words[i]`
 * (`i < count`) that differ from `pattern_word(i, seed)`. `*mismatches` must be device
 * accessible. Returns the launch status.
 */
cudaError_t launch_count_mismatches(std::uint32_t const* words,
                                    std::size_t count,
                                    std::uint32_t seed,
                                    unsigned long long* mismatches,
                                    cudaStream_t stream);

}  // namespace asyncmr::test

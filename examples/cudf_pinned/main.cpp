/*
 * SPDX-License-Identifier: Apache-2.0
 */

// asyncmr's pinned pool as libcudf's pinned memory resource: libcudf stages I/O and host
// buffers in pinned memory it takes from `cudf::get_pinned_memory_resource()`. Here a Parquet
// file is written to a host buffer and read back with an asyncmr pool installed; the pool's
// peak shows cuDF used it. Exit status 0 when the data came back right and the pool was used,
// 1 otherwise, 77 without a CUDA device.

#include <asyncmr/asyncmr.hpp>

// libcudf 26.10's cudf/ast/expressions.hpp uses std::variant without including <variant>.
#include <variant>

#include <cudf/aggregation.hpp>
#include <cudf/filling.hpp>
#include <cudf/io/parquet.hpp>
#include <cudf/reduction.hpp>
#include <cudf/scalar/scalar.hpp>
#include <cudf/table/table.hpp>
#include <cudf/utilities/pinned_memory.hpp>
#include <cudf/utilities/span.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main()
{
  std::setvbuf(stdout, nullptr, _IONBF, 0);  // every line out before anything can go wrong
  try {
    asyncmr::require_cuda();
  } catch (asyncmr::no_device_error const& e) {
    std::printf("no CUDA device: %s\n", e.what());
    return 77;
  }
  constexpr std::int64_t rows = 4'000'000;

  // A pool of its own, so its peak is cuDF's use alone; the resource grants every device access.
  asyncmr::async_pinned_memory_resource pinned{{.source = asyncmr::pool_source::new_pool}};
  // Non-owning: `pinned` must outlive every pinned buffer cuDF takes while it is installed.
  auto const previous = cudf::set_pinned_memory_resource(pinned);
  pinned.pool().reset_peaks();

  std::puts("cudf_pinned: asyncmr's pool installed; writing a Parquet file to host memory");
  auto const values = cudf::sequence(rows, cudf::numeric_scalar<std::int64_t>{0},
                                     cudf::numeric_scalar<std::int64_t>{1});
  cudf::table_view const table{{values->view()}};
  std::vector<char> file;
  cudf::io::write_parquet(
    cudf::io::parquet_writer_options::builder(cudf::io::sink_info{&file}, table).build());
  std::puts("cudf_pinned: reading it back");
  auto const read = cudf::io::read_parquet(
    cudf::io::parquet_reader_options::builder(
      cudf::io::source_info{cudf::host_span<char const>{file.data(), file.size()}})
      .build());
  auto const sum = cudf::reduce(read.tbl->get_column(0).view(),
                                *cudf::make_sum_aggregation<cudf::reduce_aggregation>(),
                                cudf::data_type{cudf::type_id::INT64});
  auto const total = static_cast<cudf::numeric_scalar<std::int64_t> const&>(*sum).value();

  cudf::set_pinned_memory_resource(previous);  // before `pinned` goes away
  auto const peak = pinned.pool().get<asyncmr::pool_attribute::used_mem_high>();
  bool const right = total == rows * (rows - 1) / 2;
  std::printf("parquet: %zu bytes, sum %lld (%s); asyncmr pinned pool peak %llu bytes\n",
              file.size(), static_cast<long long>(total), right ? "right" : "WRONG",
              static_cast<unsigned long long>(peak));
  return right && peak > 0 ? 0 : 1;
}

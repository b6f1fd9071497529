/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file mem_pool.hpp
 * @brief `asyncmr::mem_pool`: a CUDA memory pool, owned or viewed, with its attribute, trim,
 * access and routing surface. Every call except allocation runs in relaxed capture mode, so it
 * is safe while another stream is being captured into a CUDA graph.
 */

#include <asyncmr/location.hpp>
#include <asyncmr/pool_attributes.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace asyncmr {

/// @brief Access a device has to a pool's memory (mirrors `cudaMemAccessFlags`).
enum class access_mode : int { none, read, read_write };

/// @brief `pool_properties::export_handle_types` bits (the driver's values).
enum class export_handle : int {
  posix_fd = cudaMemHandleTypePosixFileDescriptor,  ///< a POSIX file descriptor (Linux IPC)
  fabric   = cudaMemHandleTypeFabric,               ///< a fabric handle (multi-node NVLink)
};

/// @brief What another process needs to import one allocation (`cudaMemPoolPtrExportData`).
struct exported_pointer {
  unsigned char bytes[64]{};  ///< opaque; send as is
};

/**
 * @brief The export data of `ptr`, an allocation from a pool created with export handle types
 * (`cudaMemPoolExportPointer`). Export the pool (`mem_pool::export_fd`) first: the 580 driver
 * refuses the pointers of a pool it has not exported. The allocating process must not free
 * `ptr` before every importer has released it (`imported_allocation::release`).
 */
[[nodiscard]] exported_pointer export_pointer(void* ptr);

/// @brief What a pool holds, read at one moment: bytes reserved from the system, and in use.
struct pool_usage {
  std::uint64_t reserved{};  ///< `pool_attribute::reserved_mem_current`
  std::uint64_t used{};      ///< `pool_attribute::used_mem_current`
};

/// @brief Properties of a pool made by `mem_pool::create`.
struct pool_properties {
  allocation_type type{allocation_type::device};               ///< what the pool hands out
  asyncmr::location location{asyncmr::location::device(0)};    ///< where its memory lives
  std::size_t max_size{0};  ///< upper bound on the pool's reserved bytes; 0 = driver's default
                            ///< (managed pools: 0 only; create throws std::invalid_argument)
  /// `cudaMemAllocationHandleType` bits the pool's memory can be exported with; 0 = none.
  int export_handle_types{0};
  /// Release threshold in bytes; unset = the maximum (the pool keeps what it reserved).
  std::optional<std::uint64_t> release_threshold{};
};

namespace detail {
struct pool_state;
}

class imported_allocation;

/**
 * @brief A handle to a CUDA memory pool: a cheap, copyable, shared reference.
 *
 * An owned pool (from `create`, or `from_handle(h, true)`) is destroyed when the last copy goes
 * away or at `close()`; a view (default, current, adopted) is never destroyed by asyncmr.
 * Outstanding allocations and queued frees keep an owned pool alive in the driver after
 * `close()`: asyncmr destroys it once nothing is allocated from it or reserved in it (see
 * `close`). A managed pool is never destroyed: once idle it is kept and serves a later `create`
 * of the same properties (docs/ARCHITECTURE.md, "A pool's end").
 *
 * Shared pools (default and current) are process-wide: changing their attributes or access
 * affects every user of that pool in the process. Like a pointer, a const handle still changes
 * the pool it refers to (attributes, trim, access); only `close()` changes the handle.
 */
class mem_pool {
 public:
  /// @brief An empty handle, refers to no pool: `closed()`, and every pool operation throws
  /// `pool_closed_error`. Assign a pool to it to use it.
  mem_pool();

  /**
   * @brief The default pool of `type` at `location`: CUDA 13's (`cudaMemGetDefaultMemPool`,
   * reached through the driver in a CUDA 12 build on a 13.x driver); device pools in a CUDA 12
   * build, `cudaDeviceGetDefaultMemPool`; host pools in a CUDA 12 build on a 12.x driver,
   * asyncmr's process-wide stand-in (see `capability.hpp`). A view.
   */
  [[nodiscard]] static mem_pool default_pool(asyncmr::location location, allocation_type type);
  /// @brief The current pool of `type` at `location` (`cudaMemGetMemPool`): the default pool
  /// unless someone called `cudaMemSetMemPool`. A view.
  [[nodiscard]] static mem_pool current(asyncmr::location location, allocation_type type);
  /// @brief A new pool owned by the returned object (`cudaMemPoolCreate`).
  [[nodiscard]] static mem_pool create(pool_properties const& props);
  /**
   * @brief Adopts an existing pool handle. `owned` hands destruction to asyncmr. `location` and
   * `type`, when known, make `location()`, `type()` and `make_current()` work on drivers that
   * cannot be asked (older than 13.2).
   *
   * The driver does not check a handle before reading through it: asyncmr refuses handles with
   * nothing mapped at them and pools it closed and has not destroyed yet; anything else is
   * judged by the driver's answer to an attribute query.
   */
  [[nodiscard]] static mem_pool from_handle(cudaMemPool_t handle,
                                            bool owned                                   = false,
                                            std::optional<asyncmr::location> location    = {},
                                            std::optional<allocation_type> type          = {});

  /// @brief The driver handle. Throws `pool_closed_error` after `close()`.
  [[nodiscard]] cudaMemPool_t handle() const;
  /// @brief The driver handle, or nullptr after `close()`; never throws.
  [[nodiscard]] cudaMemPool_t handle_or_null() const noexcept;
  /// @brief True if asyncmr ends this pool: destroys it, or keeps a managed one (class comment).
  [[nodiscard]] bool owned() const noexcept;
  /// @brief True once `close()` ran.
  [[nodiscard]] bool closed() const noexcept;
  /// @brief Where the memory lives, if known (always, except for adopted handles on old drivers).
  [[nodiscard]] std::optional<asyncmr::location> location() const;
  /// @brief What the pool hands out, if known (as for `location`).
  [[nodiscard]] std::optional<allocation_type> type() const;
  /// @brief Creation properties, for pools asyncmr created.
  [[nodiscard]] std::optional<pool_properties> properties() const;

  /**
   * @brief The pool's reserved and used bytes, read together in relaxed capture mode (safe
   * while any stream captures). Nothing when the pool is closed or imported, or the driver
   * cannot answer. Never throws.
   */
  [[nodiscard]] std::optional<pool_usage> usage() const noexcept;

  /**
   * @brief Allocates `bytes` bytes in stream order on `stream` (`cudaMallocFromPoolAsync`).
   *
   * Safe against a concurrent `close()`: the allocation either fails with `pool_closed_error`
   * or completes on a pool that `close()` then parks instead of destroying.
   * @throws rmm::out_of_memory when the pool cannot grow; `unsupported_error` when CUDA refuses
   * the allocation inside a stream capture (host pools); `pool_closed_error` after close.
   */
  [[nodiscard]] void* allocate_async(std::size_t bytes, cudaStream_t stream) const;

  /**
   * @brief Frees `ptr`, a block of this pool, in stream order on `stream` (`cudaFreeAsync`), also
   * after `close()`: a closed pool is destroyed only once no such call is under way. Never
   * throws: returns the CUDA error (a double free, or a pointer no pool handed out, is
   * `cudaErrorInvalidValue`), after clearing it from the runtime's last-error slot.
   */
  [[nodiscard]] cudaError_t deallocate_async(void* ptr, cudaStream_t stream) const noexcept;

  // ---- IPC (src/ipc.cpp) ------------------------------------------------------------------------

  /**
   * @brief A POSIX file descriptor for this pool (`cudaMemPoolExportToShareableHandle`), owned by
   * the caller: send it to another process (a Unix socket, `pidfd_getfd`) and close it. The pool
   * must have been created with `export_handle::posix_fd` among its export handle types.
   */
  [[nodiscard]] int export_fd() const;

  /**
   * @brief The pool another process exported as `fd` (`cudaMemPoolImportFromShareableHandle`),
   * owned by the returned object: `close()` destroys this process's import, never the
   * exporter's pool. `location` and `type` are the exporter's. An imported pool cannot be
   * allocated from or made current; its allocations come in through `import_pointer`.
   */
  [[nodiscard]] static mem_pool import_fd(int fd,
                                          asyncmr::location location,
                                          allocation_type type);

  /// @brief True for a pool from `import_fd`.
  [[nodiscard]] bool imported() const noexcept;

  /**
   * @brief Maps an allocation the exporting process made from this (imported) pool
   * (`cudaMemPoolImportPointer`). It must not be used before the exporter's allocation completed
   * on its stream. The result keeps this pool's import alive until it is released.
   */
  [[nodiscard]] imported_allocation import_pointer(exported_pointer const& data) const;

  /**
   * @brief Reads an attribute as a 64-bit value (booleans as 0/1).
   *
   * The CUDA 13.2 attributes, on an older driver, are answered from what asyncmr knows without
   * asking: location and allocation type of any pool it obtained by location; max size, export
   * handle types and decompression of pools it created. Otherwise, and when a driver that
   * should know one refuses it, `unsupported_error` names the driver needed.
   */
  [[nodiscard]] std::uint64_t get_attribute(pool_attribute attribute) const;
  /**
   * @brief Writes an attribute. Read-only attributes throw `std::invalid_argument`; the
   * watermarks accept only 0 (a reset) and throw `std::invalid_argument` for anything else.
   * Nothing is changed when it throws.
   */
  void set_attribute(pool_attribute attribute, std::uint64_t value) const;

  /// @brief Typed read of attribute `A`.
  template <pool_attribute A>
  [[nodiscard]] attribute_value_t<A> get() const
  {
    return static_cast<attribute_value_t<A>>(get_attribute(A));
  }
  /// @brief Typed write of attribute `A`.
  template <pool_attribute A>
  void set(attribute_value_t<A> value) const
  {
    static_assert(info(A).access != attribute_access::read_only, "attribute is read-only");
    set_attribute(A, static_cast<std::uint64_t>(value));
  }

  /// @brief Resets both high-water marks (used and reserved) to the current values.
  void reset_peaks() const;

  /**
   * @brief Releases reserved memory the pool is not using, keeping at least
   * `min_bytes_to_keep` bytes reserved (`cudaMemPoolTrimTo`). Frees still pending on streams
   * are not yet unused: synchronize first to trim them too.
   */
  void trim_to(std::size_t min_bytes_to_keep = 0) const;

  /**
   * @brief Grants `mode` access to the pool's memory to each device in `devices`.
   *
   * Before the driver is asked: `std::invalid_argument` for a device named twice, or for the
   * device a device pool lives on given less than read-write (it always keeps read-write);
   * `std::out_of_range` for a device that does not exist. `unsupported_error` when the driver
   * refuses `access_mode::read` (every driver tried does).
   */
  void set_access(std::vector<int> const& devices, access_mode mode) const;
  /// @brief The access `device` has to the pool's memory.
  [[nodiscard]] access_mode access(int device) const;

  /**
   * @brief Makes this pool the current pool of its location and type (`cudaMemSetMemPool`),
   * for the whole process: every later `cudaMallocAsync` / `cudaMemGetMemPool` for that
   * location and type, in any library, uses it. Returns the pool that was current.
   */
  mem_pool make_current() const;

  /**
   * @brief Destroys an owned pool (a view just stops being usable). Idempotent. Every later use
   * of this pool through any copy throws `pool_closed_error`. Live allocations stay valid until
   * freed: while any exist, a free of one is still queued on a stream (the pool keeps memory
   * reserved after a trim to 0), or an allocation is in flight on another thread, the driver pool
   * is trimmed and its destruction deferred to a later close or create ("parked"), because
   * freeing into a destroyed pool crashed the 13.0 driver and destroying one under queued frees
   * left their streams never finishing.
   *
   * Like any non-const member, not to be called while another thread uses this same object
   * (closing a view replaces its state); copies may be used and closed from any thread.
   */
  void close();

  /// @brief Same driver pool.
  [[nodiscard]] bool operator==(mem_pool const& other) const noexcept;

 private:
  friend class imported_allocation;
  explicit mem_pool(std::shared_ptr<detail::pool_state> state, bool view = false) noexcept;
  // `current` with the routing lock held by the caller (src/mem_pool.cpp).
  static mem_pool current_routed(asyncmr::location location, allocation_type type);
  std::shared_ptr<detail::pool_state> state_;
  // A view of a pool asyncmr owns elsewhere: it shares the owner's state (so it sees the
  // owner's close() instead of using a destroyed handle) but neither owns nor closes it.
  bool view_{false};
};

/**
 * @brief An allocation of another process, mapped into this one by `mem_pool::import_pointer`.
 *
 * Move-only. It keeps its imported pool alive (the pool is not destroyed while any import of it
 * is live, whatever happens to the `mem_pool` handles), and is released by `release()` or at
 * destruction: `cudaFreeAsync` in stream order, then a wait for it, so the exporter may free its
 * allocation once every importer returned.
 */
class imported_allocation {
 public:
  imported_allocation() noexcept = default;
  imported_allocation(imported_allocation&& other) noexcept;
  imported_allocation& operator=(imported_allocation&& other) noexcept;
  imported_allocation(imported_allocation const&)            = delete;
  imported_allocation& operator=(imported_allocation const&) = delete;
  /// @brief `release()` if still live (never the legacy stream: a free queued there while
  /// another thread captures on a blocking stream would break that capture, and be refused);
  /// never throws (a release that fails leaves the import counted: the pool is then never
  /// destroyed under it).
  ~imported_allocation();

  /// @brief The address in this process; nullptr once released.
  [[nodiscard]] void* get() const noexcept { return ptr_.load(); }
  /// @brief The bytes the driver mapped at `get()`, or 0 when it cannot say.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool released() const noexcept { return ptr_.load() == nullptr; }
  /// @brief The imported pool.
  [[nodiscard]] mem_pool const& pool() const noexcept { return pool_; }

  /**
   * @brief Frees the mapping in stream order on `stream`, then waits for it (releasing the GIL
   * when called from Python). Idempotent.
   * @throws unsupported_error for a stream that is capturing: nothing is changed, the capture
   * stays valid; cuda_error when the driver refuses the free (nothing changed) or the wait
   * fails (the free was enqueued: the allocation counts as released, but its import stays
   * counted, so the pool is never destroyed under a free that may not have run)
   *
   * Threads releasing one import at once take turns: the first frees it, the others then find
   * it released and return.
   */
  void release(cudaStream_t stream);
  /**
   * @brief As `release(stream)`, on a non-blocking stream made for the call in the context the
   * import was made in, in relaxed capture mode (what the destructor does, throwing): neither
   * refused nor breaking while another thread captures, in any mode, nor needing the calling
   * thread to have that context current. Idempotent.
   */
  void release();

 private:
  friend class mem_pool;
  imported_allocation(mem_pool pool, void* ptr, std::size_t size, void* context) noexcept;

  mem_pool pool_{};
  std::atomic<void*> ptr_{nullptr};
  std::size_t size_{0};
  void* context_{nullptr};  // the driver context current at the import (the destructor's)
  std::mutex release_mutex_{};  // one release at a time (a move takes none: it is not shared)
};

namespace testing {
/**
 * @brief How many closed pools asyncmr still holds undestroyed ("parked": a block live, a free
 * still queued, or an allocation in flight), counted after destroying those that have become
 * empty. For tests that a closed pool really goes.
 */
[[nodiscard]] std::size_t parked_pools();
/**
 * @brief How many closed managed pools asyncmr keeps as spares: idle, never destroyed, handed
 * to the next `mem_pool::create` of the same properties. For tests that dropping and creating
 * managed pools does not make one driver pool per pool ever created.
 */
[[nodiscard]] std::size_t spare_pools();
/**
 * @brief Calls `hook` on the calling thread each time asyncmr holds a pool's handle for a driver
 * call (an attribute, a trim, access, an allocation), before the call; nullptr removes it. For
 * tests that close a pool in that window. Not for production: it runs inside every such call.
 */
void set_pool_use_hook(void (*hook)() noexcept) noexcept;
/**
 * @brief Calls `hook` with the stream each time a resource's front cache is about to take a
 * block freed on that stream (before it records the stream's order); nullptr removes it. For
 * tests that begin a capture on the stream in that window.
 */
void set_put_hook(void (*hook)(cudaStream_t stream) noexcept) noexcept;
}  // namespace testing

}  // namespace asyncmr

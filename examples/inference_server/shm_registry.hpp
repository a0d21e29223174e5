// The system shared-memory extension: regions of POSIX shared-memory objects
// that clients register by name, and that requests then name instead of
// sending the bytes through the socket.
//
//   shm_registry shm(/*allowed=*/true);               // --allow_client_shm
//   shm.add("in0", "/client_obj", 0, 1 << 20);         // register
//   absl::Status s = read_inputs(request, shm, budget); // before the model
//   s = write_outputs(response, shm);                  // after it
//
// A region is opened and its bounds checked against the object's size when
// it is registered. Its bytes are then read with pread into memory taken
// from the server's budget, never through a mapping: the object belongs to
// the client, which may shrink it at any time, and reading a mapping past a
// shrunk object's end would kill the server (SIGBUS). A read that comes up
// short is refused instead, naming the region. Outputs are written with
// pwrite, within the registered bounds and the object's current size.
//
// A region unregistered while a request reads it stays open until that read
// ends. The object's key (its name in /dev/shm) is never quoted in an error:
// only the region's name is; the status endpoint returns keys, as the
// protocol asks.
//
// Thread safety: all members are safe from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "buffer_pool.hpp"
#include "dlasync/dlasync.hpp"
#include "kserve.hpp"

namespace dlasync::examples::kserve {

struct shm_region_info {
  std::string name;
  std::string key;
  std::uint64_t offset = 0;
  std::uint64_t byte_size = 0;
};

class shm_registry {
 public:
  // Regions registered at once; each holds a descriptor.
  static constexpr std::size_t max_regions = 256;

  explicit shm_registry(bool allowed) : allowed_(allowed) {}
  shm_registry(const shm_registry&) = delete;
  shm_registry& operator=(const shm_registry&) = delete;
  ~shm_registry();

  // Registers `byte_size` bytes from `offset` of the object `key` as `name`.
  //   PermissionDenied  the server runs without --allow_client_shm;
  //   AlreadyExists     `name` is registered (unregister it first);
  //   InvalidArgument   a name or key of the wrong form, bounds that overflow
  //                     or lie past the object's end;
  //   NotFound          no object `key` (the message names `name` only);
  //   ResourceExhausted max_regions registered.
  absl::Status add(const std::string& name, const std::string& key, std::uint64_t offset,
                   std::uint64_t byte_size);
  // NotFound when `name` is not registered.
  absl::Status remove(const std::string& name);
  void remove_all();
  // Every region, or the one named; NotFound for a name not registered.
  absl::StatusOr<std::vector<shm_region_info>> status(const std::optional<std::string>& name) const;
  bool allowed() const { return allowed_; }

  // Reads `ref` into `out` (ref.byte_size bytes).
  //   NotFound         the region is not registered;
  //   InvalidArgument  bytes past the region's registered size, or an object
  //                    that no longer holds them.
  absl::Status read(const shm_ref& ref, std::byte* out) const;
  // Writes `bytes` at `ref` (at most ref.byte_size), with read's errors.
  absl::Status write(const shm_ref& ref, std::span<const std::byte> bytes) const;

 private:
  struct region;
  // A registered region, and the file offset of a reference's first byte
  // in its object.
  struct located {
    std::shared_ptr<const region> r;
    std::uint64_t at = 0;
  };
  absl::StatusOr<std::shared_ptr<const region>> find(const std::string& name) const;
  // The region `ref` names, with its bounds checked (read's errors).
  absl::StatusOr<located> locate(const shm_ref& ref) const;
  absl::Status denied() const;

  const bool allowed_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const region>, std::less<>> regions_;
};

// Reads every input of `r` that names a region into a buffer from `pool`,
// its bytes taken from `budget` (ResourceExhausted when it has no room now), with read's errors
// naming the input.
absl::Status read_inputs(infer_request& r, const shm_registry& shm, memory_budget& budget,
                         buffer_pool& pool);

// Writes every output of `r` that names a region there.
//   InvalidArgument  an output larger than its region's byte size.
absl::Status write_outputs(const infer_response& r, const shm_registry& shm);

}  // namespace dlasync::examples::kserve

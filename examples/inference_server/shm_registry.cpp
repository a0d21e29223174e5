#include "shm_registry.hpp"

#include <fcntl.h>
#include <sys/mman.h>  // shm_open
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dlasync::examples::kserve {

// An open object. Its descriptor closes when the last holder lets go: the
// registry, or a read or write under way.
struct shm_registry::region {
  shm_region_info info;
  int fd = -1;
  region() = default;
  region(const region&) = delete;
  region& operator=(const region&) = delete;
  ~region() {
    if (fd >= 0) ::close(fd);
  }
};

namespace {

constexpr std::size_t max_name_bytes = 128;

std::string quoted(const std::string& name) {
  return absl::StrCat("\"", clip(name), "\"");
}

// The bytes [offset, offset + size) of a region of `region_size` bytes, as
// a file offset from `base`; empty when they do not fit.
std::optional<std::uint64_t> file_offset(std::uint64_t base, std::uint64_t region_size,
                                         std::uint64_t offset, std::uint64_t size) {
  std::uint64_t end = 0;
  if (__builtin_add_overflow(offset, size, &end) || end > region_size) return std::nullopt;
  std::uint64_t at = 0;
  if (__builtin_add_overflow(base, offset, &at)) return std::nullopt;
  return at;
}

absl::Status out_of_bounds(const shm_ref& ref, std::uint64_t region_size) {
  return absl::InvalidArgumentError(
      absl::StrCat("shared-memory region ", quoted(ref.region), " holds ", region_size,
                   " bytes; the request asks for ", ref.byte_size, " bytes from offset ",
                   ref.offset, ", past its end"));
}

absl::Status shrunk(const shm_ref& ref) {
  return absl::InvalidArgumentError(
      absl::StrCat("shared-memory region ", quoted(ref.region),
                   " no longer holds the bytes it was registered with (its object shrank): "
                   "register it again"));
}

}  // namespace

shm_registry::~shm_registry() = default;

absl::Status shm_registry::denied() const {
  return absl::PermissionDeniedError(
      "the system shared-memory extension is off on this server: start it with "
      "--allow_client_shm, or send the bytes in the request");
}

absl::Status shm_registry::add(const std::string& name, const std::string& key,
                               std::uint64_t offset, std::uint64_t byte_size) {
  if (!allowed_) return denied();
  if (name.empty() || name.size() > max_name_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a shared-memory region's name is 1 to ",
                                                   max_name_bytes, " bytes; this one has ",
                                                   name.size()));
  }
  // A POSIX shared-memory object's name: one leading slash, no other.
  if (key.size() < 2 || key.size() > NAME_MAX || key[0] != '/' ||
      key.find('/', 1) != std::string::npos || key.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("the key of shared-memory region ", quoted(name),
                     " is not a shared-memory object's name: one leading '/', then up to ",
                     NAME_MAX - 1, " bytes without '/'"));
  }
  {
    std::lock_guard lock(mutex_);
    if (regions_.contains(name)) {
      return absl::AlreadyExistsError(absl::StrCat("shared-memory region ", quoted(name),
                                                   " is registered already: unregister it "
                                                   "first, or choose another name"));
    }
    if (regions_.size() >= max_regions) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the server holds ", max_regions, " shared-memory regions at once: unregister some"));
    }
  }
  auto r = std::make_shared<region>();
  r->info = {name, key, offset, byte_size};
  r->fd = ::shm_open(key.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (r->fd < 0) {
    const int e = errno;
    const std::string why = absl::StrCat("cannot open the object of shared-memory region ",
                                         quoted(name), ": ", std::strerror(e));
    if (e == ENOENT) return absl::NotFoundError(why);
    if (e == EACCES) return absl::PermissionDeniedError(why);
    return absl::InvalidArgumentError(why);
  }
  struct stat st {};
  if (::fstat(r->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("the object of shared-memory region ",
                                                   quoted(name), " is not a shared-memory object"));
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (!file_offset(0, size, offset, byte_size)) {
    return absl::InvalidArgumentError(absl::StrCat("shared-memory region ", quoted(name),
                                                   " asks for ", byte_size, " bytes from offset ",
                                                   offset, " of an object of ", size, " bytes"));
  }
  std::lock_guard lock(mutex_);
  if (!regions_.emplace(name, std::move(r)).second) {
    return absl::AlreadyExistsError(absl::StrCat("shared-memory region ", quoted(name),
                                                 " is registered already: unregister it "
                                                 "first, or choose another name"));
  }
  return absl::OkStatus();
}

absl::Status shm_registry::remove(const std::string& name) {
  if (!allowed_) return denied();
  std::lock_guard lock(mutex_);
  if (regions_.erase(name) == 0) {
    return absl::NotFoundError(
        absl::StrCat("shared-memory region ", quoted(name), " is not registered"));
  }
  return absl::OkStatus();
}

void shm_registry::remove_all() {
  std::lock_guard lock(mutex_);
  regions_.clear();
}

absl::StatusOr<std::vector<shm_region_info>> shm_registry::status(
    const std::optional<std::string>& name) const {
  if (!allowed_) return denied();
  std::vector<shm_region_info> out;
  if (name) {
    absl::StatusOr<std::shared_ptr<const region>> r = find(*name);
    if (!r.ok()) return r.status();
    out.push_back((*r)->info);
    return out;
  }
  std::lock_guard lock(mutex_);
  for (const auto& [n, r] : regions_) out.push_back(r->info);
  return out;
}

absl::StatusOr<std::shared_ptr<const shm_registry::region>> shm_registry::find(
    const std::string& name) const {
  if (!allowed_) return denied();
  std::lock_guard lock(mutex_);
  const auto it = regions_.find(name);
  if (it == regions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("shared-memory region ", quoted(name), " is not registered"));
  }
  return it->second;
}

absl::StatusOr<shm_registry::located> shm_registry::locate(const shm_ref& ref) const {
  absl::StatusOr<std::shared_ptr<const region>> r = find(ref.region);
  if (!r.ok()) return r.status();
  const shm_region_info& info = (*r)->info;
  const std::optional<std::uint64_t> at =
      file_offset(info.offset, info.byte_size, ref.offset, ref.byte_size);
  if (!at) return out_of_bounds(ref, info.byte_size);
  return located{*std::move(r), *at};
}

absl::Status shm_registry::read(const shm_ref& ref, std::byte* out) const {
  absl::StatusOr<located> l = locate(ref);
  if (!l.ok()) return l.status();
  std::uint64_t done = 0;
  while (done < ref.byte_size) {
    const ssize_t n =
        ::pread(l->r->fd, out + done, ref.byte_size - done, static_cast<off_t>(l->at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return shrunk(ref);
    done += static_cast<std::uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status shm_registry::write(const shm_ref& ref, std::span<const std::byte> bytes) const {
  absl::StatusOr<located> l = locate(ref);
  if (!l.ok()) return l.status();
  if (bytes.size() > ref.byte_size) {
    return absl::InvalidArgumentError(absl::StrCat("the output takes ", bytes.size(),
                                                   " bytes; shared_memory_byte_size gives ",
                                                   ref.byte_size));
  }
  // Never past the object's end: a write there would grow the client's
  // object instead of failing.
  struct stat st {};
  if (::fstat(l->r->fd, &st) != 0 ||
      static_cast<std::uint64_t>(st.st_size) < l->at + bytes.size()) {
    return shrunk(ref);
  }
  std::uint64_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(l->r->fd, bytes.data() + done, bytes.size() - done,
                               static_cast<off_t>(l->at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return shrunk(ref);
    done += static_cast<std::uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status read_inputs(infer_request& r, const shm_registry& shm, memory_budget& budget,
                         buffer_pool& pool) {
  for (input_tensor& in : r.inputs) {
    if (!in.shm) continue;
    const std::uint64_t bytes = in.shm->byte_size;
    std::shared_ptr<std::byte[]> buffer = buffer_pool::take_budgeted(budget, bytes, &pool);
    if (buffer == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("input ", clip(in.name), ": its ", bytes,
                       " bytes from shared memory find no room in the memory budget now: try "
                       "again"));
    }
    const absl::Status s = shm.read(*in.shm, buffer.get());
    if (!s.ok()) return {s.code(), absl::StrCat("input ", clip(in.name), ": ", s.message())};
    in.data = buffer.get();
    in.owner = std::move(buffer);
  }
  return absl::OkStatus();
}

absl::Status write_outputs(const infer_response& r, const shm_registry& shm) {
  for (const output_tensor& out : r.outputs) {
    if (!out.shm) continue;
    const absl::Status s = shm.write(*out.shm, out.bytes);
    if (!s.ok()) return {s.code(), absl::StrCat("output ", out.name, ": ", s.message())};
  }
  return absl::OkStatus();
}

}  // namespace dlasync::examples::kserve

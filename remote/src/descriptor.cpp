#include "dlasync/remote.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dlasync/limits.hpp"
#include "remote/src/numeric_address.hpp"
#include "remote/src/plan_remote.hpp"

namespace dlasync {
namespace {

constexpr char magic[4] = {'D', 'L', 'R', 'D'};
constexpr char bundle_magic[4] = {'D', 'L', 'R', 'B'};

class writer {
 public:
  explicit writer(std::string& out) : out_(out) {}
  template <typename T>
  void put(T v) {
    unsigned char bytes[sizeof(T)];
    auto u = static_cast<std::make_unsigned_t<T>>(v);
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      bytes[i] = static_cast<unsigned char>(u >> (8 * i));
    }
    out_.append(reinterpret_cast<const char*>(bytes), sizeof(T));
  }
  void blob(std::string_view b) {
    put<std::uint32_t>(static_cast<std::uint32_t>(b.size()));
    out_ += b;
  }

 private:
  std::string& out_;
};

class reader {
 public:
  reader(std::string_view in, std::size_t base, std::string what)
      : in_(in), base_(base), what_(std::move(what)) {}
  // What the messages name: "remote descriptor", "remote bundle, member 3".
  void set_what(std::string what) { what_ = std::move(what); }
  const std::string& what() const { return what_; }
  template <typename T>
  absl::Status get(T& v, const char* field) {
    if (in_.size() - pos_ < sizeof(T)) return truncated(field);
    std::make_unsigned_t<T> u = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      u |= static_cast<std::make_unsigned_t<T>>(static_cast<unsigned char>(in_[pos_ + i]))
           << (8 * i);
    }
    v = static_cast<T>(u);
    pos_ += sizeof(T);
    return absl::OkStatus();
  }
  absl::Status blob(std::string& b, const char* field) {
    std::uint32_t length = 0;
    if (absl::Status s = get(length, field); !s.ok()) return s;
    if (length > remote_descriptor::max_blob_bytes) {
      return absl::OutOfRangeError(
          absl::StrCat(what_, ": ", field, " of ", length, " bytes at byte ", base_ + pos_ - 4,
                       " is above the ", remote_descriptor::max_blob_bytes, " allowed"));
    }
    if (in_.size() - pos_ < length) return truncated(field);
    b.assign(in_.data() + pos_, length);
    pos_ += length;
    return absl::OkStatus();
  }
  // Offsets in the whole encoding, magic included.
  std::size_t pos() const { return base_ + pos_; }
  std::size_t left() const { return in_.size() - pos_; }

 private:
  absl::Status truncated(const char* field) const {
    return absl::InvalidArgumentError(absl::StrCat(what_, ": ", field, " at byte ", base_ + pos_,
                                                   " runs past the end (", base_ + in_.size(),
                                                   " bytes); it was cut short"));
  }
  std::string_view in_;
  std::size_t base_ = 0;
  std::size_t pos_ = 0;
  std::string what_;
};

#define DLASYNC_GET(r, var, name)                       \
  do {                                                  \
    if (absl::Status s = (r).get(var, name); !s.ok()) { \
      return s;                                         \
    }                                                   \
  } while (false)

// The tensor's own fields, from the DLPack version to the strides: the same
// in a descriptor and in each member of a bundle.
void put_tensor(writer& w, const remote_descriptor& d) {
  w.put<std::uint32_t>(d.dlpack_major);
  w.put<std::uint32_t>(d.dlpack_minor);
  w.put<std::int32_t>(static_cast<std::int32_t>(d.source_device.kind));
  w.put<std::int32_t>(d.source_device.ordinal);
  w.put<std::uint8_t>(d.type.code);
  w.put<std::uint8_t>(d.type.bits);
  w.put<std::uint16_t>(d.type.lanes);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(d.shape.size()));
  w.put<std::uint64_t>(d.flags);
  w.put<std::uint64_t>(d.byte_offset);
  w.put<std::uint64_t>(d.data);
  w.put<std::uint64_t>(d.region_begin);
  w.put<std::uint64_t>(d.region_bytes);
  for (std::int64_t e : d.shape) w.put<std::int64_t>(e);
  for (std::size_t i = 0; i < d.shape.size(); ++i) {
    w.put<std::int64_t>(i < d.strides.size() ? d.strides[i] : 0);
  }
}

absl::Status get_tensor(reader& r, remote_descriptor& d) {
  std::int32_t kind = 0;
  std::uint32_t ndim = 0;
  DLASYNC_GET(r, d.dlpack_major, "DLPack major version");
  DLASYNC_GET(r, d.dlpack_minor, "DLPack minor version");
  DLASYNC_GET(r, kind, "device type");
  d.source_device.kind = static_cast<device_kind>(kind);
  DLASYNC_GET(r, d.source_device.ordinal, "device id");
  DLASYNC_GET(r, d.type.code, "dtype code");
  DLASYNC_GET(r, d.type.bits, "dtype bits");
  DLASYNC_GET(r, d.type.lanes, "dtype lanes");
  DLASYNC_GET(r, ndim, "ndim");
  if (ndim > static_cast<std::uint32_t>(max_ndim)) {
    return absl::OutOfRangeError(
        absl::StrCat(r.what(), ": ndim ", ndim, " is above the ", max_ndim, " dlasync imports"));
  }
  DLASYNC_GET(r, d.flags, "flags");
  DLASYNC_GET(r, d.byte_offset, "byte offset");
  DLASYNC_GET(r, d.data, "data address");
  DLASYNC_GET(r, d.region_begin, "region address");
  DLASYNC_GET(r, d.region_bytes, "region length");
  d.shape.resize(ndim);
  d.strides.resize(ndim);
  for (std::int64_t& e : d.shape) DLASYNC_GET(r, e, "shape");
  for (std::int64_t& e : d.strides) DLASYNC_GET(r, e, "strides");
  return absl::OkStatus();
}

// The exporter's listener: its address's bytes (4 or 16, none when the text
// is not numeric), then the port.
void put_listener(writer& w, const std::string& address_text, std::uint16_t port) {
  std::string address;
  if (const std::optional<remote_detail::numeric_address> a =
          remote_detail::parse_address(address_text)) {
    address.assign(reinterpret_cast<const char*>(a->bytes.data()), a->length());
  }
  w.blob(address);
  w.put<std::uint16_t>(port);
}

absl::Status get_listener(reader& r, std::string& address_text, std::uint16_t& port) {
  std::string address;
  if (absl::Status s = r.blob(address, "exporter address"); !s.ok()) return s;
  if (!address.empty()) {
    char text[INET6_ADDRSTRLEN] = {};
    const int family = address.size() == sizeof(in_addr)    ? AF_INET
                       : address.size() == sizeof(in6_addr) ? AF_INET6
                                                            : AF_UNSPEC;
    if (family == AF_UNSPEC || inet_ntop(family, address.data(), text, sizeof(text)) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(r.what(), ": the exporter address holds ", address.size(),
                       " bytes; an IPv4 address has 4, an IPv6 address 16"));
    }
    address_text = text;
  }
  return r.get(port, "exporter port");
}

// The magic, the format version and a reserved 0.
absl::Status get_head(std::string_view bytes, const char (&magic)[4], std::uint16_t version,
                      reader& r) {
  if (bytes.size() < sizeof(magic) || std::memcmp(bytes.data(), magic, sizeof(magic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.what(), ": ", bytes.size(), " bytes that do not start with \"",
                     std::string(magic, sizeof(magic)), "\"; this is not a dlasync ", r.what()));
  }
  std::uint16_t seen = 0;
  std::uint16_t reserved = 0;
  DLASYNC_GET(r, seen, "format version");
  if (seen != version) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.what(), ": format version ", seen, "; this dlasync reads ", version,
                     ": exporter and importer must run compatible dlasync"));
  }
  DLASYNC_GET(r, reserved, "reserved");
  if (reserved != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.what(), ": the reserved field at byte 6 is ", reserved, ", not 0"));
  }
  return absl::OkStatus();
}

absl::Status check_end(const reader& r) {
  if (r.left() == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      r.what(), ": ", r.left(), " bytes after its end at byte ", r.pos(), "; it is corrupt"));
}

}  // namespace

std::string remote_descriptor::encode() const {
  std::string out;
  out.reserve(112 + 16 * shape.size() + rkey.size());
  out.append(magic, sizeof(magic));
  writer w(out);
  w.put<std::uint16_t>(format_version);
  w.put<std::uint16_t>(0);
  w.put<std::uint64_t>(lease_id);
  put_tensor(w, *this);
  put_listener(w, exporter_address, exporter_port);
  w.blob(rkey);
  return out;
}

absl::StatusOr<remote_descriptor> remote_descriptor::decode(std::string_view bytes) {
  reader r(bytes.substr(std::min(bytes.size(), sizeof(magic))), sizeof(magic), "remote descriptor");
  if (absl::Status s = get_head(bytes, magic, format_version, r); !s.ok()) return s;
  remote_descriptor d;
  DLASYNC_GET(r, d.lease_id, "lease id");
  if (absl::Status s = get_tensor(r, d); !s.ok()) return s;
  if (absl::Status s = get_listener(r, d.exporter_address, d.exporter_port); !s.ok()) return s;
  if (absl::Status s = r.blob(d.rkey, "remote key"); !s.ok()) return s;
  if (absl::Status s = check_end(r); !s.ok()) return s;
  return d;
}

std::string remote_bundle::encode() const {
  // Each distinct remote key once, in the order members first name it.
  std::vector<std::string_view> keys;
  std::unordered_map<std::string_view, std::uint32_t> place;
  std::vector<std::uint32_t> key_of(members.size(), no_key);
  for (std::size_t i = 0; i < members.size(); ++i) {
    const std::string& key = members[i].descriptor.rkey;
    if (key.empty()) continue;
    auto [at, fresh] = place.emplace(key, static_cast<std::uint32_t>(keys.size()));
    if (fresh) keys.push_back(key);
    key_of[i] = at->second;
  }
  std::string out;
  out.reserve(32 + members.size() * 164);
  out.append(bundle_magic, sizeof(bundle_magic));
  writer w(out);
  w.put<std::uint16_t>(format_version);
  w.put<std::uint16_t>(0);
  w.put<std::uint64_t>(lease_id);
  put_listener(w, exporter_address, exporter_port);
  w.put<std::uint32_t>(published);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(members.size()));
  w.put<std::uint32_t>(static_cast<std::uint32_t>(keys.size()));
  for (std::string_view key : keys) w.blob(key);
  for (std::size_t i = 0; i < members.size(); ++i) {
    w.put<std::uint32_t>(members[i].index);
    w.put<std::uint32_t>(key_of[i]);
    put_tensor(w, members[i].descriptor);
  }
  return out;
}

absl::StatusOr<remote_bundle> remote_bundle::decode(std::string_view bytes) {
  reader r(bytes.substr(std::min(bytes.size(), sizeof(bundle_magic))), sizeof(bundle_magic),
           "remote bundle");
  if (absl::Status s = get_head(bytes, bundle_magic, format_version, r); !s.ok()) return s;
  remote_bundle b;
  std::uint32_t count = 0;
  DLASYNC_GET(r, b.lease_id, "lease id");
  if (absl::Status s = get_listener(r, b.exporter_address, b.exporter_port); !s.ok()) return s;
  DLASYNC_GET(r, b.published, "published members");
  DLASYNC_GET(r, count, "member count");
  if (b.published > max_members || count > b.published) {
    return absl::OutOfRangeError(absl::StrCat("remote bundle: ", count, " members of ", b.published,
                                              " published; a bundle holds at most ", max_members,
                                              ", and no more than were published"));
  }
  if (count == 0) {
    return absl::InvalidArgumentError("remote bundle: no members; a bundle names at least one");
  }
  std::uint32_t key_count = 0;
  DLASYNC_GET(r, key_count, "key count");
  if (key_count > count) {
    return absl::InvalidArgumentError(absl::StrCat("remote bundle: ", key_count,
                                                   " remote keys for ", count,
                                                   " members; each key is a member's"));
  }
  // Distinct keys, listed in the order members first name them: what
  // encode writes, so that the bytes encode back to themselves.
  std::vector<std::string> keys(key_count);
  std::unordered_map<std::string_view, std::uint32_t> seen;
  for (std::uint32_t k = 0; k < key_count; ++k) {
    if (absl::Status s = r.blob(keys[k], "remote key"); !s.ok()) return s;
    // Each member copies its key: a bound on what the bytes can make.
    if (keys[k].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("remote bundle: remote key ", k,
                                                     " is empty; a member without a key "
                                                     "names none"));
    }
    if (keys[k].size() > max_key_bytes) {
      return absl::OutOfRangeError(
          absl::StrCat("remote bundle: remote key ", k, " of ", keys[k].size(),
                       " bytes; a bundle's keys hold at most ", max_key_bytes));
    }
    if (auto [at, fresh] = seen.emplace(keys[k], k); !fresh) {
      return absl::InvalidArgumentError(absl::StrCat("remote bundle: remote key ", k,
                                                     " repeats key ", at->second,
                                                     "; a bundle lists each key once"));
    }
  }
  // Each member takes at least 64 bytes: no allocation beyond what the
  // bytes can describe.
  if (r.left() / 64 < count) {
    return absl::InvalidArgumentError(absl::StrCat("remote bundle: ", count, " members in ",
                                                   r.left(), " bytes; it was cut short"));
  }
  b.members.resize(count);
  std::uint32_t named = 0;  // keys named so far
  for (std::uint32_t i = 0; i < count; ++i) {
    member& m = b.members[i];
    r.set_what(absl::StrCat("remote bundle, member ", i));
    std::uint32_t key = no_key;
    DLASYNC_GET(r, m.index, "index");
    DLASYNC_GET(r, key, "key");
    if (key != no_key && (key >= key_count || key > named)) {
      return absl::InvalidArgumentError(
          absl::StrCat(r.what(), ": key ", key, " of ", key_count, " where key ", named,
                       " is the next not named yet; members name the bundle's keys in order"));
    }
    if (key == named) ++named;
    if (absl::Status s = get_tensor(r, m.descriptor); !s.ok()) return s;
    m.descriptor.lease_id = b.lease_id;
    m.descriptor.exporter_address = b.exporter_address;
    m.descriptor.exporter_port = b.exporter_port;
    if (key != no_key) m.descriptor.rkey = keys[key];
  }
  r.set_what("remote bundle");
  if (absl::Status s = check_end(r); !s.ok()) return s;
  if (named != key_count) {
    return absl::InvalidArgumentError(absl::StrCat("remote bundle: remote key ", named, " of ",
                                                   key_count,
                                                   " is named by no member; it is corrupt"));
  }
  if (absl::Status s = remote_detail::check_member_indices(b); !s.ok()) return s;
  return b;
}

absl::StatusOr<remote_bundle> remote_bundle::select(
    const std::vector<std::size_t>& positions) const {
  if (positions.empty()) {
    return absl::InvalidArgumentError("remote_bundle::select: no positions; select at least one");
  }
  std::vector<std::size_t> sorted = positions;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] >= members.size()) {
      return absl::OutOfRangeError(absl::StrCat("remote_bundle::select: position ", sorted[i],
                                                " of a bundle of ", members.size(), " members"));
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("remote_bundle::select: position ", sorted[i], " twice; name each once"));
    }
  }
  remote_bundle out;
  out.lease_id = lease_id;
  out.exporter_address = exporter_address;
  out.exporter_port = exporter_port;
  out.published = published;
  out.members.reserve(sorted.size());
  for (std::size_t p : sorted) out.members.push_back(members[p]);
  return out;
}

#undef DLASYNC_GET

}  // namespace dlasync

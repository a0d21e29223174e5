#include "dlasync/remote.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "dlasync/limits.hpp"

namespace dlasync {
namespace {

constexpr char magic[4] = {'D', 'L', 'R', 'D'};

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
  void blob(const std::string& b) {
    put<std::uint32_t>(static_cast<std::uint32_t>(b.size()));
    out_ += b;
  }

 private:
  std::string& out_;
};

class reader {
 public:
  explicit reader(std::string_view in) : in_(in) {}
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
      return absl::OutOfRangeError(absl::StrCat("remote descriptor: ", field, " of ", length,
                                                " bytes at byte ", pos_ - 4, " is above the ",
                                                remote_descriptor::max_blob_bytes, " allowed"));
    }
    if (in_.size() - pos_ < length) return truncated(field);
    b.assign(in_.data() + pos_, length);
    pos_ += length;
    return absl::OkStatus();
  }
  std::size_t pos() const { return pos_; }
  std::size_t left() const { return in_.size() - pos_; }

 private:
  absl::Status truncated(const char* field) const {
    return absl::InvalidArgumentError(absl::StrCat("remote descriptor: ", field, " at byte ", pos_,
                                                   " runs past the end (", in_.size(),
                                                   " bytes); the descriptor was cut short"));
  }
  std::string_view in_;
  std::size_t pos_ = 0;
};

}  // namespace

std::string remote_descriptor::encode() const {
  std::string out;
  out.reserve(112 + 16 * shape.size() + rkey.size());
  out.append(magic, sizeof(magic));
  writer w(out);
  w.put<std::uint16_t>(format_version);
  w.put<std::uint16_t>(0);
  w.put<std::uint64_t>(lease_id);
  w.put<std::uint32_t>(dlpack_major);
  w.put<std::uint32_t>(dlpack_minor);
  w.put<std::int32_t>(static_cast<std::int32_t>(source_device.kind));
  w.put<std::int32_t>(source_device.ordinal);
  w.put<std::uint8_t>(type.code);
  w.put<std::uint8_t>(type.bits);
  w.put<std::uint16_t>(type.lanes);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(shape.size()));
  w.put<std::uint64_t>(flags);
  w.put<std::uint64_t>(byte_offset);
  w.put<std::uint64_t>(data);
  w.put<std::uint64_t>(region_begin);
  w.put<std::uint64_t>(region_bytes);
  for (std::int64_t e : shape) w.put<std::int64_t>(e);
  for (std::size_t i = 0; i < shape.size(); ++i) {
    w.put<std::int64_t>(i < strides.size() ? strides[i] : 0);
  }
  // The exporter's listener: its address's bytes (4 or 16, none when the
  // text is not numeric), then the port.
  std::string address(sizeof(in6_addr), '\0');
  if (inet_pton(AF_INET, exporter_address.c_str(), address.data()) == 1) {
    address.resize(sizeof(in_addr));
  } else if (inet_pton(AF_INET6, exporter_address.c_str(), address.data()) != 1) {
    address.clear();
  }
  w.blob(address);
  w.put<std::uint16_t>(exporter_port);
  w.blob(rkey);
  return out;
}

absl::StatusOr<remote_descriptor> remote_descriptor::decode(std::string_view bytes) {
  if (bytes.size() < sizeof(magic) || std::memcmp(bytes.data(), magic, sizeof(magic)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "remote descriptor: ", bytes.size(),
        " bytes that do not start with \"DLRD\"; this is not a dlasync remote descriptor"));
  }
  reader r(bytes.substr(sizeof(magic)));
  remote_descriptor d;
  std::uint16_t version = 0;
  std::uint16_t reserved = 0;
  std::int32_t kind = 0;
  std::uint32_t ndim = 0;
#define DLASYNC_GET(var, name)                        \
  do {                                                \
    if (absl::Status s = r.get(var, name); !s.ok()) { \
      return s;                                       \
    }                                                 \
  } while (false)
  DLASYNC_GET(version, "format version");
  if (version != format_version) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote descriptor: format version ", version, "; this dlasync reads ",
                     format_version, ": exporter and importer must run compatible dlasync"));
  }
  DLASYNC_GET(reserved, "reserved");
  if (reserved != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote descriptor: the reserved field at byte 6 is ", reserved, ", not 0"));
  }
  DLASYNC_GET(d.lease_id, "lease id");
  DLASYNC_GET(d.dlpack_major, "DLPack major version");
  DLASYNC_GET(d.dlpack_minor, "DLPack minor version");
  DLASYNC_GET(kind, "device type");
  d.source_device.kind = static_cast<device_kind>(kind);
  DLASYNC_GET(d.source_device.ordinal, "device id");
  DLASYNC_GET(d.type.code, "dtype code");
  DLASYNC_GET(d.type.bits, "dtype bits");
  DLASYNC_GET(d.type.lanes, "dtype lanes");
  DLASYNC_GET(ndim, "ndim");
  if (ndim > static_cast<std::uint32_t>(max_ndim)) {
    return absl::OutOfRangeError(absl::StrCat("remote descriptor: ndim ", ndim, " is above the ",
                                              max_ndim, " dlasync imports"));
  }
  DLASYNC_GET(d.flags, "flags");
  DLASYNC_GET(d.byte_offset, "byte offset");
  DLASYNC_GET(d.data, "data address");
  DLASYNC_GET(d.region_begin, "region address");
  DLASYNC_GET(d.region_bytes, "region length");
  d.shape.resize(ndim);
  d.strides.resize(ndim);
  for (std::int64_t& e : d.shape) DLASYNC_GET(e, "shape");
  for (std::int64_t& e : d.strides) DLASYNC_GET(e, "strides");
#undef DLASYNC_GET
  std::string address;
  if (absl::Status s = r.blob(address, "exporter address"); !s.ok()) return s;
  if (!address.empty()) {
    char text[INET6_ADDRSTRLEN] = {};
    const int family = address.size() == sizeof(in_addr)    ? AF_INET
                       : address.size() == sizeof(in6_addr) ? AF_INET6
                                                            : AF_UNSPEC;
    if (family == AF_UNSPEC || inet_ntop(family, address.data(), text, sizeof(text)) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("remote descriptor: the exporter address holds ", address.size(),
                       " bytes; an IPv4 address has 4, an IPv6 address 16"));
    }
    d.exporter_address = text;
  }
  if (absl::Status s = r.get(d.exporter_port, "exporter port"); !s.ok()) return s;
  if (absl::Status s = r.blob(d.rkey, "remote key"); !s.ok()) return s;
  if (r.left() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote descriptor: ", r.left(), " bytes after its end at byte ",
                     r.pos() + sizeof(magic), "; the descriptor is corrupt"));
  }
  return d;
}

}  // namespace dlasync

// dlasync/descriptor.hpp
//
// `dlasync::remote_descriptor` is what an exporting process hands to an
// importing one so that the importer can fetch a published tensor over UCX:
// the tensor's DLPack description as the exporter sees it (dtype, shape,
// strides, byte offset, flags, device), where its bytes lie in the
// exporter's address space (the tensor's data pointer and the region the
// strides reach), the exporter's listener (an address and a port), the
// lease that keeps the memory alive, and, only where the exporter trusts
// its peers with RMA, the packed UCX remote key of the region.
// Any channel can carry it: `encode` gives a self-contained byte string,
// `decode` reads one back.
//
// A descriptor that arrives from elsewhere is untrusted. `decode` checks the
// framing (magic, format version, lengths, no trailing bytes, ndim within
// max_ndim, an address of 4 or 16 bytes); import_remote then validates the
// description exactly as a local import validates a DLPack tensor (shape,
// strides, dtype, offset, overflow), and checks that the span the strides
// reach lies inside the region, before any byte moves. The description
// grants nothing by itself: the exporter sends only the bytes of the tensor
// it published under the lease, and refuses a hold asked for with a
// description that is not that tensor's (docs/security.md).
//
// Example, the exporter's side and the importer's side of a channel:
//
//   absl::StatusOr<dlasync::remote_descriptor> d = node.publish(std::move(source));
//   channel.send(d->encode());
//   ...
//   absl::StatusOr<dlasync::remote_descriptor> r = dlasync::remote_descriptor::decode(bytes);
//   if (!r.ok()) return r.status();  // InvalidArgument, naming the byte
//
// Thread safety: a value type. Distinct objects: safe. Shared objects: safe
// for concurrent const use.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "dlasync/device.hpp"
#include "dlasync/dtype.hpp"

namespace dlasync {

struct remote_descriptor {
  // The format `encode` writes; `decode` refuses others.
  static constexpr std::uint16_t format_version = 2;
  // Bounds on the opaque UCX blobs (`decode` refuses longer ones).
  static constexpr std::uint32_t max_blob_bytes = 64 * 1024;

  // The publication this descriptor names at its exporter.
  std::uint64_t lease_id = 0;
  // The DLPack version the exporter's tensor carried.
  std::uint32_t dlpack_major = 1;
  std::uint32_t dlpack_minor = 3;
  // The device the tensor lives on, in the exporter's process.
  device source_device = host_device;
  dtype type = dtypes::float32;
  std::vector<std::int64_t> shape;
  // Strides in elements, always ndim of them.
  std::vector<std::int64_t> strides;
  std::uint64_t byte_offset = 0;
  // The versioned DLPack flags the exporter's tensor carried.
  std::uint64_t flags = 0;
  // DLTensor::data in the exporter's address space; the first element is
  // at data + byte_offset.
  std::uint64_t data = 0;
  // The region, [region_begin, region_begin + region_bytes): every byte
  // the strides reach lies inside it. Empty for size-0 tensors.
  std::uint64_t region_begin = 0;
  std::uint64_t region_bytes = 0;
  // The exporter's listener: a numeric IPv4 or IPv6 address and a port
  // (remote_node_options::listen_address, listen_port).
  std::string exporter_address;
  std::uint16_t exporter_port = 0;
  // The packed UCX remote key of the region (ucp_rkey_pack), only from an
  // exporter whose node trusts its peers (remote_node_options::
  // trusted_peers); empty otherwise.
  std::string rkey;

  // The descriptor as bytes: little-endian, self-delimiting.
  std::string encode() const;

  // Reads `bytes` back. InvalidArgument for anything malformed (wrong magic,
  // another format version, a length past the end, trailing bytes, an
  // exporter address of neither 4 nor 16 bytes), naming the field and the
  // byte; OutOfRange for ndim above max_ndim or a blob above
  // max_blob_bytes. The description itself is checked by the import.
  static absl::StatusOr<remote_descriptor> decode(std::string_view bytes);
};

}  // namespace dlasync

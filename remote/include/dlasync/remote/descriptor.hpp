// dlasync/remote/descriptor.hpp
//
// `dlasync::remote_descriptor` is what an exporting process hands to an
// importing one so that the importer can fetch a published tensor over UCX:
// the tensor's DLPack description as the exporter sees it (dtype, shape,
// strides, byte offset, flags, device), where its bytes lie in the
// exporter's address space (the tensor's data pointer and the registered
// region the strides reach), the packed UCX remote key of that region, the
// exporter's UCX worker address, and the lease that keeps the memory alive.
// Any channel can carry it: `encode` gives a self-contained byte string,
// `decode` reads one back.
//
// A descriptor that arrives from elsewhere is untrusted. `decode` checks the
// framing (magic, format version, lengths, no trailing bytes, ndim within
// max_ndim); import_remote then validates the description exactly as a
// local import validates a DLPack tensor (shape, strides, dtype, offset,
// overflow), and checks that the span the strides reach lies inside the
// registered region, before any byte moves.
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
#include "dlasync/runtime/device.hpp"
#include "dlasync/transfer/dtype.hpp"

namespace dlasync {

struct remote_descriptor {
  // The format `encode` writes; `decode` refuses others.
  static constexpr std::uint16_t format_version = 1;
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
  // The registered region, [region_begin, region_begin + region_bytes):
  // every byte the strides reach lies inside it. Empty for size-0 tensors.
  std::uint64_t region_begin = 0;
  std::uint64_t region_bytes = 0;
  // The packed UCX remote key of the region (ucp_rkey_pack).
  std::string rkey;
  // The exporter's UCX worker address (ucp_worker_get_address).
  std::string worker_address;

  // The descriptor as bytes: little-endian, self-delimiting.
  std::string encode() const;

  // Reads `bytes` back. InvalidArgument for anything malformed (wrong magic,
  // another format version, a length past the end, trailing bytes), naming
  // the field and the byte; OutOfRange for ndim above max_ndim or a blob
  // above max_blob_bytes. The description itself is checked by the import.
  static absl::StatusOr<remote_descriptor> decode(std::string_view bytes);
};

}  // namespace dlasync

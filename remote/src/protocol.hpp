// The active messages between importers and exporters (internal).
//
// An importer asks the exporter for a hold on a lease (hold_request, sent
// with UCP_AM_SEND_FLAG_REPLY so that the exporter answers on the
// importer's own endpoint), the exporter answers (hold_reply: granted with
// the time left on the lease, or refused with a status), the importer
// fetches the bytes and then releases its hold (hold_release).
//
// The bytes move by RMA get where the endpoint has a native RMA lane (over
// shared memory: cma). Elsewhere (TCP) UCX would emulate the get with its
// own active messages, and UCX 1.13 aborts the exporting process when such
// an emulated get's importer is lost; there the importer sends one
// fetch_request per piece instead, and the exporter answers each with a
// fetch_data message carrying the bytes (UCX's rendezvous for large ones,
// received straight into the importer's buffer), whose failure UCX reports
// to the sender like any send.
// Every message is one fixed-size header and no payload; a receiver drops
// a message whose length or magic is wrong. Both sides are untrusted by the
// other: a reply names a request the importer made, or it is dropped.
#pragma once

#include <cstdint>

namespace dlasync::remote_detail {

// Active-message ids, registered by every node.
inline constexpr unsigned am_hold_request = 0x4c01;
inline constexpr unsigned am_hold_reply = 0x4c02;
inline constexpr unsigned am_hold_release = 0x4c03;
inline constexpr unsigned am_fetch_request = 0x4c04;
inline constexpr unsigned am_fetch_data = 0x4c05;

inline constexpr std::uint32_t protocol_magic = 0x444c4152;  // "DLAR"

struct hold_request {
  std::uint32_t magic = protocol_magic;
  std::uint32_t reserved = 0;
  std::uint64_t lease_id = 0;
  std::uint64_t request_id = 0;
};

struct hold_reply {
  std::uint32_t magic = protocol_magic;
  // An absl::StatusCode; 0 (OK) grants the hold.
  std::int32_t code = 0;
  std::uint64_t request_id = 0;
  // Microseconds left on the lease when the exporter answered.
  std::uint64_t remaining_us = 0;
  // The refusal's message, NUL-terminated.
  char message[192] = {};
};

struct hold_release {
  std::uint32_t magic = protocol_magic;
  std::uint32_t reserved = 0;
  std::uint64_t lease_id = 0;
  std::uint64_t request_id = 0;
};

// Bytes [address, address + length) of a lease's region, as piece `piece`
// of request `request_id`; sent with UCP_AM_SEND_FLAG_REPLY.
struct fetch_request {
  std::uint32_t magic = protocol_magic;
  std::uint32_t reserved = 0;
  std::uint64_t lease_id = 0;
  std::uint64_t request_id = 0;
  std::uint64_t piece = 0;
  std::uint64_t address = 0;
  std::uint64_t length = 0;
};

// The answer: the bytes as the message's data (code 0), or a refusal
// (an absl::StatusCode, no data).
struct fetch_data {
  std::uint32_t magic = protocol_magic;
  std::int32_t code = 0;
  std::uint64_t request_id = 0;
  std::uint64_t piece = 0;
  std::uint64_t length = 0;
};

}  // namespace dlasync::remote_detail

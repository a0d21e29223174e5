// The active messages between importers and exporters (internal).
//
// An importer connects to the exporter's listener and asks for a hold on a
// lease (hold_request, sent with UCP_AM_SEND_FLAG_REPLY so that the
// exporter knows which connection asks). The exporter answers (hold_reply):
// a refusal with a status, or a grant with the hold's id and secret, the
// time left on the lease, and how it sends the bytes. Then it sends them
// itself, as pieces it chose from its own record of the tensor (the whole
// span, one piece per contiguous run, or a compact copy it gathered): the
// importer never names an address the exporter reads. Last, the importer
// releases its hold (hold_release, with the hold's id and secret, on the
// same connection).
//
// A small tensor goes in one message: an importer that asks for pieces
// also offers to take the bytes with the grant (request_bytes_with_grant).
// Where the exporter's plan is one piece of at most 64 KiB, it sends that
// piece as the grant's data (reply_bytes_with_grant) and ends the hold at
// once; the producer still waits until the send no longer reads its memory.
// No piece message, and no release, follows.
//
// A bundle (several tensors under one lease) is asked for with the members
// the importer wants (request_members): the hold request's data lists them,
// each with the digest of the description the importer validated. The
// exporter refuses the whole hold when any member is unknown or described
// otherwise, naming it; else it grants one hold and sends every member's
// pieces at once, each piece naming its member by its place in the list.
// The grant says how each member is sent (member_plan). Small members go
// packed, several in one message (packed). Where every member is one piece
// and all of them come to at most max_bytes_with_grant bytes, and the
// importer offered to take the bytes with the grant, they go packed in the
// grant itself, and the hold ends with it. Otherwise one release ends the
// hold.
//
// Where both nodes trust their peers (remote_node_options::trusted_peers)
// and the descriptor carries a remote key, the importer may instead read
// the bytes itself by RMA get, and asks for a hold without pieces.
//
// Every message is one fixed-size header; pieces carry their bytes as the
// message's data. A receiver drops a message whose length, magic or
// version is wrong, or that does not come on the connection its request
// went out on. Both sides are untrusted by the other: every number is
// checked before it is used.
#pragma once

#include <sys/random.h>

#include <cstddef>
#include <cstdint>

namespace dlasync::remote_detail {

// 64 bits from the operating system's random source, for lease ids and
// hold secrets: no peer can predict one from the ones it has seen.
inline std::uint64_t random_u64() {
  std::uint64_t v = 0;
  auto* p = reinterpret_cast<unsigned char*>(&v);
  std::size_t got = 0;
  while (got < sizeof(v)) {
    const ssize_t n = getrandom(p + got, sizeof(v) - got, 0);
    if (n > 0) got += static_cast<std::size_t>(n);
  }
  return v;
}

// Active-message ids (16 bits on UCX's wire), registered by every node.
inline constexpr unsigned am_hold_request = 0x4c01;
inline constexpr unsigned am_hold_reply = 0x4c02;
inline constexpr unsigned am_hold_release = 0x4c03;
inline constexpr unsigned am_piece = 0x4c04;
inline constexpr unsigned am_packed = 0x4c05;

inline constexpr std::uint32_t protocol_magic = 0x444c4152;  // "DLAR"
inline constexpr std::uint16_t protocol_version = 5;

// A whole or dense span, and a gathered copy, are sent in pieces of this
// many bytes (the last one shorter), all in flight together: each piece that arrives is a sign of
// life, and pieces of this size move faster through UCX's shared-memory
// rendezvous than one piece of the whole span (docs/remote.md).
inline constexpr std::uint64_t max_piece_bytes = std::uint64_t{4} << 20;

// How an exporter sends a tensor's bytes.
enum class piece_plan : std::uint8_t {
  // None: the importer reads them by RMA get (trusted peers only).
  none = 0,
  // The span, which holds exactly the tensor's elements in row-major order
  // (a compact tensor), in pieces of max_piece_bytes (the last one shorter).
  whole = 1,
  // The span, which holds exactly the tensor's elements in another order
  // (a transposed or reversed compact tensor), in pieces of
  // max_piece_bytes: the importer compacts it.
  dense = 2,
  // One piece per contiguous run of the row-major walk.
  runs = 3,
  // A compact copy the exporter made of a tensor whose span has gaps or
  // repeats (broadcasts, slices with short rows), in pieces of
  // max_piece_bytes (one piece before protocol version 5).
  gathered = 4,
};

struct hold_request {
  std::uint32_t magic = protocol_magic;
  std::uint16_t version = protocol_version;
  // 1: send the bytes as pieces; 0: no pieces (RMA, trusted peers only).
  std::uint8_t send_bytes = 1;
  // request_bytes_with_grant, or 0. Other bits are ignored.
  std::uint8_t flags = 0;
  std::uint64_t lease_id = 0;
  std::uint64_t request_id = 0;
  // description_digest of the descriptor the importer validated: the
  // exporter refuses a hold for another description than its tensor's.
  std::uint64_t digest = 0;
};

// hold_request::flags: the importer takes a one-piece tensor's bytes as the
// grant's data, the hold then ended by the exporter.
inline constexpr std::uint8_t request_bytes_with_grant = 1;
// hold_request::flags: the data lists the members asked for (member_request,
// rising indices, at least one, sent eagerly); `digest` is then 0. Without
// it, the publication must hold one tensor, and `digest` is its.
inline constexpr std::uint8_t request_members = 2;
struct member_request {
  std::uint32_t index = 0;
  std::uint32_t reserved = 0;
  std::uint64_t digest = 0;
};
// The most members a publication holds (remote_bundle::max_members).
inline constexpr std::uint32_t max_members = 4096;
// hold_reply::flags: the grant carries its only piece as its data, and the
// hold is over (no release follows).
inline constexpr std::uint8_t reply_bytes_with_grant = 1;
// The largest piece an exporter sends with a grant: the size up to which it
// sends pieces eagerly (with their message) anyway.
inline constexpr std::uint64_t max_bytes_with_grant = std::uint64_t{64} << 10;

// A bundle's grant (an answer to request_members) carries, as its data,
// how each member asked for is sent, in the order asked; its own plan is
// none and its pieces the sum.
struct member_plan {
  std::uint8_t plan = 0;  // a piece_plan
  std::uint8_t reserved[7] = {};
  std::uint64_t pieces = 0;
};

// Several members' only pieces in one message (members of one piece, whole
// or dense, of at most max_packed_piece bytes, or in a grant with its bytes
// any such members): the data is `entries`
// packed_entry records, then their bytes back to back in the records'
// order, `bytes` of them, sent eagerly. In a bundle's grant with its bytes
// (reply_bytes_with_grant), this header and its data follow the plans.
struct packed {
  std::uint32_t magic = protocol_magic;
  std::uint32_t entries = 0;
  std::uint64_t request_id = 0;
  std::uint64_t bytes = 0;
};
struct packed_entry {
  std::uint32_t member = 0;  // its place in the request's list
  std::uint8_t plan = 0;     // the member's piece_plan: whole or dense
  std::uint8_t reserved[3] = {};
  std::uint64_t length = 0;
};
inline constexpr std::uint64_t max_packed_piece = std::uint64_t{16} << 10;
// The most data (records and bytes) one packed message carries.
inline constexpr std::uint64_t max_packed_bytes = std::uint64_t{64} << 10;

struct hold_reply {
  std::uint32_t magic = protocol_magic;
  // An absl::StatusCode; 0 (OK) grants the hold.
  std::int32_t code = 0;
  std::uint64_t request_id = 0;
  // The hold, as hold_release must name it.
  std::uint64_t hold_id = 0;
  std::uint64_t secret = 0;
  // Microseconds left on the lease when the exporter answered.
  std::uint64_t remaining_us = 0;
  std::uint8_t plan = 0;   // a piece_plan
  std::uint8_t flags = 0;  // reply_bytes_with_grant, or 0
  std::uint8_t reserved[6] = {};
  std::uint64_t pieces = 0;
  // The refusal's message, NUL-terminated.
  char message[192] = {};
};

struct hold_release {
  std::uint32_t magic = protocol_magic;
  std::uint16_t version = protocol_version;
  std::uint16_t reserved = 0;
  std::uint64_t lease_id = 0;
  std::uint64_t hold_id = 0;
  std::uint64_t secret = 0;
};

// Piece `index` of `count` of request `request_id`'s bytes of its member
// `member` (its place in the request's list; 0 for one tensor): `length`
// bytes at `offset` of the importer's buffer for that member, carried as the
// message's data (UCX's rendezvous for large ones). A code other than 0 (an
// absl::StatusCode) says the exporter could not send the bytes; no data.
struct piece {
  std::uint32_t magic = protocol_magic;
  std::int32_t code = 0;
  std::uint64_t request_id = 0;
  std::uint8_t plan = 0;  // a piece_plan
  std::uint8_t reserved[3] = {};
  std::uint32_t member = 0;
  std::uint64_t index = 0;
  std::uint64_t count = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

}  // namespace dlasync::remote_detail

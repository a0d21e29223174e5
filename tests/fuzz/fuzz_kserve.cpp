// libFuzzer target: the inference server's KServe v2 intake on arbitrary
// bytes. The first byte chooses the parser:
//   0: an HTTP/1.1 byte stream through http_parse, fed in pieces whose sizes
//      the input chooses, bodies taken as the server takes them;
//   1: a REST infer body (JSON, then binary data) through
//      parse_infer_request, the next two bytes giving the JSON's length;
//   2: a gRPC ModelInferRequest (protobuf bytes) through from_message.
//
// What must hold for every input (else the target traps):
//   - nothing is read out of bounds (ASan);
//   - an accepted request is consistent: every input's bytes are what its
//     shape and datatype take, and lie inside the body or the message when
//     they come from it;
//   - every byte taken from the memory budget is given back once the request
//     is dropped;
//   - the HTTP parse never takes more body than the head announced.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "dlasync/dlasync.hpp"
#include "http_parse.hpp"
#include "kserve_grpc.hpp"
#include "kserve_json.hpp"

namespace {

using namespace dlasync;
using namespace dlasync::examples;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_kserve: %s\n", what);
  __builtin_trap();
}

bool inside(const std::byte* p, std::uint64_t n, const void* base, std::uint64_t length) {
  const auto* b = static_cast<const std::byte*>(base);
  return p >= b && n <= length && static_cast<std::uint64_t>(p - b) <= length - n;
}

void check_inputs(const kserve::infer_request& r) {
  for (const kserve::input_tensor& in : r.inputs) {
    const std::optional<std::uint64_t> bytes = kserve::byte_size(in.type, in.shape);
    if (!bytes || *bytes != in.bytes) fail("an input's size is not what shape and dtype take");
    if (!in.shm && in.data == nullptr && in.bytes > 0) fail("an input without bytes");
  }
}

void fuzz_http(const std::uint8_t* data, std::size_t size) {
  http_parse p(512, 4096);
  std::vector<std::byte> body;
  std::size_t at = 0;
  const std::uint8_t step = size > 0 ? static_cast<std::uint8_t>(data[0] % 61 + 1) : 1;
  while (at < size) {
    const std::size_t n = std::min<std::size_t>(step, size - at);
    const std::size_t took = p.feed(reinterpret_cast<const char*>(data + at), n);
    if (took > n) fail("feed took more than it was given");
    at += took;
    switch (p.at()) {
      case http_parse::stage::head_done:
        if (p.head().content_length && !p.head().chunked) {
          if (*p.head().content_length > 4096) return;  // the server refuses it (413)
          body.assign(*p.head().content_length + 1, std::byte{0});
          p.body_into(body.data());
        }
        p.go_on();
        break;
      case http_parse::stage::complete:
        if (p.head().content_length && p.body_received() != *p.head().content_length) {
          fail("a complete body differs from its Content-Length");
        }
        if (p.chunked_body().size() > 4096) fail("a chunked body past its limit");
        if (!p.head().keep_alive) return;
        p.next();
        break;
      case http_parse::stage::failed: return;
      default:
        if (took == 0) return;
    }
  }
}

void fuzz_rest(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return;
  kserve::request_body body;
  body.length = size - 2;
  body.bytes = std::shared_ptr<std::byte[]>(new std::byte[body.length + 1]);
  std::memcpy(body.bytes.get(), data + 2, body.length);
  const std::uint16_t header = static_cast<std::uint16_t>(data[0] | data[1] << 8);
  if (header != 0xFFFF) body.header_length = header;
  memory_budget budget(1 << 20);
  {
    absl::StatusOr<kserve::infer_request> r = kserve::parse_infer_request(body, "m", "", budget);
    if (r.ok()) {
      check_inputs(*r);
      for (const kserve::input_tensor& in : r->inputs) {
        if (in.owner == body.bytes && !inside(in.data, in.bytes, body.bytes.get(), body.length)) {
          fail("binary data outside the body");
        }
      }
    }
  }
  if (budget.in_use() != 0) fail("the budget was not given back");
}

void fuzz_grpc(const std::uint8_t* data, std::size_t size) {
  // The bound on what parsing builds, walked before parsing, on any bytes;
  // the same bytes in pieces (as gRPC's slices come) must give the same.
  const google::protobuf::Descriptor& type = *inference::ModelInferRequest::descriptor();
  const absl::StatusOr<std::uint64_t> whole = kserve::parsed_bytes_bound(type, data, size);
  std::vector<std::span<const std::byte>> pieces;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  for (std::size_t at = 0, cut = 1; at < size; at += cut, cut = cut * 3 % 61 + 1) {
    pieces.emplace_back(bytes + at, std::min(cut, size - at));
  }
  const absl::StatusOr<std::uint64_t> in_pieces = kserve::parsed_bytes_bound(type, pieces);
  if (whole.ok() != in_pieces.ok() || (whole.ok() && *whole != *in_pieces)) {
    fail("the bound differs for the same bytes in pieces");
  }
  inference::ModelInferRequest m;
  if (!m.ParseFromArray(data, static_cast<int>(size))) return;
  memory_budget budget(1 << 20);
  {
    const std::shared_ptr<void> owner = std::make_shared<int>(0);
    absl::StatusOr<kserve::infer_request> r = kserve::from_message(m, owner, budget);
    if (r.ok()) {
      check_inputs(*r);
      for (const kserve::input_tensor& in : r->inputs) {
        if (in.owner != owner) continue;
        bool found = false;
        for (const std::string& raw : m.raw_input_contents()) {
          found = found || inside(in.data, in.bytes, raw.data(), raw.size());
        }
        if (!found || !in.read_only) fail("raw contents outside the message, or writable");
      }
    }
  }
  if (budget.in_use() != 0) fail("the budget was not given back");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  switch (data[0] % 3) {
    case 0: fuzz_http(data + 1, size - 1); break;
    case 1: fuzz_rest(data + 1, size - 1); break;
    default: fuzz_grpc(data + 1, size - 1); break;
  }
  return 0;
}

// libFuzzer target: the inference server's frame parser on arbitrary bytes,
// and what the server does with a frame it accepts.
//
// What must hold for every input (else the target traps):
//   - read_frame_header and parse_request never read out of bounds (ASan);
//   - an accepted request is consistent: ndim within the limit, the payload
//     exactly what shape and strides reach, and encoding it again gives back
//     the same bytes;
//   - importing an accepted request onto the host, as the server does,
//     succeeds or fails with a status, and calls the deleter exactly once.
#include <atomic>
#include <cstdio>
#include <cstring>

#include "asio/use_future.hpp"
#include "dlasync/dlasync.hpp"
#include "frame.hpp"

namespace {

using namespace dlasync;
using namespace dlasync::examples;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_frame: %s\n", what);
  __builtin_trap();
}

runtime& host_runtime() {
  static runtime* rt = [] {
    runtime_options o;
    o.topology = process_topology::single_process();
    o.worker_threads = 1;
    o.cuda = "off";
    o.copy_memory_budget = 32 << 20;
    absl::StatusOr<std::unique_ptr<runtime>> created = runtime::create(std::move(o));
    if (!created.ok()) fail("runtime::create failed");
    return created->release();
  }();
  return *rt;
}

struct counted {
  DLManagedTensorVersioned managed{};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::atomic<int>* count = nullptr;
  static void destroy(DLManagedTensorVersioned* self) {
    auto* c = static_cast<counted*>(self->manager_ctx);
    c->count->fetch_add(1);
    delete c;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < frame_header_bytes) return 0;
  // The body in its own allocation, so that ASan sees every overread.
  std::array<std::byte, frame_header_bytes> header;
  std::memcpy(header.data(), data, header.size());
  std::vector<std::byte> body(size - frame_header_bytes);
  if (!body.empty()) std::memcpy(body.data(), data + frame_header_bytes, body.size());

  const absl::StatusOr<std::uint32_t> length = read_frame_header(header, request_magic, 1 << 20);
  if (length.ok() && *length > (1u << 20)) fail("a body over the limit was accepted");
  absl::StatusOr<request> req = parse_request(body);
  if (!req.ok()) return 0;

  if (req->shape.size() > static_cast<std::size_t>(max_frame_ndim)) fail("ndim over the limit");
  if (req->payload_offset + req->payload_bytes != body.size()) fail("payload not at the end");
  const std::optional<std::uint64_t> expected =
      payload_bytes_for(req->type, req->shape, req->strides);
  if (!expected || *expected != req->payload_bytes) fail("payload size not what shape reaches");
  const std::vector<std::byte> again = encode_request(req->id, req->type, req->shape, req->strides,
                                                      std::span(body).subspan(req->payload_offset));
  if (again.size() != size ||
      std::memcmp(again.data() + frame_header_bytes, body.data(), body.size()) != 0) {
    fail("encoding the parsed request does not give back its bytes");
  }

  // What the server does next: wrap the payload, import it onto the host,
  // compact.
  std::atomic<int> count{0};
  auto* c = new counted;
  c->count = &count;
  c->shape = req->shape;
  c->strides = req->strides;
  DLTensor& dl = c->managed.dl_tensor;
  dl.data = body.data() + req->payload_offset;
  dl.device = to_dl_device(host_device);
  dl.ndim = static_cast<std::int32_t>(c->shape.size());
  dl.dtype = req->type.to_dl();
  dl.shape = c->shape.data();
  dl.strides = c->strides.data();
  c->managed.version = {dlpack_major_version, dlpack_minor_version};
  c->managed.manager_ctx = c;
  c->managed.deleter = &counted::destroy;
  managed_tensor source(&c->managed);
  import_options options;
  options.require_contiguous = true;
  absl::StatusOr<tensor> t =
      async_import_dlpack(host_runtime(), source, options, asio::use_future).get();
  if (t.ok() && !t->is_compact()) fail("require_contiguous gave a strided tensor");
  t = absl::UnknownError("dropped");
  source.reset();
  for (int spin = 0; count.load() != 1 && spin < 1000000; ++spin) {
    if (count.load() > 1) break;
  }
  if (count.load() != 1) fail("deleter not called exactly once");
  return 0;
}

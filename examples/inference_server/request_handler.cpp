#include "request_handler.hpp"

#include <span>
#include <string>

namespace dlasync::examples {

asio::awaitable<response> request_handler::handle(std::shared_ptr<std::byte[]> body,
                                                  std::uint32_t length) {
  const std::span<const std::byte> bytes(body.get(), length);
  absl::StatusOr<request> req = parse_request(bytes);
  if (!req.ok()) {
    co_return response{peek_request_id(bytes), req.status().code(), 0, 0,
                       std::string(req.status().message())};
  }
  // The payload is imported in place: the tensor keeps the body alive.
  tensor_description d;
  d.data = body.get() + req->payload_offset;
  d.dtype = req->type;
  d.shape = req->shape;
  if (!req->strides.empty()) d.strides = req->strides;
  managed_tensor source = make_managed_tensor(std::move(d), [body = std::move(body)] {});

  import_options options;
  options.target = target_;
  options.require_contiguous = true;
  options.consumer_stream = compute_.stream_for(target_);
  absl::StatusOr<tensor> t = co_await import_dlpack(rt_, source, options);
  if (!t.ok())
    co_return response{req->id, t.status().code(), 0, 0, std::string(t.status().message())};
  absl::StatusOr<double> sum = co_await compute_.sum(*t, options.consumer_stream);
  if (!sum.ok()) {
    co_return response{req->id, sum.status().code(), 0, 0, std::string(sum.status().message())};
  }
  co_return response{req->id, absl::StatusCode::kOk, *sum, t->element_count(), target_.name()};
}

}  // namespace dlasync::examples

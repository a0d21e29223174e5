#include "grpc_front.hpp"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "common/awaitables.hpp"
#include "grpc_service.grpc.pb.h"
#include "kserve_grpc.hpp"
#include "kserve_service.hpp"

#ifndef DLASYNC_SERVER_VERSION
#define DLASYNC_SERVER_VERSION "unknown"
#endif

namespace dlasync::examples {
namespace {

grpc::Status to_grpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return {static_cast<grpc::StatusCode>(s.code()), std::string(s.message())};
}

// An inference's reactor. The call is finished from the server's executor,
// after the response was written there; gRPC then destroys the messages on
// its own threads, after OnDone. The release in finish() and the acquire in
// OnDone() order the two for every observer, ThreadSanitizer included (it
// cannot see the synchronization inside Debian's uninstrumented gRPC).
class infer_reactor final : public grpc::ServerUnaryReactor {
 public:
  void finish(const grpc::Status& s) {
    published_.store(true, std::memory_order_release);
    Finish(s);
  }
  void OnDone() override {
    (void)published_.load(std::memory_order_acquire);
    delete this;
  }

 private:
  std::atomic<bool> published_{false};
};

}  // namespace

struct grpc_front::server_holder {
  std::unique_ptr<grpc::Server> server;
};

class grpc_front::service final : public inference::GRPCInferenceService::CallbackService {
 public:
  service(asio::any_io_executor executor, kserve::model_handler& models, kserve::shm_registry& shm,
          std::shared_ptr<memory_budget> budget, buffer_pool& pool, server_stats& stats)
      : executor_(std::move(executor)),
        models_(models),
        shm_(shm),
        budget_(std::move(budget)),
        pool_(pool),
        stats_(stats) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const inference::ServerLiveRequest* /*request*/,
                                       inference::ServerLiveResponse* response) override {
    response->set_live(true);
    return finish(ctx, absl::OkStatus());
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const inference::ServerReadyRequest* /*request*/,
                                        inference::ServerReadyResponse* response) override {
    response->set_ready(true);
    return finish(ctx, absl::OkStatus());
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override {
    response->set_ready(models_.find(request->name(), request->version()).ok());
    return finish(ctx, absl::OkStatus());
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const inference::ServerMetadataRequest* /*request*/,
                                           inference::ServerMetadataResponse* response) override {
    response->set_name("dlasync");
    response->set_version(DLASYNC_SERVER_VERSION);
    response->add_extensions("binary_tensor_data");
    response->add_extensions("system_shared_memory");
    return finish(ctx, absl::OkStatus());
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override {
    absl::StatusOr<const kserve::model_metadata*> m =
        models_.find(request->name(), request->version());
    if (m.ok()) kserve::to_message(**m, *response);
    return finish(ctx, m.status());
  }

  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(
      grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryStatusRequest* request,
      inference::SystemSharedMemoryStatusResponse* response) override {
    std::optional<std::string> name;
    if (!request->name().empty()) name = request->name();
    absl::StatusOr<std::vector<kserve::shm_region_info>> regions = shm_.status(name);
    if (regions.ok()) {
      for (const kserve::shm_region_info& r : *regions) {
        auto& status = (*response->mutable_regions())[r.name];
        status.set_name(r.name);
        status.set_key(r.key);
        status.set_offset(r.offset);
        status.set_byte_size(r.byte_size);
      }
    }
    return finish(ctx, regions.status());
  }

  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(
      grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryRegisterRequest* request,
      inference::SystemSharedMemoryRegisterResponse* /*response*/) override {
    return finish(
        ctx, shm_.add(request->name(), request->key(), request->offset(), request->byte_size()));
  }

  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(
      grpc::CallbackServerContext* ctx,
      const inference::SystemSharedMemoryUnregisterRequest* request,
      inference::SystemSharedMemoryUnregisterResponse* /*response*/) override {
    if (!request->name().empty()) return finish(ctx, shm_.remove(request->name()));
    if (!shm_.allowed()) return finish(ctx, shm_.status(std::nullopt).status());
    shm_.remove_all();
    return finish(ctx, absl::OkStatus());
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override {
    const std::uint64_t bytes = request->ByteSizeLong();
    if (bytes > budget_->limit()) {
      return finish(ctx, over_whole_budget(bytes, budget_->limit()));
    }
    auto* reactor = new infer_reactor();  // deletes itself in OnDone
    stats_.bytes_received.fetch_add(bytes);
    // The call finishes when the last user of the request's bytes lets go:
    // this coroutine, or a tensor that views raw_input_contents in place.
    // Its bytes count against the memory budget from the grant until then.
    auto state = std::make_shared<call_state>();
    std::shared_ptr<void> call(nullptr, [reactor, state, budget = budget_](void*) {
      if (state->held > 0) budget->release(state->held);
      reactor->finish(state->status);
    });
    asio::co_spawn(executor_, infer(request, response, bytes, std::move(call), state),
                   asio::detached);
    return reactor;
  }

 private:
  struct call_state {
    grpc::Status status;
    std::uint64_t held = 0;  // bytes granted from the memory budget
  };

  grpc::ServerUnaryReactor* finish(grpc::CallbackServerContext* ctx, const absl::Status& s) {
    stats_.count_answer(s.code());
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(to_grpc(s));
    return reactor;
  }

  // Waits for room in the memory budget, as the other fronts' requests do,
  // then answers.
  asio::awaitable<void> infer(const inference::ModelInferRequest* request,
                              inference::ModelInferResponse* response, std::uint64_t bytes,
                              std::shared_ptr<void> call, std::shared_ptr<call_state> state) {
    // (Not a conditional expression: GCC 12 destroys a co_await's result in
    // one twice.)
    absl::Status s;
    if (bytes > 0) s = co_await acquire(*budget_, bytes);
    if (s.ok()) {
      state->held = bytes;
      s = co_await kserve::message_server{models_, shm_, *budget_, pool_}.answer(*request, call,
                                                                                 *response);
    }
    stats_.count_answer(s.code());
    state->status = to_grpc(s);
    if (!s.ok()) response->Clear();
  }

  asio::any_io_executor executor_;
  kserve::model_handler& models_;
  kserve::shm_registry& shm_;
  std::shared_ptr<memory_budget> budget_;
  buffer_pool& pool_;
  server_stats& stats_;
};

absl::StatusOr<std::unique_ptr<grpc_front>> grpc_front::start(
    const options& o, asio::any_io_executor executor, kserve::model_handler& models,
    kserve::shm_registry& shm, std::shared_ptr<memory_budget> budget, buffer_pool& pool,
    server_stats& stats) {
  std::unique_ptr<grpc_front> front(new grpc_front());
  front->service_ =
      std::make_unique<service>(std::move(executor), models, shm, std::move(budget), pool, stats);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(o.address, ":", o.port), grpc::InsecureServerCredentials(),
                           &front->port_);
  builder.RegisterService(front->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(o.max_message));
  builder.SetMaxSendMessageSize(static_cast<int>(o.max_message));
  if (o.memory_quota > 0) {
    grpc::ResourceQuota quota("dlasync_server");
    quota.Resize(static_cast<std::size_t>(o.memory_quota));
    builder.SetResourceQuota(quota);
  }
  front->server_ = std::make_unique<server_holder>();
  front->server_->server = builder.BuildAndStart();
  if (!front->server_->server || front->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve gRPC on ", o.address, ":", o.port, " (in use?)"));
  }
  return front;
}

void grpc_front::stop() {
  if (server_ && server_->server) {
    server_->server->Shutdown();
    server_->server->Wait();
  }
}

grpc_front::~grpc_front() {
  stop();
}

}  // namespace dlasync::examples

#include "grpc_front.hpp"

#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "asio/steady_timer.hpp"
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

// A connection handed to gRPC: its descriptor, what it was (device and
// inode), and its slot.
struct grpc_front::adopted {
  int fd = -1;
  dev_t device = 0;
  ino_t inode = 0;
  connection_limit::slot slot;

  // Whether the descriptor is still this connection's socket: gRPC closes
  // it without telling, and the number may be reused since.
  bool open() const {
    struct stat now {};
    return fstat(fd, &now) == 0 && now.st_dev == device && now.st_ino == inode;
  }
};

struct grpc_front::adoptions {
  adoptions(const asio::any_io_executor& executor, std::chrono::milliseconds every)
      : timer(executor), interval(every) {}

  std::mutex mutex;
  std::vector<adopted> live;
  bool stopped = false;
  asio::steady_timer timer;  // the sweep's, used under the mutex
  const std::chrono::milliseconds interval;

  // Gives back the slots of the connections gRPC has closed. Requires the
  // mutex.
  void sweep_locked() {
    std::erase_if(live, [](const adopted& a) { return !a.open(); });
  }

  // The next sweep, after `interval`. Requires the mutex.
  static void arm_locked(const std::shared_ptr<adoptions>& self) {
    self->timer.expires_after(self->interval);
    self->timer.async_wait([weak = std::weak_ptr<adoptions>(self)](const asio::error_code& ec) {
      const std::shared_ptr<adoptions> a = weak.lock();
      if (ec || a == nullptr) return;
      std::lock_guard lock(a->mutex);
      if (a->stopped) return;
      a->sweep_locked();
      arm_locked(a);
    });
  }
};

// ModelInfer takes the request's bytes (a raw method), so that they are
// walked against the message's descriptor and bounded before protobuf
// parses them, as the UCX transport's are: a message of many tiny fields
// parses into a hundred times its size.
using infer_service = inference::GRPCInferenceService::WithRawCallbackMethod_ModelInfer<
    inference::GRPCInferenceService::CallbackService>;

class grpc_front::service final : public infer_service {
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

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* /*ctx*/,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override {
    auto* reactor = new infer_reactor();  // deletes itself in OnDone
    const std::uint64_t bytes = request->Length();
    if (bytes > budget_->limit()) {
      return finish_infer(reactor, over_whole_budget(bytes, budget_->limit()));
    }
    stats_.bytes_received.fetch_add(bytes);
    // The message's slices, shared with gRPC's buffer (which gRPC frees
    // once the call is finished).
    auto slices = std::make_shared<std::vector<grpc::Slice>>();
    if (const grpc::Status dumped = request->Dump(slices.get()); !dumped.ok()) {
      return finish_infer(reactor,
                          absl::InvalidArgumentError(absl::StrCat(
                              "the request's bytes could not be read: ", dumped.error_message())));
    }
    kserve::serialized_message m;
    m.pieces.reserve(slices->size());
    for (const grpc::Slice& slice : *slices) {
      m.pieces.emplace_back(reinterpret_cast<const std::byte*>(slice.begin()), slice.size());
    }
    m.owner = std::move(slices);
    asio::co_spawn(executor_, infer(std::move(m), bytes, reactor, response), asio::detached);
    return reactor;
  }

 private:
  grpc::ServerUnaryReactor* finish(grpc::CallbackServerContext* ctx, const absl::Status& s) {
    stats_.count_answer(s.code());
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(to_grpc(s));
    return reactor;
  }

  // Counts an inference's answer and finishes its call with it.
  grpc::ServerUnaryReactor* finish_infer(infer_reactor* reactor, const absl::Status& s) {
    stats_.count_answer(s.code());
    reactor->finish(to_grpc(s));
    return reactor;
  }

  // Waits for room in the memory budget for the message's bytes, as the
  // other fronts' requests do, then answers it as the UCX transport's are
  // (message_server::answer_serialized): the parsed message holds that room
  // until the last tensor viewing its raw contents is released, which may
  // be after the call is finished.
  asio::awaitable<void> infer(kserve::serialized_message m, std::uint64_t bytes,
                              infer_reactor* reactor, grpc::ByteBuffer* response) {
    absl::StatusOr<std::string> answer;
    // (Not a conditional expression: GCC 12 destroys a co_await's result in
    // one twice.)
    absl::Status granted;
    if (bytes > 0) granted = co_await acquire(*budget_, bytes);
    if (!granted.ok()) {
      answer = granted;
    } else {
      std::shared_ptr<void> room;
      if (bytes > 0) {
        room = std::shared_ptr<void>(nullptr,
                                     [budget = budget_, bytes](void*) { budget->release(bytes); });
      }
      answer = co_await kserve::message_server{models_, shm_, *budget_, pool_}.answer_serialized(
          std::move(m), std::move(room));
    }
    const absl::Status status = answer.status();
    if (answer.ok()) {
      // The serialized response handed to gRPC without a copy: the slice
      // owns the string.
      auto* owned = new std::string(*std::move(answer));
      grpc::Slice slice(
          owned->data(), owned->size(), [](void* p) { delete static_cast<std::string*>(p); },
          owned);
      *response = grpc::ByteBuffer(&slice, 1);
    }
    finish_infer(reactor, status);
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
  front->adopted_ = std::make_shared<adoptions>(executor, o.sweep_interval);
  front->service_ =
      std::make_unique<service>(std::move(executor), models, shm, std::move(budget), pool, stats);
  // No listening port of gRPC's own: the server's accept loop hands it the
  // connections (adopt()).
  grpc::ServerBuilder builder;
  builder.RegisterService(front->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(o.max_message));
  builder.SetMaxSendMessageSize(static_cast<int>(o.max_message));
  // A silent connection would hold its slot of --max_connections for good:
  // gRPC closes one with no call for the idle time (the connections handed
  // over skip gRPC's handshake, and its deadline).
  if (o.idle_timeout.count() > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               static_cast<int>(std::min<std::int64_t>(
                                   o.idle_timeout.count(), std::numeric_limits<int>::max())));
  }
  if (o.memory_quota > 0) {
    grpc::ResourceQuota quota("dlasync_server");
    quota.Resize(static_cast<std::size_t>(o.memory_quota));
    builder.SetResourceQuota(quota);
  }
  front->stop_grace_ = o.stop_grace.count() > 0 ? o.stop_grace : std::chrono::milliseconds(1000);
  front->server_ = std::make_unique<server_holder>();
  front->server_->server = builder.BuildAndStart();
  if (!front->server_->server) return absl::UnavailableError("gRPC's server did not start");
  std::lock_guard lock(front->adopted_->mutex);
  adoptions::arm_locked(front->adopted_);
  return front;
}

void grpc_front::adopt(asio::ip::tcp::socket socket, connection_limit::slot slot) {
  asio::error_code ec;
  socket.set_option(asio::ip::tcp::no_delay(true), ec);
  socket.native_non_blocking(true, ec);
  struct stat was {};
  if (ec || fstat(socket.native_handle(), &was) != 0) return;  // closed, its slot given back
  std::lock_guard lock(adopted_->mutex);
  if (adopted_->stopped) return;
  const int fd = socket.release(ec);
  if (ec) return;
  adopted_->live.push_back(adopted{fd, was.st_dev, was.st_ino, std::move(slot)});
  // gRPC owns the descriptor from here on, and closes it. Under the mutex,
  // so that stop() cannot shut the server down in between.
  grpc::AddInsecureChannelFromFd(server_->server.get(), fd);
}

void grpc_front::stop() {
  {
    std::lock_guard lock(adopted_->mutex);
    if (adopted_->stopped) return;
    // The sweep stops at its next turn (at most one interval away).
    adopted_->stopped = true;
  }
  if (server_ && server_->server) {
    // A call whose request never completes (a peer that stops mid-message)
    // would hold Shutdown() for good: past the grace, it is cancelled.
    server_->server->Shutdown(std::chrono::system_clock::now() + stop_grace_);
    server_->server->Wait();
  }
  // gRPC has closed every connection: their slots go back.
  std::lock_guard lock(adopted_->mutex);
  adopted_->live.clear();
}

grpc_front::~grpc_front() {
  stop();
}

}  // namespace dlasync::examples

#include "runtime/src/runtime_core.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "runtime/src/device_registry_factory.hpp"
#include "runtime/src/status_macros.hpp"

namespace dlasync::detail {

absl::StatusOr<std::unique_ptr<runtime>> create_runtime(runtime_options options,
                                                        runtime_hooks hooks) {
  DLASYNC_RETURN_IF_ERROR(check_options(options));
  process_topology topology;
  if (options.topology) {
    topology = *options.topology;
  } else {
    DLASYNC_ASSIGN_OR_RETURN(topology, process_topology::from_environment());
  }
  if (options.host_devices > 0) topology.host_device_count = options.host_devices;
  options.host_devices = topology.host_device_count;
  if (options.worker_threads == 0) {
    options.worker_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  if (options.cuda.empty()) {
    const char* env = std::getenv("DLASYNC_CUDA");
    options.cuda = env != nullptr ? env : "auto";
  }
  DLASYNC_ASSIGN_OR_RETURN(std::unique_ptr<runtime_core> core,
                           runtime_core::create(std::move(options), topology, std::move(hooks)));
  return runtime_access::wrap(std::move(core));
}

runtime_core::runtime_core(runtime_options options, runtime_hooks hooks)
    : options_(std::move(options)),
      hooks_(std::move(hooks)),
      budget_(std::make_shared<memory_budget>(options_.copy_memory_budget)),
      workers_(options_.worker_executor
                   ? std::make_unique<work_pool>(*options_.worker_executor)
                   : std::make_unique<work_pool>(options_.worker_threads,
                                                 options_.copy_helper_linger)) {}

absl::StatusOr<std::unique_ptr<runtime_core>> runtime_core::create(runtime_options options,
                                                                   const process_topology& topology,
                                                                   runtime_hooks hooks) {
  std::unique_ptr<runtime_core> core(new runtime_core(std::move(options), std::move(hooks)));
  DLASYNC_RETURN_IF_ERROR(core->start(topology));
  return core;
}

absl::Status runtime_core::start(const process_topology& topology) {
  host_backend_options host;
  host.host_devices = options_.host_devices;
  host.streams_per_device = options_.streams_per_device;
  host.cache_max_bytes = options_.host_cache_bytes;
  host_ = std::make_unique<host_backend>(host, *workers_);
  completions_->attach(*workers_);
  // What each backend announces is both the registry's entries and which
  // backend backend_for names for a kind.
  std::vector<served_devices> served;
  auto serve = [&](backend& b) {
    for (const served_devices& s : b.served()) {
      served.push_back(s);
      const auto code = static_cast<std::size_t>(s.kind);
      if (code < by_kind_.size()) by_kind_[code] = &b;
    }
  };
  serve(*host_);

  cuda_api_ = hooks_.cuda_api;
  if (!cuda_api_) {
    DLASYNC_ASSIGN_OR_RETURN(cuda_api_, cuda::make_api(options_.cuda, options_.simulation));
  }
  if (cuda_api_) {
    cuda_options o;
    o.streams_per_device = options_.streams_per_device;
    o.staging_streams = options_.staging_streams;
    o.staging_chunk_bytes = options_.staging_chunk_bytes;
    o.staging_chunks = options_.staging_chunks;
    o.completions = completions_;
    o.chunks_in_use = chunks_in_use_;
    DLASYNC_ASSIGN_OR_RETURN(cuda_, cuda_backend::create(cuda_api_, o, [&topology](int ordinal) {
                               return topology.owns_cuda_ordinal(ordinal);
                             }));
    // Page-locked memory is the CUDA backend's to place once there is one;
    // without it, the host backend serves cuda_host for reading only.
    std::erase_if(served, [](const served_devices& s) { return s.kind == device_kind::cuda_host; });
    serve(*cuda_);
    staging_chunks_ = static_cast<std::uint64_t>(options_.staging_chunks);
  }
  DLASYNC_ASSIGN_OR_RETURN(device_registry registry,
                           detail::device_registry_factory::create(topology, served));
  registry_.emplace(std::move(registry));
  const auto gpus = static_cast<std::size_t>(cuda_ ? cuda_->device_count() : 0);
  next_stream_ = std::make_unique<std::atomic<std::uint32_t>[]>(
      static_cast<std::size_t>(options_.host_devices) + 1 + gpus);
  if (options_.executor) {
    executor_ = *options_.executor;  // the caller runs it
  } else {
    executor_ = io_.get_executor();
    work_.emplace(io_.get_executor());
    for (int i = 0; i < options_.executor_threads; ++i) {
      executor_threads_.emplace_back([this] { run_executor(); });
    }
  }
  return absl::OkStatus();
}

void runtime_core::run_executor() {
  while (true) {
    try {
      io_.run();
      return;
    } catch (...) {
      // A handler threw: report it and go on serving the other handlers,
      // instead of terminating the process (runtime_options).
      handler_exceptions_.fetch_add(1, std::memory_order_relaxed);
      const std::exception_ptr error = std::current_exception();
      try {
        if (options_.on_handler_exception) {
          options_.on_handler_exception(error);
        } else {
          std::rethrow_exception(error);
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr,
                     "dlasync: a handler on the runtime's executor threw (%s); the executor goes "
                     "on. Catch it in the handler, or set runtime_options::on_handler_exception\n",
                     e.what());
      } catch (...) {
        std::fprintf(stderr,
                     "dlasync: a handler on the runtime's executor threw a non-std exception; the "
                     "executor goes on\n");
      }
    }
  }
}

runtime_core::~runtime_core() {
  shutdown();
}

backend* runtime_core::backend_for(device_kind kind) noexcept {
  const auto code = static_cast<std::size_t>(kind);
  return code < by_kind_.size() ? by_kind_[code] : nullptr;
}

stream_slot runtime_core::next_stream(device d) noexcept {
  std::size_t slot = static_cast<std::size_t>(options_.host_devices);  // pinned host memory
  if (d.kind == device_kind::cpu) slot = static_cast<std::size_t>(d.ordinal);
  if (d.kind == device_kind::cuda) slot += 1 + static_cast<std::size_t>(d.ordinal);
  const std::uint32_t n = next_stream_[slot].fetch_add(1, std::memory_order_relaxed);
  return {d, static_cast<int>(n % static_cast<std::uint32_t>(options_.streams_per_device))};
}

runtime_stats runtime_core::stats() const noexcept {
  runtime_stats stats;
  counters_.read(stats);
  stats.imports_waiting_for_budget = budget_->waiting();
  // Not through cuda_, which shutdown resets: the counts outlive it.
  stats.staging_chunks_in_use =
      static_cast<std::uint64_t>(chunks_in_use_->load(std::memory_order_relaxed));
  stats.staging_chunks = staging_chunks_;
  return stats;
}

std::size_t runtime_core::in_flight() const {
  const auto inline_ops = static_cast<std::size_t>(inline_ops_.load(std::memory_order_relaxed));
  std::lock_guard lock(ops_mutex_);
  return ops_.size() + inline_ops;
}

std::uint64_t runtime_core::begin_operation(std::function<void()> cancel) {
  std::lock_guard lock(ops_mutex_);
  if (!accepting_.load(std::memory_order_acquire)) return 0;
  const std::uint64_t id = next_op_++;
  ops_[id] = std::move(cancel);
  return id;
}

void runtime_core::end_operation(std::uint64_t id) {
  std::lock_guard lock(ops_mutex_);
  ops_.erase(id);
  if (ops_.empty()) ops_done_.notify_all();
}

void runtime_core::shutdown() {
  std::vector<std::function<void()>> cancels;
  {
    std::unique_lock lock(ops_mutex_);
    if (shut_down_) {
      // Another caller runs it: return once it is done, as it will.
      shutdown_finished_.wait(lock, [this] { return shutdown_done_; });
      return;
    }
    shut_down_ = true;
    accepting_.store(false, std::memory_order_seq_cst);
    for (auto& [id, cancel] : ops_) cancels.push_back(cancel);
  }
  for (std::function<void()>& cancel : cancels) cancel();
  {
    std::unique_lock lock(ops_mutex_);
    ops_done_.wait(lock, [this] { return ops_.empty(); });
  }
  // Inline operations began before the store above (begin_inline): they
  // end on their callers' threads without anything to cancel.
  for (std::int64_t n = inline_ops_.load(std::memory_order_seq_cst); n != 0;
       n = inline_ops_.load(std::memory_order_seq_cst)) {
    inline_ops_.wait(n, std::memory_order_seq_cst);
  }
  // Every import has handed its source to the releaser: run their deleters
  // while the threads still run, so that a deleter that waits for something
  // of the runtime's (an import it started before shutdown) gets it. A
  // deleter that never returns holds shutdown for as long.
  releases_.drain();
  // Now stop the threads, once no CUDA completion callback is still handing
  // work to them. Completions that arrive later run on the reactor thread.
  if (cuda_) cuda_->quiesce();
  completions_->detach();
  work_.reset();
  io_.stop();
  for (std::thread& t : executor_threads_) t.join();
  workers_->drain();
  // Handlers still queued on the executor are destroyed without being
  // called, and with them the tensors they would have received.
  io_.shutdown();
  cuda_.reset();
  {
    std::lock_guard lock(ops_mutex_);
    shutdown_done_ = true;
  }
  shutdown_finished_.notify_all();
}

}  // namespace dlasync::detail

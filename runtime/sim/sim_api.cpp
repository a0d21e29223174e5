#include "runtime/sim/sim_api.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "runtime/sim/sim_site.hpp"
#include "runtime/sim/sim_state.hpp"

namespace dlasync::cuda {
namespace {

std::string_view check_setting() {
  const char* env = std::getenv("DLASYNC_SIM_CHECK");
  return env == nullptr ? std::string_view() : std::string_view(env);
}

std::atomic<std::uint64_t> next_sim_id{1};

}  // namespace

bool default_check_order() {
  return check_setting() != "off";
}

report_action default_report_action() {
  return check_setting() == "abort" ? report_action::abort : report_action::collect;
}

sim_api::sim_api(sim_options options)
    : options_(options),
      id_(next_sim_id.fetch_add(1)),
      device_used_(static_cast<std::size_t>(options.devices), 0),
      reusable_(static_cast<std::size_t>(options.devices)),
      reusable_bytes_(static_cast<std::size_t>(options.devices), 0),
      peer_enabled_(static_cast<std::size_t>(options.devices),
                    std::vector<bool>(static_cast<std::size_t>(options.devices), false)),
      pool_access_(peer_enabled_) {
  const int per_device = std::max(1, std::min(options_.copy_engines, 2));
  for (int i = 0; i < options_.devices * 2; ++i) {
    // With one engine both directions share it.
    if (per_device == 1 && i % 2 == 1) {
      engines_.push_back(nullptr);
    } else {
      engines_.push_back(std::make_unique<engine>());
    }
  }
  for (int d = 0; d < options_.devices; ++d) {
    std::shared_ptr<stream> s = new_stream(d, false, "the legacy default stream");
    s->legacy = true;
    legacy_streams_.push_back(std::move(s));
  }
}

sim_api::~sim_api() {
  // Streams finish their queues, then their threads end.
  std::unordered_map<void*, std::shared_ptr<stream>> streams;
  std::map<std::pair<std::thread::id, int>, std::shared_ptr<stream>> thread_streams;
  {
    std::lock_guard lock(mutex_);
    streams.swap(streams_);
    thread_streams.swap(thread_streams_);
  }
  streams.clear();
  thread_streams.clear();
  legacy_streams_.clear();
  for (auto& [address, a] : memory_) std::free(as_pointer(address));
  for (auto& blocks : reusable_) {
    for (auto& [size, pointer] : blocks) std::free(pointer);
  }
}

sim_stats sim_api::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::uint64_t sim_api::device_bytes_in_use(int device) const {
  std::lock_guard lock(mutex_);
  return device_used_.at(static_cast<std::size_t>(device));
}

std::uint64_t sim_api::host_bytes_pinned() const {
  std::lock_guard lock(mutex_);
  return pinned_;
}

std::vector<int> sim_api::contexts() const {
  std::lock_guard lock(mutex_);
  return contexts_;
}

void sim_api::open_context(int device) {
  std::lock_guard lock(mutex_);
  if (std::find(contexts_.begin(), contexts_.end(), device) == contexts_.end()) {
    contexts_.push_back(device);
  }
}

error sim_api::failed(error e) {
  // The context's error stays whatever cudaGetLastError does.
  if (e != error::success && e != error::not_ready) sim_last_error = e;
  return e;
}

error sim_api::get_last_error() {
  const error sticky = sticky_error();
  if (sticky != error::success) return sticky;
  return std::exchange(sim_last_error, error::success);
}

error sim_api::peek_at_last_error() {
  const error sticky = sticky_error();
  return sticky != error::success ? sticky : sim_last_error;
}

error sim_api::refuse(error e, const char* call, const std::string& message, site where) {
  report(absl::StrCat("rule: ", call, " (issued at ", site_name(where), ") fails with ",
                      error_name(e), " on a GPU: ", message));
  return failed(e);
}

error sim_api::unknown_handle(const char* call, const char* kind, site where) {
  return refuse(
      error::invalid_resource_handle, call,
      absl::StrCat("the ", kind, " handle names no live ", kind, " (destroyed, or never created)"),
      where);
}

void sim_api::report(std::string text) {
  text = absl::StrCat("dlasync simulated CUDA: ", text);
  report_count_.fetch_add(1);
  if (options_.on_report == report_action::abort) {
    std::fprintf(stderr, "%s\n(DLASYNC_SIM_CHECK=abort: stopping at the first report)\n",
                 text.c_str());
    std::fflush(stderr);
    std::abort();
  }
  if (options_.print_reports) std::fprintf(stderr, "%s\n", text.c_str());
  add_sim_report(absl::StrCat("#", id_, " ", text));
}

std::vector<std::string> sim_api::take_reports() {
  const std::string mine = absl::StrCat("#", id_, " ");
  std::vector<std::string> all = take_sim_reports();
  std::vector<std::string> taken;
  for (std::string& r : all) {
    if (r.starts_with(mine)) {
      taken.push_back(r.substr(mine.size()));
    } else {
      add_sim_report(std::move(r));
    }
  }
  return taken;
}

error sim_api::get_device_count(int* count) {
  if (error e = enter("cudaGetDeviceCount"); e != error::success) return failed(e);
  *count = options_.devices;
  return error::success;
}

error sim_api::set_device(int device) {
  if (error e = enter("cudaSetDevice"); e != error::success) return failed(e);
  if (device < 0 || device >= options_.devices) return failed(error::invalid_device);
  sim_current_device = device;
  sim_current_context = device;
  open_context(device);
  return error::success;
}

// Driver calls: no fault injection, no last error (cudart's state).
error sim_api::get_current_context(context_t* context) {
  // A context handle names its device, one past its ordinal.
  *context = sim_current_context < 0
                 ? nullptr
                 : as_pointer(static_cast<std::uintptr_t>(sim_current_context) + 1);
  return error::success;
}

error sim_api::set_current_context(context_t context) {
  if (context == nullptr) {
    sim_current_context = -1;
    sim_current_device = 0;  // cudaGetDevice's answer without a context
    return error::success;
  }
  const auto device = static_cast<int>(reinterpret_cast<std::uintptr_t>(context) - 1);
  if (device < 0 || device >= options_.devices) return error::invalid_value;
  sim_current_context = device;
  sim_current_device = device;
  return error::success;
}

error sim_api::get_device(int* device) {
  if (error e = enter("cudaGetDevice"); e != error::success) return failed(e);
  *device = sim_current_device;
  return error::success;
}

error sim_api::get_device_properties(device_properties* properties, int device) {
  if (error e = enter("cudaGetDeviceProperties"); e != error::success) return failed(e);
  if (device < 0 || device >= options_.devices) return failed(error::invalid_device);
  properties->name = absl::StrCat("dlasync simulated GPU ", device);
  properties->total_memory = options_.memory_per_device;
  properties->async_engine_count = options_.copy_engines;
  properties->concurrent_managed_access = false;
  properties->major = 9;
  properties->minor = 0;
  return error::success;
}

error sim_api::device_can_access_peer(int* can, int device, int peer) {
  if (error e = enter("cudaDeviceCanAccessPeer"); e != error::success) return failed(e);
  if (device < 0 || device >= options_.devices || peer < 0 || peer >= options_.devices) {
    return failed(error::invalid_device);
  }
  *can = device != peer ? 1 : 0;
  return error::success;
}

error sim_api::device_enable_peer_access(int peer) {
  if (error e = enter("cudaDeviceEnablePeerAccess"); e != error::success) return failed(e);
  if (peer < 0 || peer >= options_.devices || peer == sim_current_device) {
    return failed(error::invalid_device);
  }
  open_context(sim_current_device);
  open_context(peer);
  std::lock_guard lock(mutex_);
  auto enabled =
      peer_enabled_[static_cast<std::size_t>(sim_current_device)][static_cast<std::size_t>(peer)];
  if (enabled) return failed(error::peer_access_already_enabled);
  enabled = true;
  return error::success;
}

error sim_api::mem_pool_set_access(int device, int peer) {
  if (error e = enter("cudaMemPoolSetAccess"); e != error::success) return failed(e);
  if (device < 0 || device >= options_.devices || peer < 0 || peer >= options_.devices) {
    return failed(error::invalid_device);
  }
  open_context(device);
  open_context(peer);
  std::lock_guard lock(mutex_);
  pool_access_[static_cast<std::size_t>(device)][static_cast<std::size_t>(peer)] = true;
  return error::success;
}

}  // namespace dlasync::cuda

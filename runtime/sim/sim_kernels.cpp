#include <shared_mutex>

#include "absl/strings/str_cat.h"
#include "runtime/sim/sim_api.hpp"
#include "runtime/sim/sim_site.hpp"
#include "runtime/sim/sim_state.hpp"

namespace dlasync::cuda {

error sim_api::launch_kernel(std::shared_ptr<const device_kernel> kernel, stream_t stream_handle,
                             site where) {
  const char* name = kernel->name();
  if (error e = enter(name); e != error::success) return failed(e);
  std::shared_ptr<stream> s = find_stream(stream_handle);
  if (!s) {
    return unknown_handle(name, "stream", where);
  }
  if (s->device != sim_current_device) {
    return refuse(error::invalid_resource_handle, name,
                  absl::StrCat("it is launched on ", s->name, " while cuda:", sim_current_device,
                               " is current; a kernel launch fails on a stream of another device "
                               "(Programming Guide, Multi-Device System): make the stream's "
                               "device current"),
                  where);
  }
  const std::vector<memory_range> inputs = kernel->inputs();
  located out;
  std::vector<located> in;
  std::vector<std::vector<bool>> peers;
  std::vector<std::vector<bool>> pools;
  {
    std::lock_guard lock(mutex_);
    out = locate(kernel->output());
    for (const memory_range& r : inputs) in.push_back(locate(r.begin));
    peers = peer_enabled_;
    pools = pool_access_;
  }
  const auto here = static_cast<std::size_t>(s->device);
  if (kernel->output_bytes() > 0 &&
      (!out.known || out.info.status != state::live || out.info.type != memory_type::device ||
       out.info.device != s->device)) {
    return refuse(
        error::invalid_value, name,
        absl::StrCat("its output ", absl::Hex(reinterpret_cast<std::uintptr_t>(kernel->output())),
                     " is not live device memory of cuda:", s->device),
        where);
  }
  // What the GPU would fault on once the kernel runs (a sticky error).
  std::string fault;
  for (std::size_t i = 0; i < in.size() && fault.empty(); ++i) {
    const located& l = in[i];
    const auto address = reinterpret_cast<std::uintptr_t>(inputs[i].begin);
    if (inputs[i].bytes == 0) continue;
    if (!l.known) {
      fault = absl::StrCat("it reads ", absl::Hex(address), ", which is no CUDA memory");
    } else if (l.info.status != state::live) {
      fault = absl::StrCat("use after free: it reads ", absl::Hex(address),
                           ", device memory whose free was already ordered");
    } else if (l.info.type == memory_type::device && l.info.device != s->device) {
      const auto owner = static_cast<std::size_t>(l.info.device);
      if (l.info.pool ? !pools[owner][here] : !peers[here][owner]) {
        fault = absl::StrCat("it reads ", absl::Hex(address), ", ", l.info.pool ? "pool" : "device",
                             " memory of cuda:", l.info.device, ", without ",
                             l.info.pool ? "cudaMemPoolSetAccess" : "cudaDeviceEnablePeerAccess",
                             " for cuda:", s->device);
      }
    }
  }
  const op_label label{name, site_name(where)};
  if (!fault.empty()) {
    report(absl::StrCat("rule: ", name, " on ", s->name, " (issued at ", label.where,
                        ") faults with cudaErrorIllegalAddress on a GPU, and the context is "
                        "lost: ",
                        fault));
  }
  std::vector<access> accesses;
  accesses.reserve(inputs.size() + 1);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    accesses.push_back({reinterpret_cast<std::uintptr_t>(inputs[i].begin), inputs[i].bytes,
                        access_kind::read, in[i].base});
  }
  accesses.push_back({reinterpret_cast<std::uintptr_t>(kernel->output()), kernel->output_bytes(),
                      access_kind::write, out.base});
  const bool faults = !fault.empty();
  enqueue(
      s,
      [this, kernel = std::move(kernel), device = s->device, stream_name = s->name, label, faults,
       since = epoch()] {
        error e = error::success;
        {
          std::shared_lock running(running_);
          if (failed_since(since)) return;
          if (faults) {
            e = error::illegal_address;
          } else {
            run_copy(device, 2, kernel->output_bytes(), options_.device_to_device_gbps);
            e = kernel->simulate();
          }
        }
        if (e == error::success) return;
        if (!faults) {
          report(absl::StrCat("rule: ", label.call, " on ", stream_name, " (issued at ",
                              label.where, ") faulted with ", error_name(e),
                              " as it ran: a load or store the GPU makes is not aligned to its "
                              "size, or out of bounds; the context is lost (sticky)"));
        }
        make_sticky(e);
      },
      accesses, label);
  return error::success;
}

}  // namespace dlasync::cuda

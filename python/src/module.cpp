// python/src/module.cpp
//
// The `dlasync._core` extension: Device, Tensor, Runtime (synchronous
// imports and the starts of asyncio ones), the event-loop bridge, and the
// exit hook. python/dlasync/__init__.py adds the awaitable forms.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "dlasync/device_registry.hpp"
#include "dlasync/runtime.hpp"
#include "py_args.hpp"
#include "py_async.hpp"
#include "py_fastcall.hpp"
#include "py_release.hpp"
#include "py_runtime.hpp"
#include "py_tensor.hpp"

namespace py = pybind11;
using namespace dlasync;
using namespace dlasync::python;

namespace {

// A Runtime keyword: None leaves the C++ default; an int T cannot hold is a
// ValueError, another type a TypeError.
template <typename T>
void set_if(py::handle value, const char* name, T& field) {
  if (value.is_none()) return;
  field = int_arg<T>(value, name,
                     std::is_unsigned_v<T> ? "an int in [0, 2^64) or None" : "an int or None");
}

std::unique_ptr<py_runtime> make_runtime(
    const py::object& cuda, const py::object& workers, const py::object& executor_threads,
    const py::object& host_devices, const py::object& copy_memory_budget,
    const py::object& inline_copy_bytes, const py::object& parallel_copy_bytes,
    const py::object& host_cache_bytes, const py::object& streams_per_device,
    const py::object& staging_chunk_bytes, const py::object& staging_chunks,
    const py::object& staging_streams, const py::object& copy_helper_linger_us) {
  runtime_options o;
  if (!cuda.is_none()) {
    if (!py::isinstance<py::str>(cuda)) {
      throw py::type_error(absl::StrCat(
          "cuda takes \"off\", \"auto\", \"real\", \"sim\", \"sim:N\" or None; got ", seen(cuda)));
    }
    o.cuda = cuda.cast<std::string>();
  }
  o.worker_threads = int_arg<int>(workers, "workers", "an int");
  o.executor_threads = int_arg<int>(executor_threads, "executor_threads", "an int");
  o.host_devices = int_arg<int>(host_devices, "host_devices", "an int");
  o.copy_memory_budget =
      int_arg<std::uint64_t>(copy_memory_budget, "copy_memory_budget", "an int in [0, 2^64)");
  set_if(inline_copy_bytes, "inline_copy_bytes", o.inline_copy_bytes);
  set_if(parallel_copy_bytes, "parallel_copy_bytes", o.parallel_copy_bytes);
  set_if(host_cache_bytes, "host_cache_bytes", o.host_cache_bytes);
  set_if(streams_per_device, "streams_per_device", o.streams_per_device);
  set_if(staging_chunk_bytes, "staging_chunk_bytes", o.staging_chunk_bytes);
  set_if(staging_chunks, "staging_chunks", o.staging_chunks);
  set_if(staging_streams, "staging_streams", o.staging_streams);
  std::int64_t linger_us = o.copy_helper_linger.count();
  set_if(copy_helper_linger_us, "copy_helper_linger_us", linger_us);
  o.copy_helper_linger = std::chrono::microseconds(linger_us);
  return std::make_unique<py_runtime>(std::move(o));
}

import_args args_of(py::object device, py::object copy, py::object stream, py::object contiguous,
                    py::object writable) {
  return import_args{std::move(device), std::move(copy), std::move(stream), std::move(contiguous),
                     std::move(writable)};
}

// The devices an import can place a tensor on: those whose backend
// allocates there (cuda_managed memory is read, never written; cuda_host
// takes copies where a CUDA backend places them).
py::list import_targets(py_runtime& rt) {
  const device_registry& registry = rt.get().registry();
  py::list out;
  for (device d : registry.addressable_devices()) {
    const served_devices* served = registry.find(d.kind);
    if (served != nullptr && served->allocates) out.append(py_device{d});
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "dlasync's extension: asynchronous, validated DLPack imports";
  bind_device(m);
  bind_tensor(m);

  py::class_<loop_bridge, std::shared_ptr<loop_bridge>>(m, "_LoopBridge")
      .def(py::init<>())
      .def_property_readonly("fd", &loop_bridge::fd)
      .def("drain", &loop_bridge::drain);

  py::class_<import_call, std::shared_ptr<import_call>>(m, "_ImportCall")
      .def("cancel", &import_call::cancel);

  py::class_<py_runtime> runtime_class(
      m, "Runtime",
      R"(A dlasync runtime: its executor, copy workers, devices and copy budget.

Runtime(cuda=None, workers=0, ...): cuda is "off", "auto", "real", "sim" or
"sim:N" (N simulated GPUs); None reads DLASYNC_CUDA, else "auto". workers=0
means one per hardware thread. copy_memory_budget=0 means unlimited. A
context manager: leaving it shuts the runtime down, as shutdown() does.)");
  runtime_class
      .def(py::init(&make_runtime), py::kw_only(), py::arg("cuda") = py::none(),
           py::arg("workers") = py::int_(0), py::arg("executor_threads") = py::int_(1),
           py::arg("host_devices") = py::int_(0), py::arg("copy_memory_budget") = py::int_(0),
           py::arg("inline_copy_bytes") = py::none(), py::arg("parallel_copy_bytes") = py::none(),
           py::arg("host_cache_bytes") = py::none(), py::arg("streams_per_device") = py::none(),
           py::arg("staging_chunk_bytes") = py::none(), py::arg("staging_chunks") = py::none(),
           py::arg("staging_streams") = py::none(), py::arg("copy_helper_linger_us") = py::none())
      .def(
          "_start_batch",
          [](const py::object& self, const py::sequence& xs, std::shared_ptr<loop_bridge> bridge,
             py::handle future, py::handle return_exceptions, py::object device, py::object copy,
             py::object stream, py::object require_contiguous, py::object require_writable) {
            py_runtime& rt = self.cast<py_runtime&>();
            return rt.start_batch(
                self, xs,
                args_of(std::move(device), std::move(copy), std::move(stream),
                        std::move(require_contiguous), std::move(require_writable)),
                std::move(bridge), future, flag_arg(return_exceptions, "return_exceptions"));
          },
          py::arg("xs"), py::arg("bridge"), py::arg("future"), py::arg("return_exceptions"),
          py::kw_only(), py::arg("device") = py::none(), py::arg("copy") = py::none(),
          py::arg("stream") = py::none(), py::arg("require_contiguous") = py::bool_(false),
          py::arg("require_writable") = py::bool_(false))
      .def_property_readonly(
          "devices",
          [](py_runtime& rt) {
            py::list out;
            for (device d : rt.get().registry().addressable_devices()) out.append(py_device{d});
            return out;
          },
          "Every device this process addresses: a tensor there can be imported. Not all of them "
          "can receive one: see targets.")
      .def_property_readonly("targets", &import_targets,
                             "The devices an import can place a tensor on (device=): those of "
                             "devices where dlasync allocates. cuda_managed memory is read, never "
                             "allocated; cuda_host is a target where a CUDA backend serves it.")
      .def("is_simulated",
           [](py_runtime& rt, py::handle d) { return rt.get().is_simulated(parse_device(d)); })
      .def("describe",
           [](py_runtime& rt, py::handle d) { return rt.get().describe(parse_device(d)); })
      .def_property_readonly("in_flight", [](py_runtime& rt) { return rt.get().in_flight(); })
      .def_property_readonly("closed", &py_runtime::closed)
      .def("shutdown", &py_runtime::shutdown,
           "Refuses new imports, cancels those in flight and waits for them; idempotent.")
      .def("close", &py_runtime::shutdown)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_runtime& rt, const py::args&) {
        rt.shutdown();
        return false;
      });

  // from_dlpack and the start of import_dlpack, the most frequent calls,
  // without pybind11's dispatcher.
  add_fast_imports(runtime_class,
                   "from_dlpack($self, x, /, *, device=None, copy=None, stream=None, "
                   "require_contiguous=False, require_writable=False)\n--\n\n"
                   "Imports `x` (an object with __dlpack__, or a DLPack capsule) and returns a "
                   "Tensor.\n\nWaits for the import with the GIL released. device: where it "
                   "lands (None: where it is). copy: True always copies, False never "
                   "(ValueError when a copy is needed), None copies only when needed. stream: "
                   "the consumer stream passed to x.__dlpack__ (DLPack encoding); for a CUDA "
                   "producer dlasync names its own stream when None is given.");

  m.def("_at_exit", &py_runtime::at_exit);
  m.def("_skipped_releases", &skipped_releases,
        "Producer deleters skipped because they arrived on a foreign thread after exit began.");
}

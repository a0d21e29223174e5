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

#include "dlasync/runtime.hpp"
#include "py_async.hpp"
#include "py_release.hpp"
#include "py_runtime.hpp"
#include "py_tensor.hpp"

namespace py = pybind11;
using namespace dlasync;
using namespace dlasync::python;

namespace {

template <typename T>
void set_if(py::handle value, T& field) {
  if (!value.is_none()) field = value.cast<T>();
}

std::unique_ptr<py_runtime> make_runtime(
    const py::object& cuda, int workers, int executor_threads, int host_devices,
    std::uint64_t copy_memory_budget, const py::object& inline_copy_bytes,
    const py::object& parallel_copy_bytes, const py::object& host_cache_bytes,
    const py::object& streams_per_device, const py::object& staging_chunk_bytes,
    const py::object& staging_chunks, const py::object& staging_streams,
    const py::object& copy_helper_linger_us) {
  runtime_options o;
  if (!cuda.is_none()) o.cuda = cuda.cast<std::string>();
  o.worker_threads = workers;
  o.executor_threads = executor_threads;
  o.host_devices = host_devices;
  o.copy_memory_budget = copy_memory_budget;
  set_if(inline_copy_bytes, o.inline_copy_bytes);
  set_if(parallel_copy_bytes, o.parallel_copy_bytes);
  set_if(host_cache_bytes, o.host_cache_bytes);
  set_if(streams_per_device, o.streams_per_device);
  set_if(staging_chunk_bytes, o.staging_chunk_bytes);
  set_if(staging_chunks, o.staging_chunks);
  set_if(staging_streams, o.staging_streams);
  if (!copy_helper_linger_us.is_none()) {
    o.copy_helper_linger = std::chrono::microseconds(copy_helper_linger_us.cast<std::int64_t>());
  }
  return std::make_unique<py_runtime>(std::move(o));
}

import_args args_of(py::object device, py::object copy, py::object stream, bool contiguous,
                    bool writable) {
  return import_args{std::move(device), std::move(copy), std::move(stream), contiguous, writable};
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

  py::class_<py_runtime>(m, "Runtime",
                         R"(A dlasync runtime: its executor, copy workers, devices and copy budget.

Runtime(cuda=None, workers=0, ...): cuda is "off", "auto", "real", "sim" or
"sim:N" (N simulated GPUs); None reads DLASYNC_CUDA, else "auto". workers=0
means one per hardware thread. copy_memory_budget=0 means unlimited. A
context manager: leaving it shuts the runtime down, as shutdown() does.)")
      .def(py::init(&make_runtime), py::kw_only(), py::arg("cuda") = py::none(),
           py::arg("workers") = 0, py::arg("executor_threads") = 1, py::arg("host_devices") = 0,
           py::arg("copy_memory_budget") = 0, py::arg("inline_copy_bytes") = py::none(),
           py::arg("parallel_copy_bytes") = py::none(), py::arg("host_cache_bytes") = py::none(),
           py::arg("streams_per_device") = py::none(), py::arg("staging_chunk_bytes") = py::none(),
           py::arg("staging_chunks") = py::none(), py::arg("staging_streams") = py::none(),
           py::arg("copy_helper_linger_us") = py::none())
      .def(
          "from_dlpack",
          [](const py::object& self, py::handle x, py::object device, py::object copy,
             py::object stream, bool require_contiguous, bool require_writable) {
            py_runtime& rt = self.cast<py_runtime&>();
            return rt.from_dlpack(self, x,
                                  args_of(std::move(device), std::move(copy), std::move(stream),
                                          require_contiguous, require_writable));
          },
          py::arg("x"), py::pos_only(), py::kw_only(), py::arg("device") = py::none(),
          py::arg("copy") = py::none(), py::arg("stream") = py::none(),
          py::arg("require_contiguous") = false, py::arg("require_writable") = false,
          R"(Imports `x` (an object with __dlpack__, or a DLPack capsule) and returns a Tensor.

Waits for the import with the GIL released. device: where it lands (None:
where it is). copy: True always copies, False never (BufferError when a copy
is needed), None copies only when needed. stream: the consumer stream passed
to x.__dlpack__ (DLPack encoding); for a CUDA producer dlasync names its own
stream when None is given.)")
      .def(
          "_start_import",
          [](const py::object& self, py::handle x, std::shared_ptr<loop_bridge> bridge,
             py::handle future, py::object device, py::object copy, py::object stream,
             bool require_contiguous, bool require_writable) {
            py_runtime& rt = self.cast<py_runtime&>();
            return rt.start_import(self, x,
                                   args_of(std::move(device), std::move(copy), std::move(stream),
                                           require_contiguous, require_writable),
                                   std::move(bridge), future);
          },
          py::arg("x"), py::arg("bridge"), py::arg("future"), py::kw_only(),
          py::arg("device") = py::none(), py::arg("copy") = py::none(),
          py::arg("stream") = py::none(), py::arg("require_contiguous") = false,
          py::arg("require_writable") = false)
      .def(
          "_start_batch",
          [](const py::object& self, const py::sequence& xs, std::shared_ptr<loop_bridge> bridge,
             py::handle future, bool return_exceptions, py::object device, py::object copy,
             py::object stream, bool require_contiguous, bool require_writable) {
            py_runtime& rt = self.cast<py_runtime&>();
            return rt.start_batch(self, xs,
                                  args_of(std::move(device), std::move(copy), std::move(stream),
                                          require_contiguous, require_writable),
                                  std::move(bridge), future, return_exceptions);
          },
          py::arg("xs"), py::arg("bridge"), py::arg("future"), py::arg("return_exceptions"),
          py::kw_only(), py::arg("device") = py::none(), py::arg("copy") = py::none(),
          py::arg("stream") = py::none(), py::arg("require_contiguous") = false,
          py::arg("require_writable") = false)
      .def_property_readonly("devices",
                             [](py_runtime& rt) {
                               py::list out;
                               for (device d : rt.get().registry().addressable_devices()) {
                                 out.append(py_device{d});
                               }
                               return out;
                             })
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

  m.def("_at_exit", &py_runtime::at_exit);
  m.def("_skipped_releases", &skipped_releases,
        "Producer deleters skipped because they arrived on a foreign thread after exit began.");
}

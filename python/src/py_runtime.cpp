#include "py_runtime.hpp"

#include <Python.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dlasync/detail/import_initiation.hpp"
#include "dlasync/import.hpp"
#include "dlasync/limits.hpp"
#include "py_args.hpp"
#include "py_errors.hpp"
#include "py_release.hpp"
#include "py_source.hpp"
#include "py_tensor.hpp"

namespace py = pybind11;

namespace dlasync::python {
namespace {

std::mutex live_mutex;
std::set<py_runtime*>& live() {
  static auto* s = new std::set<py_runtime*>();
  return *s;
}

std::optional<device> parse_kind(const std::string& name, int ordinal) {
  for (int code = 1; code <= 20; ++code) {
    if (!is_known_device_kind(code)) continue;
    const auto kind = static_cast<device_kind>(code);
    if (name == device_kind_name(kind)) return device{kind, ordinal};
  }
  return std::nullopt;
}

// Copies up to this size start with the GIL held (about 100 us at most when
// one runs inline, as a NumPy copy of that size holds it): giving the GIL up
// would send the producer's deleter to the releaser, whose GIL round trip
// costs more than such a copy. Larger ones let other Python threads run.
constexpr std::uint64_t kHoldGilBytes = 1 << 20;

// The bytes an import of `t` would copy, from its shape and dtype alone,
// saturating; 0 for a tensor validation will refuse. Only for choosing
// whether to keep the GIL: validation itself is the import's.
std::uint64_t bytes_of(const managed_tensor& t) {
  const DLTensor* d = t.dl_tensor();
  if (d == nullptr || d->ndim < 0 || d->ndim > max_ndim || (d->ndim > 0 && d->shape == nullptr)) {
    return 0;
  }
  std::uint64_t bytes = (static_cast<std::uint64_t>(d->dtype.bits) * d->dtype.lanes + 7) / 8;
  for (std::int32_t i = 0; i < d->ndim; ++i) {
    if (d->shape[i] < 0) return 0;
    const auto extent = static_cast<std::uint64_t>(d->shape[i]);
    if (extent != 0 && bytes > UINT64_MAX / extent) return UINT64_MAX;
    bytes *= extent;
  }
  return bytes;
}

// Whether the import may run a copy inline that is long enough to give the
// GIL up for (a copy of more than kHoldGilBytes, up to inline_copy_bytes).
// Views and larger copies keep it: a view is made at once, and a larger copy
// runs on the workers while the caller waits with the GIL released. Planned
// here only for such sizes, where a plan costs nothing beside the copy.
bool may_copy_inline_long(runtime& rt, const managed_tensor& source,
                          const import_options& options) {
  const std::uint64_t bytes = bytes_of(source);
  if (bytes <= kHoldGilBytes || bytes > rt.options().inline_copy_bytes) return false;
  const absl::StatusOr<import_plan> plan = plan_import(source, options, rt.registry());
  return plan.ok() && plan->needs_copy();
}

}  // namespace

device parse_device(py::handle d) {
  if (py::isinstance<py_device>(d)) return d.cast<const py_device&>().value;
  if (py::isinstance<py::str>(d)) {
    const std::string text = d.cast<std::string>();
    std::string name = text;
    int ordinal = 0;
    if (const auto colon = text.find(':'); colon != std::string::npos) {
      name = text.substr(0, colon);
      const std::string digits = text.substr(colon + 1);
      bool ok = !digits.empty() && digits.size() <= 9;
      for (char c : digits) ok = ok && c >= '0' && c <= '9';
      if (!ok) {
        throw py::value_error(absl::StrCat("device \"", text,
                                           "\": the ordinal after ':' must be a number, as in "
                                           "\"cuda:1\""));
      }
      ordinal = std::stoi(digits);
    }
    if (std::optional<device> dev = parse_kind(name, ordinal)) return *dev;
    throw py::value_error(absl::StrCat("device \"", text,
                                       "\" is not a device dlasync knows; name one as \"cpu\", "
                                       "\"cpu:1\", \"cuda:0\", \"cuda_host\", \"cuda_managed:0\", "
                                       "a DLPack (type, id) tuple or a dlasync.Device"));
  }
  if (py::isinstance<py::tuple>(d) && py::len(d) == 2) {
    py::tuple t = py::reinterpret_borrow<py::tuple>(d);
    if (is_int(t[0]) && is_int(t[1])) {
      // Past 64 bits is out of range too: read with the overflow flag.
      int code_overflow = 0;
      int id_overflow = 0;
      const long long code = PyLong_AsLongLongAndOverflow(t[0].ptr(), &code_overflow);
      const long long id = PyLong_AsLongLongAndOverflow(t[1].ptr(), &id_overflow);
      if (code_overflow != 0 || code < 0 || code > INT32_MAX ||
          !is_known_device_kind(static_cast<std::int32_t>(code))) {
        throw py::value_error(absl::StrCat("DLPack device type ", std::string(py::repr(t[0])),
                                           " is not one DLPack defines (1 is CPU, 2 CUDA, 3 "
                                           "CUDA host, 13 CUDA managed, ...)"));
      }
      if (id_overflow != 0 || id < 0 || id > INT32_MAX) {
        throw py::value_error(absl::StrCat("DLPack device id ", std::string(py::repr(t[1])),
                                           " is out of range: it must be in [0, 2^31)"));
      }
      return device{static_cast<device_kind>(code), static_cast<std::int32_t>(id)};
    }
  }
  throw py::type_error(absl::StrCat(
      "device takes a string such as \"cuda:0\", a DLPack (type, id) tuple of ints or a "
      "dlasync.Device; got ",
      seen(d)));
}

py_runtime::py_runtime(runtime_options options) {
  absl::StatusOr<std::unique_ptr<runtime>> rt;
  {
    py::gil_scoped_release unlocked;
    rt = runtime::create(std::move(options));
  }
  if (!rt.ok()) raise_status(rt.status());
  rt_ = std::move(*rt);
  std::lock_guard lock(live_mutex);
  live().insert(this);
}

py_runtime::~py_runtime() {
  {
    std::lock_guard lock(live_mutex);
    live().erase(this);
  }
  // Shutdown waits for imports whose producers' deleters may need the GIL.
  PyThreadState* saved = nullptr;
  if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) saved = PyEval_SaveThread();
  streams_.clear();
  rt_.reset();
  if (saved != nullptr) PyEval_RestoreThread(saved);
}

runtime& py_runtime::get() {
  if (rt_ == nullptr) throw std::runtime_error("the dlasync runtime is gone");
  return *rt_;
}

void py_runtime::shutdown() {
  if (rt_ == nullptr) return;
  py::gil_scoped_release unlocked;
  {
    std::lock_guard lock(streams_mutex_);
    streams_.clear();
  }
  rt_->shutdown();
}

void py_runtime::at_exit() {
  std::vector<py_runtime*> all;
  {
    std::lock_guard lock(live_mutex);
    all.assign(live().begin(), live().end());
  }
  for (py_runtime* r : all) r->shutdown();
  stop_completions();
  close_releaser();
}

import_options py_runtime::options_of(const import_args& a) const {
  import_options o;
  if (!a.device.is_none()) o.target = parse_device(a.device);
  o.copy = copy_arg(a.copy);
  o.require_contiguous = flag_arg(a.require_contiguous, "require_contiguous");
  o.require_writable = flag_arg(a.require_writable, "require_writable");
  return o;
}

taken_source py_runtime::take(py::handle x, const import_args& a, import_options& options,
                              batch_members* batch) {
  if (a.stream.is_none() && !is_tensor(x) && PyCapsule_CheckExact(x.ptr()) == 0) {
    if (const exchange_api* api = exchange_api_of(x)) {
      taken_source taken = take_exchange(x, *api, batch);
      options.stream = taken.producer_stream;
      return taken;
    }
  }
  options.stream = producer_stream(x, a);
  return take_source(x, options.stream, batch);
}

std::optional<std::int64_t> py_runtime::producer_stream(py::handle x, const import_args& a) {
  if (const std::optional<std::int64_t> s = stream_arg(a.stream)) {
    // A capsule says where its memory is once claimed: the import checks the
    // stream then, and a refused capsule gets its tensor back.
    if (PyCapsule_CheckExact(x.ptr()) != 0) return s;
    if (is_tensor(x)) {
      const device d = tensor_of(x).value.device();
      return stream_for(d.kind, *s, absl::StrCat("a dlasync.Tensor on ", d.name()));
    }
    // Checked against where the producer says its memory is before its
    // __dlpack__ is called: a producer is never handed a stream that the
    // import would refuse.
    const std::string type = py::str(py::type::handle_of(x).attr("__name__"));
    const std::optional<std::pair<int, int>> dev = dlpack_device_of(x);
    if (!dev) {
      refuse_stream(absl::StrCat(
          "stream ", *s, " was given for a ", type,
          ", which has no __dlpack_device__() to say where its memory is, so the stream cannot "
          "be checked before the producer is called; pass stream=None"));
    }
    return stream_for(static_cast<device_kind>(dev->first), *s,
                      absl::StrCat("a ", type, " whose __dlpack_device__() is (", dev->first, ", ",
                                   dev->second, ")"));
  }
  if (is_tensor(x) || PyCapsule_CheckExact(x.ptr()) != 0) return std::nullopt;
  // NumPy takes no stream: it is not asked where its memory is.
  if (is_numpy_array(x)) return std::nullopt;
  std::optional<std::pair<int, int>> dev = dlpack_device_of(x);
  if (!dev) return std::nullopt;
  const auto kind = static_cast<device_kind>(dev->first);
  if (kind != device_kind::cuda && kind != device_kind::cuda_managed) return std::nullopt;
  // A CUDA producer: it orders its work before the stream dlasync names.
  const device gpu{device_kind::cuda, dev->second};
  runtime& rt = get();
  std::lock_guard lock(streams_mutex_);
  auto it = streams_.find(gpu.ordinal);
  if (it == streams_.end()) {
    absl::StatusOr<gpu_stream> s = gpu_stream::create(rt, gpu);
    if (!s.ok()) return std::nullopt;  // not a GPU this runtime serves: validation says so
    it = streams_.emplace(gpu.ordinal, std::move(*s)).first;
  }
  return it->second.dlpack_stream();
}

py::object py_runtime::from_dlpack(const py::object& self, py::handle x, const import_args& a) {
  import_options options = options_of(a);
  taken_source taken = take(x, a, options);
  return import_taken(self, taken, options);
}

py::object py_runtime::import_taken(const py::object& self, taken_source& taken,
                                    const import_options& options) {
  runtime& rt = get();
  // Validated and planned once: a view, a refusal or a copy small enough to
  // run inline is ready here; anything else is an operation to start.
  detail::import_begun begun;
  if (may_copy_inline_long(rt, taken.source, options)) {
    py::gil_scoped_release unlocked;
    begun = detail::begin_import(rt, taken.source, options);
  } else {
    begun = detail::begin_import(rt, taken.source, options);
  }
  taken.settle();
  if (begun.ready) return tensor_or_raise(self, std::move(*begun.ready));
  auto call = std::make_shared<import_call>();
  detail::launch<detail::import_result>(sync_handler(call), rt, begun.op);
  return tensor_or_raise(self, call->wait_one());
}

py::object py_runtime::tensor_or_raise(const py::object& self, absl::StatusOr<tensor> t) {
  if (!t.ok()) raise_status(t.status());
  return make_tensor(py_tensor{std::move(*t), self});
}

py::object py_runtime::import_managed(const py::object& self, managed_tensor source,
                                      const import_options& options) {
  taken_source taken;
  taken.source = std::move(source);
  taken.capsule = py::none();
  return import_taken(self, taken, options);
}

py::object py_runtime::start_import(const py::object& self, py::handle x, const import_args& a,
                                    py::handle loop) {
  import_options options = options_of(a);
  runtime& rt = get();
  taken_source taken = take(x, a, options);
  // The loop's bridge before anything is consumed: making it can fail (the
  // loop's add_reader, an eventfd), and then `x` must be as it was.
  std::shared_ptr<loop_bridge> bridge = bridge_of(loop);
  // A view, a refusal or an inline copy is ready at once: no future, and
  // the coroutine never suspends.
  detail::import_begun begun = detail::begin_import(rt, taken.source, options);
  taken.settle();
  if (begun.ready) return tensor_or_raise(self, std::move(*begun.ready));
  auto call = std::make_shared<import_call>();
  py::object future;
  try {
    future = loop.attr("create_future")();
  } catch (...) {
    // Out of memory, or a loop without futures: the import has taken the
    // tensor, so it runs, and its result is released where it ends.
    detail::launch<detail::import_result>(sync_handler(call), rt, begun.op);
    throw;
  }
  call->future = py_ref(future.ptr());
  call->owner = py_ref(self.ptr());
  call->bridge = std::move(bridge);
  detail::launch<detail::import_result>(call_handler<detail::import_result>(call, 1), rt, begun.op);
  return py::make_tuple(py::cast(call), future);
}

std::shared_ptr<loop_bridge> py_runtime::bridge_of(py::handle loop) {
  // The last loop's bridge, remembered with a weak reference to the loop (a
  // new loop may reuse a dead one's address); else dlasync._bridge(loop).
  // The GIL guards both.
  static PyObject* last_loop = nullptr;  // a weakref
  static auto* last_bridge = new std::shared_ptr<loop_bridge>();
  if (last_loop != nullptr && PyWeakref_GetObject(last_loop) == loop.ptr()) return *last_bridge;
  static auto* make = new py::object(py::module_::import("dlasync").attr("_bridge"));
  auto bridge = (*make)(loop).cast<std::shared_ptr<loop_bridge>>();
  PyObject* ref = PyWeakref_NewRef(loop.ptr(), nullptr);
  if (ref == nullptr) {
    PyErr_Clear();  // a loop without weak references: not remembered
    return bridge;
  }
  Py_XDECREF(last_loop);
  last_loop = ref;
  *last_bridge = bridge;
  return bridge;
}

std::shared_ptr<import_call> py_runtime::start_batch(py::object self, const py::sequence& xs,
                                                     const import_args& a,
                                                     std::shared_ptr<loop_bridge> bridge,
                                                     py::handle future, bool return_exceptions) {
  import_options options = options_of(a);
  std::vector<taken_source> taken;
  taken.reserve(py::len(xs));
  batch_members members;
  // One options for the whole batch: its members must follow the same
  // producer stream, or none.
  for (py::handle x : xs) {
    import_options member = options;
    members.at(taken.size());
    taken.push_back(take(x, a, member, &members));
    if (taken.size() == 1) {
      options.stream = member.stream;
    } else if (member.stream != options.stream) {
      throw py::value_error(
          "a batch follows one producer stream (or none), and its members differ: host and GPU "
          "tensors, or GPUs with different streams; import them in batches of their own");
    }
  }
  std::vector<managed_tensor> sources;
  sources.reserve(taken.size());
  for (taken_source& t : taken) sources.push_back(std::move(t.source));
  runtime& rt = get();
  auto call = std::make_shared<import_call>();
  call->future = py_ref(future.ptr());
  call->owner = py_ref(self.ptr());
  call->bridge = std::move(bridge);
  call->return_exceptions = return_exceptions;
  async_import_dlpack_batch(
      rt, sources, options,
      call_handler<std::vector<absl::StatusOr<tensor>>>(call, sources.size()));
  for (std::size_t i = 0; i < taken.size(); ++i) {
    taken[i].source = std::move(sources[i]);
    taken[i].settle();
  }
  return call;
}

}  // namespace dlasync::python

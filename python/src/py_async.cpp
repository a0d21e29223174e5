#include "py_async.hpp"

#include <Python.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "asio/executor_work_guard.hpp"
#include "asio/post.hpp"
#include "py_errors.hpp"
#include "py_tensor.hpp"

namespace py = pybind11;

namespace dlasync::python {
namespace {

struct completion_thread {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::thread thread{[this] { io.run(); }};
};

std::mutex completions_mutex;
completion_thread* completions = nullptr;  // never destroyed: see stop_completions

}  // namespace

asio::io_context::executor_type completion_executor() {
  std::lock_guard lock(completions_mutex);
  if (completions == nullptr) completions = new completion_thread();
  return completions->io.get_executor();
}

void stop_completions() {
  std::lock_guard lock(completions_mutex);
  if (completions == nullptr || !completions->thread.joinable()) return;
  completions->work.reset();
  py::gil_scoped_release unlocked;
  completions->thread.join();
  // Left allocated: a late post finds a stopped context, not freed memory.
}

void import_call::cancel() {
  {
    std::lock_guard lock(mutex_);
    if (done_) return;
  }
  asio::post(strand_, [self = shared_from_this()] {
    self->signal_.emit(asio::cancellation_type::terminal);
  });
}

void import_call::mark_done() {
  std::lock_guard lock(mutex_);
  done_ = true;
}

void import_call::complete(absl::StatusOr<tensor> result) {
  one = std::move(result);
  finished();
}

void import_call::complete(std::vector<absl::StatusOr<tensor>> results) {
  many = std::move(results);
  finished();
}

void import_call::finished() {
  std::shared_ptr<loop_bridge> b = std::move(bridge);  // no cycle through the queue
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  done_cv_.notify_all();
  if (b) b->push(shared_from_this());
}

absl::StatusOr<tensor> import_call::wait_one() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      if (done_) break;
    }
    bool done = false;
    {
      py::gil_scoped_release unlocked;
      std::unique_lock lock(mutex_);
      done = done_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return done_; });
    }
    if (done) break;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  absl::StatusOr<tensor> out = std::move(*one);
  one.reset();
  return out;
}

loop_bridge::loop_bridge() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) {
    throw std::runtime_error(std::string("eventfd failed: ") + std::strerror(errno));
  }
}

loop_bridge::~loop_bridge() {
  ::close(fd_);
}

void loop_bridge::push(std::shared_ptr<import_call> call) {
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    wake = queue_.empty();
    queue_.push_back(std::move(call));
  }
  if (!wake) return;
  const std::uint64_t one = 1;
  // EAGAIN means the counter is full, so the loop is woken anyway.
  while (::write(fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

py::object tensor_object(tensor t, const py_ref& owner) {
  return make_tensor(py_tensor{
      std::move(t), py::reinterpret_borrow<py::object>(static_cast<PyObject*>(owner.get()))});
}

void loop_bridge::drain() {
  std::uint64_t count = 0;
  while (::read(fd_, &count, sizeof count) < 0 && errno == EINTR) {
  }
  std::vector<std::shared_ptr<import_call>> calls;
  {
    std::lock_guard lock(mutex_);
    calls.swap(queue_);
  }
  for (std::shared_ptr<import_call>& call : calls) {
    try {
      resolve(*call);
    } catch (py::error_already_set& e) {
      // A future whose loop is closing: the result is released below.
      e.discard_as_unraisable("dlasync: resolving an import's future");
    }
    // With the GIL held: the results not handed out are released here.
    call->one.reset();
    call->many.reset();
    call->future.reset();
    call->owner.reset();
  }
}

void loop_bridge::resolve(import_call& c) {
  import_call* call = &c;
  {
    py::handle future(static_cast<PyObject*>(call->future.get()));
    const bool wanted = future && !future.attr("done")().cast<bool>();
    if (wanted && call->one) {
      absl::StatusOr<tensor>& r = *call->one;
      if (r.ok()) {
        future.attr("set_result")(tensor_object(std::move(*r), call->owner));
      } else {
        future.attr("set_exception")(make_exception(r.status()));
      }
    } else if (wanted && call->many) {
      py::list out;
      py::object first_error;
      for (absl::StatusOr<tensor>& r : *call->many) {
        if (r.ok()) {
          out.append(tensor_object(std::move(*r), call->owner));
        } else {
          py::object e = make_exception(r.status());
          if (!first_error) first_error = e;
          out.append(e);
        }
      }
      if (first_error && !call->return_exceptions) {
        future.attr("set_exception")(first_error);
      } else {
        future.attr("set_result")(out);
      }
    }
  }
}

}  // namespace dlasync::python

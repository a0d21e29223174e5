// python/src/py_release.hpp
//
// Where Python objects and Python producers' DLPack deleters are let go.
//
// A Python producer's deleter (NumPy's, PyTorch's, a capsule's) and the
// release of a Python reference both need the GIL. dlasync calls deleters
// on its workers, which never hold it, and must not wait for it there: a
// worker blocked on the GIL stalls every import behind it. So:
//
// - on a thread that holds the GIL, the release runs at once;
// - on any other thread it is queued for the releaser, one thread of this
//   module that takes the GIL, runs what is queued, and gives it back;
// - once the interpreter is exiting (close(), called from `atexit`), what
//   would still need the GIL on a foreign thread is skipped: the memory is
//   leaked on purpose rather than touched while Python tears down, and
//   counted (skipped()).
//
// Example:
//
//   release_with_gil([obj] { Py_DECREF(obj); });  // any thread
#pragma once

#include <cstdint>

#include "absl/functional/any_invocable.h"

namespace dlasync::python {

// Runs `fn` with the GIL held: now when this thread holds it, else on the
// releaser. After close(), on a thread without the GIL, `fn` is destroyed
// without being called and counted as skipped.
void release_with_gil(absl::AnyInvocable<void() &&> fn);

// Stops the releaser: runs everything queued, then joins it. Call with the
// GIL held (it is given up while waiting); idempotent.
void close_releaser();

// Releases skipped since close_releaser().
std::uint64_t skipped_releases() noexcept;

// A strong reference to a Python object that may be dropped on any thread.
class py_ref {
 public:
  py_ref() noexcept = default;
  // Takes a new reference to `o` (the GIL must be held).
  explicit py_ref(void* o) noexcept;
  py_ref(py_ref&& other) noexcept : obj_(other.obj_) { other.obj_ = nullptr; }
  py_ref& operator=(py_ref&& other) noexcept;
  py_ref(const py_ref&) = delete;
  py_ref& operator=(const py_ref&) = delete;
  ~py_ref() { reset(); }

  // The object, borrowed (the GIL must be held to use it).
  void* get() const noexcept { return obj_; }
  void reset() noexcept;

 private:
  void* obj_ = nullptr;
};

}  // namespace dlasync::python

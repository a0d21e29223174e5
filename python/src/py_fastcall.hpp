// python/src/py_fastcall.hpp
//
// `Runtime.from_dlpack` and `Runtime._start_import` (the start of
// `import_dlpack`) as CPython vectorcall methods (METH_FASTCALL |
// METH_KEYWORDS) instead of pybind11 bindings: the per-call path of the most
// frequent imports, where pybind11's dispatcher (its argument loaders, the
// keyword dict, the lookups of the Runtime's type by C++ type) cost more
// than the import of a view itself. The arguments, their checks and errors
// are the bindings': `from_dlpack(x, /, *, device=None, copy=None,
// stream=None, require_contiguous=False, require_writable=False)` and
// `_start_import(x, loop, /, *, ...the same keywords)`, a TypeError naming a
// keyword it does not take or a wrong count.
#pragma once

#include <pybind11/pybind11.h>

namespace dlasync::python {

// Sets both on `runtime_type` (the pybind11 class of py_runtime), with
// `from_dlpack_doc` as from_dlpack's docstring.
void add_fast_imports(pybind11::handle runtime_type, const char* from_dlpack_doc);

}  // namespace dlasync::python

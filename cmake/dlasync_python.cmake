# The Python module's prerequisites: Debian's pybind11 and Python.
#
# pybind11 2.10 finds Python through PYTHON_EXECUTABLE; without it, the first
# python3 on PATH answers, which may be an interpreter without NumPy and
# PyTorch. Debian's own is preferred where it exists.
if(NOT DEFINED PYTHON_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(PYTHON_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "The Python the module is built for")
endif()
set(dlasync_python_default OFF)
# In sanitized builds the tests preload the sanitizer's runtime into the
# interpreter, which is not instrumented (python/CMakeLists.txt).
if(PROJECT_IS_TOP_LEVEL AND NOT DLASYNC_FUZZ)
  find_package(pybind11 2.10 CONFIG QUIET)
  if(pybind11_FOUND)
    set(dlasync_python_default ON)
  endif()
endif()
option(DLASYNC_BUILD_PYTHON "Build the Python module dlasync (pybind11)" ${dlasync_python_default})
if(DLASYNC_BUILD_PYTHON AND NOT pybind11_FOUND)
  find_package(pybind11 2.10 CONFIG REQUIRED)
endif()
message(STATUS "dlasync: Python module ${DLASYNC_BUILD_PYTHON}")

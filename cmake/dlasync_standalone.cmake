# For the examples and benchmarks built on their own against an installed
# dlasync (they call project() themselves first): the language settings,
# the package, the project's warnings, and CUDA where the package has it.
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
find_package(dlasync 0.1 CONFIG REQUIRED)
set(DLASYNC_SANITIZE "" CACHE STRING "Sanitizer build: empty, 'address' or 'thread'")
include(dlasync_warnings)
if(DLASYNC_WITH_CUDA)
  include(dlasync_cuda)
  dlasync_enable_cuda()
endif()

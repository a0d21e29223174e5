# Dependencies, all from Debian packages (see README).
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(dlpack CONFIG REQUIRED)

# Standalone Asio ships no CMake config: wrap its headers in an INTERFACE target.
find_path(ASIO_INCLUDE_DIR asio.hpp REQUIRED)
add_library(dlasync_asio INTERFACE)
add_library(dlasync::asio ALIAS dlasync_asio)
set_target_properties(dlasync_asio PROPERTIES EXPORT_NAME asio)
target_include_directories(dlasync_asio SYSTEM INTERFACE $<BUILD_INTERFACE:${ASIO_INCLUDE_DIR}>)
target_compile_definitions(dlasync_asio INTERFACE ASIO_STANDALONE ASIO_NO_DEPRECATED)
target_link_libraries(dlasync_asio INTERFACE Threads::Threads)

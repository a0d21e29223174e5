# How the project's libraries are declared.
#
# dlasync_add_component(<target> EXPORT <name> SOURCES <files>...)
#   A library with the alias and export name dlasync::<name>; public
#   headers in the include/ folder beside the calling CMakeLists (installed
#   from here, as they are: the one place that says what is installed;
#   tests/consumer/public_headers.txt lists the result), internals included
#   by their path from the repository root (never installed, and on the
#   include path of the component's own sources only: a target that links
#   the component sees its include/ folder alone), and the project's
#   warnings.
#
# dlasync_use_cuda(<target> [SOURCES <files>...])
#   In builds with CUDA: the CUDA sources, DLASYNC_HAS_CUDA and the static
#   CUDA runtime, all private to <target>.
function(dlasync_add_component target)
  cmake_parse_arguments(arg "" "EXPORT" "SOURCES" ${ARGN})
  add_library(${target} ${arg_SOURCES})
  add_library(dlasync::${arg_EXPORT} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${arg_EXPORT} OUTPUT_NAME ${target})
  target_include_directories(${target}
    PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
  dlasync_set_warnings(${target})
  # Components declared in one folder share its include/ (runtime and sim).
  get_property(installed GLOBAL PROPERTY dlasync_installed_include_dirs)
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/include AND
     NOT ${CMAKE_CURRENT_SOURCE_DIR}/include IN_LIST installed)
    set_property(GLOBAL APPEND PROPERTY dlasync_installed_include_dirs
                 ${CMAKE_CURRENT_SOURCE_DIR}/include)
    install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  endif()
endfunction()

function(dlasync_use_cuda target)
  cmake_parse_arguments(arg "" "" "SOURCES" ${ARGN})
  if(NOT DLASYNC_WITH_CUDA)
    return()
  endif()
  if(arg_SOURCES)
    target_sources(${target} PRIVATE ${arg_SOURCES})
    # nvcc takes C++17; the kernels need no more.
    set_target_properties(${target} PROPERTIES CUDA_STANDARD 17)
  endif()
  target_compile_definitions(${target} PRIVATE DLASYNC_HAS_CUDA=1)
  target_link_libraries(${target} PRIVATE CUDA::cudart_static)
endfunction()

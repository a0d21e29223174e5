# UCX (Debian's libucx-dev, through pkg-config) for dlasync::remote. The
# component is built where UCX is found, unless DLASYNC_WITH_UCX=OFF.
find_package(PkgConfig QUIET)
set(dlasync_ucx_found OFF)
if(PkgConfig_FOUND)
  pkg_check_modules(ucx QUIET IMPORTED_TARGET ucx)
  if(ucx_FOUND)
    set(dlasync_ucx_found ON)
  endif()
endif()
option(DLASYNC_WITH_UCX "Build dlasync::remote, remote imports over UCX" ${dlasync_ucx_found})
if(DLASYNC_WITH_UCX AND NOT dlasync_ucx_found)
  message(FATAL_ERROR "DLASYNC_WITH_UCX is ON but UCX was not found (pkg-config ucx); "
                      "install libucx-dev or configure with -DDLASYNC_WITH_UCX=OFF")
endif()
message(STATUS "dlasync: remote imports over UCX ${DLASYNC_WITH_UCX}")

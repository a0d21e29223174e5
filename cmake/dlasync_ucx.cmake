# UCX (Debian's libucx-dev, through pkg-config) for dlasync::remote, and
# hiredis (libhiredis-dev) for its directory of names in Redis
# (dlasync/remote_directory.hpp). The component is built where both are
# found, unless DLASYNC_WITH_UCX=OFF.
find_package(PkgConfig QUIET)
set(dlasync_ucx_found OFF)
if(PkgConfig_FOUND)
  pkg_check_modules(ucx QUIET IMPORTED_TARGET ucx)
  pkg_check_modules(hiredis QUIET IMPORTED_TARGET hiredis)
  if(ucx_FOUND AND hiredis_FOUND)
    set(dlasync_ucx_found ON)
  elseif(ucx_FOUND)
    message(STATUS "dlasync: UCX is found but hiredis is not: remote imports are not built "
                   "(install libhiredis-dev)")
  endif()
endif()
option(DLASYNC_WITH_UCX "Build dlasync::remote, remote imports over UCX" ${dlasync_ucx_found})
if(DLASYNC_WITH_UCX AND NOT dlasync_ucx_found)
  message(FATAL_ERROR "DLASYNC_WITH_UCX is ON but UCX or hiredis was not found (pkg-config ucx, "
                      "hiredis); install libucx-dev and libhiredis-dev or configure with "
                      "-DDLASYNC_WITH_UCX=OFF")
endif()
message(STATUS "dlasync: remote imports over UCX ${DLASYNC_WITH_UCX}")

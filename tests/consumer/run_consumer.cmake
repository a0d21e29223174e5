# Installs the build in BUILD_DIR to a scratch prefix, then checks the
# package as a user gets it:
#   - the installed headers are exactly those of HEADER_LIST (no backend or
#     CUDA seam, no simulation, no status macros, no UCX): none more, none
#     missing; and each header of that list compiles alone, in a translation
#     unit of its own, against the installed package (tests/consumer);
#   - the consumer project in SOURCE_DIR builds and runs;
#   - the examples (EXAMPLES_DIR) and benchmarks (BENCH_DIR) build against
#     the package, on the public API only.
set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()
# Everything is built with the configuration the package was built with.
set(config_args)
if(BUILD_TYPE)
  set(config_args --config ${BUILD_TYPE})
endif()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} ${config_args})

# Everything installed lies under the prefix: an install never writes into the
# machine's own folders (the Python package goes to the prefix's site-packages,
# not the interpreter's).
file(STRINGS ${BUILD_DIR}/install_manifest.txt manifest)
foreach(file ${manifest})
  string(FIND "${file}" "${prefix}/" at)
  if(NOT at EQUAL 0)
    message(FATAL_ERROR "the install wrote ${file}, outside its prefix ${prefix}")
  endif()
endforeach()
file(GLOB python_package ${prefix}/lib/python3*/site-packages/dlasync/__init__.py)
if(WITH_PYTHON AND NOT python_package)
  message(FATAL_ERROR "the Python package is not under ${prefix}/lib/python3*/site-packages")
endif()

file(GLOB_RECURSE installed RELATIVE ${prefix}/include ${prefix}/include/dlasync/*)
list(SORT installed)
file(STRINGS ${HEADER_LIST} expected)
# The remote component's headers are installed where it is built (UCX).
if(NOT WITH_UCX)
  list(FILTER expected EXCLUDE REGEX "^dlasync/(remote|detail/remote_initiation)\\.hpp$")
endif()
if(NOT installed STREQUAL expected)
  string(REPLACE ";" "\n  " got "${installed}")
  string(REPLACE ";" "\n  " want "${expected}")
  message(FATAL_ERROR "the installed headers are\n  ${got}\nbut the public API is\n  ${want}")
endif()

set(configure_args -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
if(CXX_COMPILER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build ${configure_args}
    -DHEADER_LIST=${HEADER_LIST})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
foreach(project examples bench)
  string(TOUPPER ${project} var)
  run(${CMAKE_COMMAND} -S ${${var}_DIR} -B ${WORK_DIR}/${project} ${configure_args})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/${project})
endforeach()

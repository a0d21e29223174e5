# dlasync_check_headers(<target> <headers, as they are included>...)
# An object library of one translation unit per header that includes just
# that header: each must compile on its own, against dlasync::dlasync.
function(dlasync_check_headers target)
  set(sources)
  foreach(header IN LISTS ARGN)
    string(MAKE_C_IDENTIFIER ${header} id)
    set(source ${CMAKE_CURRENT_BINARY_DIR}/${target}/${id}.cpp)
    file(CONFIGURE OUTPUT ${source} CONTENT "#include \"${header}\"\n")
    list(APPEND sources ${source})
  endforeach()
  add_library(${target} OBJECT ${sources})
  target_link_libraries(${target} PRIVATE dlasync::dlasync)
endfunction()

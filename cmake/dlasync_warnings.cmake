# Warnings as errors on our own targets only, and the sanitizer switch.
# GCC 12's maybe-uninitialized reports false positives inside abseil's
# AnyInvocable at -O3 and under sanitizers, and its mismatched-new-delete
# reports Asio's coroutine frames (allocated by the frame's own operator new,
# freed by its operator delete) when optimizing under ASan: both stay
# warnings, not errors.
function(dlasync_set_warnings target)
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Wpedantic;-Werror;-Wno-error=maybe-uninitialized;-Wno-error=mismatched-new-delete>")
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE -Wno-unknown-warning-option)
  endif()
endfunction()

# The fuzzing build: everything instrumented for libFuzzer's coverage and
# checked by ASan and UBSan; the fuzz targets link libFuzzer's main.
if(DLASYNC_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "DLASYNC_FUZZ needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++-14")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()

if(DLASYNC_SANITIZE STREQUAL "address")
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined;-fno-sanitize-recover=all;-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=address,undefined)
elseif(DLASYNC_SANITIZE STREQUAL "thread")
  # GCC warns that TSan does not model the fences in Asio and abseil.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread;-fno-omit-frame-pointer;-Wno-tsan>")
  add_link_options(-fsanitize=thread)
elseif(NOT DLASYNC_SANITIZE STREQUAL "")
  message(FATAL_ERROR "DLASYNC_SANITIZE must be empty, 'address' or 'thread', "
                      "got '${DLASYNC_SANITIZE}'")
endif()

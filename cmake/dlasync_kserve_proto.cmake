# The inference server's gRPC messages: grpc_service.proto compiled with
# protoc (and, for the service, Debian's gRPC plugin) into
# ${CMAKE_CURRENT_BINARY_DIR}/kserve_generated.
#
#   dlasync_kserve_proto(TARGET name [SERVICE])
# makes a static library `name` of the messages (and, with SERVICE, of the
# gRPC service too), built without the project's warnings, its headers
# coming in as system headers.
set(DLASYNC_KSERVE_PROTO ${CMAKE_CURRENT_LIST_DIR}/../examples/inference_server/grpc_service.proto)

function(dlasync_kserve_proto)
  cmake_parse_arguments(arg "SERVICE" "TARGET" "" ${ARGN})
  find_package(Protobuf REQUIRED)
  get_filename_component(proto ${DLASYNC_KSERVE_PROTO} REALPATH)
  get_filename_component(proto_dir ${proto} DIRECTORY)
  set(out ${CMAKE_CURRENT_BINARY_DIR}/kserve_generated)
  set(sources ${out}/grpc_service.pb.cc ${out}/grpc_service.pb.h)
  set(extra)
  if(arg_SERVICE)
    find_package(gRPC CONFIG REQUIRED)
    find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
    list(APPEND sources ${out}/grpc_service.grpc.pb.cc ${out}/grpc_service.grpc.pb.h)
    set(extra --grpc_out=${out} --plugin=protoc-gen-grpc=${GRPC_CPP_PLUGIN})
  endif()
  add_custom_command(
    OUTPUT ${sources}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${out}
    COMMAND protobuf::protoc --proto_path=${proto_dir} --cpp_out=${out} ${extra} ${proto}
    DEPENDS ${proto}
    COMMENT "protoc: grpc_service.proto")
  # The generated sources alone, without compiling them (scripts/tidy.sh).
  add_custom_target(${arg_TARGET}_sources DEPENDS ${sources})
  add_library(${arg_TARGET} STATIC ${sources})
  target_include_directories(${arg_TARGET} SYSTEM PUBLIC ${out})
  target_link_libraries(${arg_TARGET} PUBLIC protobuf::libprotobuf)
  if(arg_SERVICE)
    target_link_libraries(${arg_TARGET} PUBLIC gRPC::grpc++)
  endif()
endfunction()

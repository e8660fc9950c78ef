# fencelock_protoc(<var> <name>): C++ for proto/fencelock/<name>.proto of the current source
# directory, generated at build time into ${CMAKE_CURRENT_BINARY_DIR}/gen (add that directory
# to the library's includes). Sets <var> to the generated .pb.cc.
function(fencelock_protoc var name)
  set(out ${CMAKE_CURRENT_BINARY_DIR}/gen)
  set(proto ${CMAKE_CURRENT_SOURCE_DIR}/proto/fencelock/${name}.proto)
  file(MAKE_DIRECTORY ${out}/fencelock)
  add_custom_command(
    OUTPUT ${out}/fencelock/${name}.pb.cc ${out}/fencelock/${name}.pb.h
    COMMAND protobuf::protoc --cpp_out=${out} -I${CMAKE_CURRENT_SOURCE_DIR}/proto ${proto}
    DEPENDS ${proto} protobuf::protoc
    COMMENT "protoc fencelock/${name}.proto")
  set(${var} ${out}/fencelock/${name}.pb.cc PARENT_SCOPE)
endfunction()

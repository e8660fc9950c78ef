# The installable package (issue 19): `cmake --install` puts the client library and the
# resource-side fence into the prefix as shared libraries, with their public headers only,
# a CMake package config (find_package(fencelock CONFIG) gives fencelock::client and
# fencelock::fence) and pkg-config files (fencelock-client.pc, fencelock-fence.pc).
#
# Each shared library carries the project's static libraries it needs (lock_client and what it
# links: clock, metrics, protocol, net_tls), so those are built position-independent. Its
# interface is its public headers and Abseil, whose types they use; protobuf, OpenSSL and
# Boost stay private (the .so links them), and prometheus-cpp is not linked at all.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(lock_client lock_client_core net_blocking clock metrics protocol protocol_pool net_tls logging fence
                      PROPERTIES POSITION_INDEPENDENT_CODE ON)

set(FENCELOCK_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/fencelock)

add_library(fencelock_client SHARED lock-client/src/shared_library.cc)
target_link_libraries(fencelock_client PRIVATE $<LINK_LIBRARY:WHOLE_ARCHIVE,lock_client>
                      PUBLIC absl::status absl::statusor absl::time)
target_include_directories(fencelock_client INTERFACE
    $<INSTALL_INTERFACE:${FENCELOCK_INSTALL_INCLUDEDIR}>)
set_target_properties(fencelock_client PROPERTIES OUTPUT_NAME fencelock-client EXPORT_NAME client
                      VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})

add_library(fencelock_fence SHARED fence/src/shared_library.cc)
target_link_libraries(fencelock_fence PRIVATE $<LINK_LIBRARY:WHOLE_ARCHIVE,fence>
                      PUBLIC absl::status absl::statusor)
target_include_directories(fencelock_fence INTERFACE
    $<INSTALL_INTERFACE:${FENCELOCK_INSTALL_INCLUDEDIR}>)
set_target_properties(fencelock_fence PROPERTIES OUTPUT_NAME fencelock-fence EXPORT_NAME fence
                      VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})

install(TARGETS fencelock_client fencelock_fence EXPORT fencelockTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The headers a worker includes to lock: nothing of Asio, protobuf or prometheus-cpp; and the
# Asio adapter (async.h), which only a consumer that includes it needs Boost.Asio for.
install(FILES lock-client/include/lock-client/client.h lock-client/include/lock-client/pool_client.h
              lock-client/include/lock-client/async.h
        DESTINATION ${FENCELOCK_INSTALL_INCLUDEDIR}/lock-client)
install(FILES clock/include/clock/clock.h DESTINATION ${FENCELOCK_INSTALL_INCLUDEDIR}/clock)
install(FILES metrics/include/metrics/metrics.h DESTINATION ${FENCELOCK_INSTALL_INCLUDEDIR}/metrics)
install(FILES protocol/include/protocol/defaults.h protocol/include/protocol/pool_view.h
        DESTINATION ${FENCELOCK_INSTALL_INCLUDEDIR}/protocol)
install(FILES fence/include/fence/fence.h DESTINATION ${FENCELOCK_INSTALL_INCLUDEDIR}/fence)

set(FENCELOCK_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/fencelock)
install(EXPORT fencelockTargets NAMESPACE fencelock:: DESTINATION ${FENCELOCK_CMAKEDIR})
configure_package_config_file(cmake/fencelockConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/fencelockConfig.cmake
                              INSTALL_DESTINATION ${FENCELOCK_CMAKEDIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/fencelockConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/fencelockConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/fencelockConfigVersion.cmake
        DESTINATION ${FENCELOCK_CMAKEDIR})

# pkg-config files that work wherever the prefix is (cmake --install --prefix DIR): the prefix
# is found from the .pc file's own directory.
file(RELATIVE_PATH FENCELOCK_PC_TO_PREFIX /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
foreach(pc fencelock-client fencelock-fence)
  configure_file(cmake/${pc}.pc.in ${CMAKE_CURRENT_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()

# The installable package (issue 19): `cmake --install` puts the client library, the
# resource-side fence and the /metrics exposer into the prefix as shared libraries, with their
# public headers only, a CMake package config (find_package(fencelock CONFIG) gives
# fencelock::client, fencelock::fence and fencelock::metrics_http) and pkg-config files
# (fencelock-client.pc, fencelock-fence.pc).
#
# Each shared library carries the project's static libraries it needs (lock_client and what it
# links: clock, metrics, protocol, net_tls), so those are built position-independent. Its
# interface is its public headers and Abseil, whose types they use; protobuf, OpenSSL and
# Boost stay private (the .so links them), and prometheus-cpp is not linked at all.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# They export only fencelock's API (issue 41): what the installed headers mark FENCELOCK_API
# (api/export.h), everything else compiled hidden, and cmake/fencelock.map keeps out the
# template instances other libraries' headers give default visibility.
set(FENCELOCK_BUNDLED lock_client lock_client_core net_blocking clock metrics protocol protocol_pool
    net_tls logging fence)
set_target_properties(${FENCELOCK_BUNDLED} PROPERTIES POSITION_INDEPENDENT_CODE ON
                      CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
set(FENCELOCK_EXPORTS_MAP ${CMAKE_CURRENT_SOURCE_DIR}/cmake/fencelock.map)

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

# The /metrics endpoint for a service that links the client: metrics::Exposer serves the
# client's Registry (Client::metrics()). It is built from its own source here, on the client
# library's exported metrics, so the process has one copy of the registry's code.
add_library(fencelock_metrics_http SHARED metrics/src/exposer.cc)
target_include_directories(fencelock_metrics_http PRIVATE metrics/include clock/include
    INTERFACE $<INSTALL_INTERFACE:${FENCELOCK_INSTALL_INCLUDEDIR}>)
target_link_libraries(fencelock_metrics_http PUBLIC fencelock_client absl::statusor
                      PRIVATE api_export absl::strings Threads::Threads)
set_target_properties(fencelock_metrics_http PROPERTIES OUTPUT_NAME fencelock-metrics-http
                      EXPORT_NAME metrics_http CXX_VISIBILITY_PRESET hidden
                      VISIBILITY_INLINES_HIDDEN ON
                      VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})

foreach(library fencelock_client fencelock_fence fencelock_metrics_http)
  target_link_options(${library} PRIVATE "LINKER:--version-script=${FENCELOCK_EXPORTS_MAP}")
  set_property(TARGET ${library} APPEND PROPERTY LINK_DEPENDS ${FENCELOCK_EXPORTS_MAP})
endforeach()

install(TARGETS fencelock_client fencelock_fence fencelock_metrics_http EXPORT fencelockTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT client)
# The headers a worker includes to lock: nothing of Asio, protobuf or prometheus-cpp; and the
# Asio adapter (async.h), which only a consumer that includes it needs Boost.Asio for.
install(FILES lock-client/include/lock-client/client.h lock-client/include/lock-client/pool_client.h
              lock-client/include/lock-client/async.h
        DESTINATION ${FENCELOCK_INSTALL_INCLUDEDIR}/lock-client COMPONENT client)
install(FILES clock/include/clock/clock.h clock/include/clock/std_mutex.h
        DESTINATION ${FENCELOCK_INSTALL_INCLUDEDIR}/clock COMPONENT client)
install(FILES metrics/include/metrics/metrics.h metrics/include/metrics/exposer.h
        DESTINATION ${FENCELOCK_INSTALL_INCLUDEDIR}/metrics COMPONENT client)
install(FILES api/include/api/export.h
        DESTINATION ${FENCELOCK_INSTALL_INCLUDEDIR}/api COMPONENT client)
install(FILES protocol/include/protocol/defaults.h protocol/include/protocol/pool_view.h
        DESTINATION ${FENCELOCK_INSTALL_INCLUDEDIR}/protocol COMPONENT client)
install(FILES fence/include/fence/fence.h
        DESTINATION ${FENCELOCK_INSTALL_INCLUDEDIR}/fence COMPONENT client)

set(FENCELOCK_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/fencelock)
install(EXPORT fencelockTargets NAMESPACE fencelock:: DESTINATION ${FENCELOCK_CMAKEDIR}
        COMPONENT client)
configure_package_config_file(cmake/fencelockConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/fencelockConfig.cmake
                              INSTALL_DESTINATION ${FENCELOCK_CMAKEDIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/fencelockConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/fencelockConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/fencelockConfigVersion.cmake
        DESTINATION ${FENCELOCK_CMAKEDIR} COMPONENT client)

# pkg-config files that work wherever the prefix is (cmake --install --prefix DIR): the prefix
# is found from the .pc file's own directory.
file(RELATIVE_PATH FENCELOCK_PC_TO_PREFIX /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
foreach(pc fencelock-client fencelock-fence fencelock-metrics-http)
  configure_file(cmake/${pc}.pc.in ${CMAKE_CURRENT_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
          COMPONENT client)
endforeach()

# fencelock_add_test(<name> SOURCES <files...> LIBS <targets...> [LABELS <labels...>]
#                    [TIMEOUT <seconds>])
# One test executable per test file, linked with GoogleTest's main and registered with CTest
# under its own name. With FENCELOCK_TESTS=OFF the executable is still defined (so that the
# CMakeLists around it need no conditions) but left out of `all` and of CTest.
function(fencelock_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT FENCELOCK_TESTS)
    add_executable(${name} EXCLUDE_FROM_ALL ${ARG_SOURCES})
    target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
    return()
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT})
  if(ARG_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
endfunction()

# fencelock_add_stress_test(<name> COMMAND <command...> [TIMEOUT <seconds>]
#                           [ENVIRONMENT <VAR=value...>])
# A long soak or stress run (minutes to an hour), labelled `stress`. It is registered with CTest
# only when the tree is configured with -DFENCELOCK_STRESS=ON, so that a plain `ctest` runs what
# the test command runs and never starts one by accident.
function(fencelock_add_stress_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "COMMAND;ENVIRONMENT" ${ARGN})
  if(NOT FENCELOCK_TESTS OR NOT FENCELOCK_STRESS)
    return()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 3600)
  endif()
  add_test(NAME ${name} COMMAND ${ARG_COMMAND})
  set_tests_properties(${name} PROPERTIES LABELS stress TIMEOUT ${ARG_TIMEOUT})
  if(ARG_ENVIRONMENT)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${ARG_ENVIRONMENT}")
  endif()
endfunction()

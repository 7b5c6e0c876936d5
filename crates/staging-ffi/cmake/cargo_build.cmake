# Run at build time by CMakeLists.txt (cmake -P): builds staging-ffi with cargo, asking rustc which
# system libraries a static link of libstaging_ffi.a needs, and writes the package files with them.
# cargo replays the note when nothing is rebuilt, so a fresh build still finds it.

set(_command "${CARGO}" rustc -p staging-ffi --lib --profile "${PROFILE}"
  --manifest-path "${MANIFEST}" --target-dir "${TARGET_DIR}" ${CARGO_FLAGS}
  -- --print native-static-libs)
if(CMAKE_VERSION VERSION_GREATER_EQUAL 3.18)
  set(_echo ECHO_ERROR_VARIABLE)
endif()
execute_process(COMMAND ${_command} RESULT_VARIABLE _rc ERROR_VARIABLE _err ${_echo})
if(NOT _rc EQUAL 0)
  if(NOT _echo)
    message("${_err}")
  endif()
  message(FATAL_ERROR "cargo failed (${_rc})")
endif()

string(REGEX MATCH "native-static-libs: ([^\n]*)" _match "${_err}")
if(NOT _match)
  message(FATAL_ERROR "rustc printed no native-static-libs note; cargo said:\n${_err}")
endif()
string(STRIP "${CMAKE_MATCH_1}" NATIVE_STATIC_LIBS)
separate_arguments(_libs UNIX_COMMAND "${NATIVE_STATIC_LIBS}")
string(REPLACE ";" " " NATIVE_STATIC_LIBS "${_libs}")
# In CMake, as a list of link flags (`-lm`) for INTERFACE_LINK_LIBRARIES.
set(NATIVE_STATIC_LIBS_CMAKE "${_libs}")

configure_file("${TEMPLATES}/staging_ffiConfig.cmake.in" "${OUT}/staging_ffiConfig.cmake" @ONLY)
configure_file("${TEMPLATES}/staging_ffi.pc.in" "${OUT}/staging_ffi.pc" @ONLY)
message(STATUS "staging_ffi: a static link needs ${NATIVE_STATIC_LIBS}")

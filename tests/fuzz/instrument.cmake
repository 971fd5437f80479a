# Included by the top-level CMakeLists.txt when MUSTER_FUZZ is ON, before any
# target is defined: every target of ours (libraries, generated protos and
# the fuzz targets) is compiled with libFuzzer's coverage hooks and
# AddressSanitizer + UndefinedBehaviorSanitizer. System libraries (gRPC,
# protobuf, Abseil, SQLite) are Debian's, uninstrumented.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "MUSTER_FUZZ needs clang (libFuzzer is part of it): "
                      "configure with CXX=clang++-14, see docs/fuzzing.md")
endif()
# Any UB report aborts, so libFuzzer keeps the input that caused it.
add_compile_options(-fsanitize=fuzzer-no-link,address,undefined
                    -fno-sanitize-recover=all -fno-omit-frame-pointer)
add_link_options(-fsanitize=address,undefined)
message(STATUS "muster: fuzz build (libFuzzer, ASan, UBSan)")

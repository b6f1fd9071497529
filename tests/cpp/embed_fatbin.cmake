# SPDX-License-Identifier: Apache-2.0
#
# cmake -DINPUT=<fatbin> -DOUTPUT=<cpp> -P embed_fatbin.cmake
# Writes the bytes of INPUT as asyncmr::test::test_kernels_fatbin (test_kernels.cpp loads it).
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" digits)
if(digits EQUAL 0)
  message(FATAL_ERROR "embed_fatbin: ${INPUT} is empty")
endif()
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# 32 bytes a line keeps the generated file readable in an editor.
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){32})" "\\1\n  " bytes "${bytes}")
file(WRITE "${OUTPUT}.tmp" "// Generated from ${INPUT} by embed_fatbin.cmake; do not edit.
namespace asyncmr::test {
// The driver reads the fatbin header as 64-bit words: keep it aligned.
alignas(64) extern unsigned char const test_kernels_fatbin[] = {
  ${bytes}
};
}  // namespace asyncmr::test
")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")

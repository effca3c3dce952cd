# cmake -DIN=x.spv -DOUT=x.spv.cpp -DNAME=x -P embed_spirv.cmake
# Writes the SPIR-V words of IN as `const uint32_t kSpv_NAME[]` (little endian).
file(READ ${IN} _hex HEX)
string(LENGTH "${_hex}" _len)
math(EXPR _rem "${_len} % 8")
if(_len EQUAL 0 OR NOT _rem EQUAL 0)
  message(FATAL_ERROR "${IN}: not a whole number of 32-bit words")
endif()
math(EXPR _words "${_len} / 8")
# Each group of 8 hex digits is one word in file (little-endian) byte order: swap.
string(REGEX REPLACE "(..)(..)(..)(..)" "0x\\4\\3\\2\\1u," _body "${_hex}")
string(REGEX REPLACE "((0x[0-9a-f]+u,){8})" "\\1\n  " _body "${_body}")
file(WRITE ${OUT} "// Generated from ${NAME}.spv by shaders/embed_spirv.cmake. Do not edit.\n"
  "#include <cstddef>\n#include <cstdint>\n\nnamespace loom::vk {\n"
  "extern const uint32_t kSpv_${NAME}[];\nextern const size_t kSpvWords_${NAME};\n"
  "alignas(4) const uint32_t kSpv_${NAME}[] = {\n  ${_body}\n};\n"
  "const size_t kSpvWords_${NAME} = ${_words};\n}  // namespace loom::vk\n")

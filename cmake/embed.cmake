# embed.cmake — a file as a C array, for assets shipped inside a binary (tesserad's status page).
#   cmake -DIN=FILE -DOUT=FILE.c -DNAME=SYMBOL -P cmake/embed.cmake
# writes `const unsigned char SYMBOL[]` (the bytes, then a NUL) and `const size_t SYMBOL_len`.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" digits)
math(EXPR bytes "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," array "${hex}")
get_filename_component(base "${IN}" NAME)
file(WRITE "${OUT}"
     "/* generated from ${base} by cmake/embed.cmake at build time: edit ${base} instead */\n"
     "#include <stddef.h>\n"
     "const unsigned char ${NAME}[] = {${array}0x00};\n"
     "const size_t ${NAME}_len = ${bytes};\n")

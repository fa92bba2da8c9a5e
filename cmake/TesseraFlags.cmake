# Compiler flags shared by every target. Warnings are errors.
#
# -ffp-contract=off: the per-element math is shared with the CUDA backend (kernels/math.h) and
# compiled there with --fmad=false, so neither compiler fuses a*b+c and the two backends round the
# same way (the RNG's normal stream is bit-identical across them).

set(TESSERA_C_FLAGS
  -Wall -Wextra -Werror -Wshadow -Wpointer-arith -Wstrict-prototypes -Wmissing-prototypes
  -Wvla -Wformat=2 -Wno-unused-parameter -Wno-missing-field-initializers
  -ffp-contract=off -fno-strict-aliasing
  -fstack-protector-strong -fPIE)
foreach(flag IN LISTS TESSERA_C_FLAGS)
  add_compile_options($<$<COMPILE_LANGUAGE:C>:${flag}>)
endforeach()

if(CMAKE_BUILD_TYPE STREQUAL "Release" OR CMAKE_BUILD_TYPE STREQUAL "RelWithDebInfo")
  add_compile_options($<$<COMPILE_LANGUAGE:C>:-D_FORTIFY_SOURCE=2>)
endif()
if(CMAKE_BUILD_TYPE STREQUAL "Debug")
  add_compile_options($<$<COMPILE_LANGUAGE:C>:-O1> -g)
endif()

add_link_options(-pie -Wl,-z,relro,-z,now -Wl,-z,noexecstack)

if(TESSERA_SANITIZE)
  foreach(flag -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g)
    add_compile_options($<$<COMPILE_LANGUAGE:C>:${flag}>)
  endforeach()
  add_link_options(-fsanitize=address,undefined)
endif()

# libFuzzer harnesses (tests/fuzz/): every library is instrumented for coverage, with ASan and
# UBSan; the harnesses themselves link -fsanitize=fuzzer (tests/fuzz/CMakeLists.txt).
if(TESSERA_FUZZ)
  foreach(flag -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g)
    add_compile_options($<$<COMPILE_LANGUAGE:C>:${flag}>)
  endforeach()
  add_link_options(-fsanitize=address,undefined)
endif()

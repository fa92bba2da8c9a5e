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
# Debug: -O1, debuggable; a sanitized Debug build (make test-san): -O2, where the instrumented kernels
# and protocol code run about 1.7× faster than at -O1 (test_daemon under ASan + UBSan: 246 s
# against 417 s), which keeps `make test` inside CI's time; the sanitizers check every access
# the optimised code still makes.
if(CMAKE_BUILD_TYPE STREQUAL "Debug")
  if(TESSERA_SANITIZE)
    add_compile_options($<$<COMPILE_LANGUAGE:C>:-O2> -g)
  else()
    add_compile_options($<$<COMPILE_LANGUAGE:C>:-O1> -g)
  endif()
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

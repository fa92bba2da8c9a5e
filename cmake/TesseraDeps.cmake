# Dependency checks. Every library comes from a Debian package; a missing one stops configure
# with the name of the package to install (or: run scripts/setup.sh, which installs them all).

find_package(PkgConfig)
if(NOT PKG_CONFIG_FOUND)
  message(FATAL_ERROR "pkg-config not found. Install it with: apt-get install pkg-config (or run scripts/setup.sh)")
endif()

# tessera_require_pkg(<prefix> <pkg-config module> <Debian package>)
# Defines the imported target PkgConfig::<prefix>.
function(tessera_require_pkg prefix module debpkg)
  pkg_check_modules(${prefix} QUIET IMPORTED_TARGET GLOBAL ${module})
  if(NOT ${prefix}_FOUND)
    message(FATAL_ERROR "Missing dependency '${module}'. Install it with: apt-get install ${debpkg} (or run scripts/setup.sh)")
  endif()
  message(STATUS "Found ${module} ${${prefix}_VERSION}")
endfunction()

tessera_require_pkg(UV        libuv         libuv1-dev)
tessera_require_pkg(SODIUM    libsodium     libsodium-dev)
tessera_require_pkg(PROTOBUFC libprotobuf-c libprotobuf-c-dev)
tessera_require_pkg(LMDB      lmdb          liblmdb-dev)
tessera_require_pkg(OPENBLAS  openblas      libopenblas-dev)
tessera_require_pkg(CMOCKA    cmocka        libcmocka-dev)
tessera_require_pkg(JANSSON   jansson       libjansson-dev)
tessera_require_pkg(ZLIB      zlib          zlib1g-dev)
tessera_require_pkg(PNG       libpng        libpng-dev)
tessera_require_pkg(LAPACKE   lapacke       liblapacke-dev)
tessera_require_pkg(INIH      inih          libinih-dev)
tessera_require_pkg(MHD       libmicrohttpd libmicrohttpd-dev)

# Optional: oneDNN (Debian: libdnnl-dev, 2.6) for the CPU's bf16 path (--precision bf16). Without
# it everything builds and runs in fp32, and bf16 is refused with the reason. Found by its header
# and library rather than its CMake package, which drags in OpenCL for the GPU runtime we do not
# use. omp_set_num_threads comes from libgomp, which Debian's oneDNN is built on.
option(TESSERA_DNNL "bf16 on the CPU through oneDNN when libdnnl-dev is installed" ON)
set(TESSERA_HAVE_DNNL OFF)
if(TESSERA_DNNL)
  find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h)
  find_library(DNNL_LIBRARY dnnl)
  find_package(OpenMP COMPONENTS C QUIET)
  if(DNNL_INCLUDE_DIR AND DNNL_LIBRARY AND OpenMP_C_FOUND)
    set(TESSERA_HAVE_DNNL ON)
    message(STATUS "Found oneDNN: ${DNNL_LIBRARY} (bf16 on the CPU)")
  else()
    message(WARNING "oneDNN not found: the bf16 path (--precision bf16) is off. Install it with: apt-get install libdnnl-dev (or run scripts/setup.sh)")
  endif()
else()
  message(STATUS "oneDNN not used (TESSERA_DNNL=OFF): the bf16 path (--precision bf16) is off")
endif()

find_program(PROTOC_C NAMES protoc-c protoc-gen-c)
if(NOT PROTOC_C)
  message(FATAL_ERROR "Missing protoc-c. Install it with: apt-get install protobuf-c-compiler (or run scripts/setup.sh)")
endif()

find_package(Threads REQUIRED)
find_library(LIBM m REQUIRED)

# Optional: libFuzzer, only for TESSERA_FUZZ=ON (Debian: clang and libclang-rt-dev; scripts/setup.sh
# --all installs them).
if(TESSERA_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "TESSERA_FUZZ needs clang: configure with -DCMAKE_C_COMPILER=clang (apt-get install clang libclang-rt-dev), or use tests/fuzz/run.sh")
  endif()
  include(CheckCSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS -fsanitize=fuzzer)
  check_c_source_compiles("#include <stdint.h>
#include <stddef.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }" TESSERA_HAVE_LIBFUZZER)
  unset(CMAKE_REQUIRED_FLAGS)
  if(NOT TESSERA_HAVE_LIBFUZZER)
    message(FATAL_ERROR "clang cannot link -fsanitize=fuzzer. Install it with: apt-get install libclang-rt-dev (or run scripts/setup.sh --all)")
  endif()
endif()

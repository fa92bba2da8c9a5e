# The CUDA backend. TESSERA_CUDA=AUTO builds it when nvcc and cuBLAS are found, ON requires
# them, OFF skips them. No GPU is needed to build: the backend checks for a device at run time
# and reports TS_ENODEV when there is none.

set(TESSERA_HAVE_CUDA OFF)
if(NOT TESSERA_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Turing, Ampere (A100 and consumer), Ada, Hopper.
      set(CMAKE_CUDA_ARCHITECTURES 75 80 86 89 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND AND TARGET CUDA::cublas)
      set(TESSERA_HAVE_CUDA ON)
    endif()
  endif()
  if(TESSERA_CUDA STREQUAL "ON" AND NOT TESSERA_HAVE_CUDA)
    message(FATAL_ERROR "TESSERA_CUDA=ON but nvcc or cuBLAS was not found. Install the CUDA Toolkit (nvcc on PATH) or configure with -DTESSERA_CUDA=AUTO|OFF")
  endif()
endif()

if(TESSERA_HAVE_CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # --fmad=false: see TesseraFlags.cmake (the shared per-element math rounds identically).
  # -Werror all-warnings: warnings are errors in the CUDA sources too.
  add_compile_options($<$<COMPILE_LANGUAGE:CUDA>:--fmad=false>
                      $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>
                      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Werror,-Wno-unused-parameter>)
endif()

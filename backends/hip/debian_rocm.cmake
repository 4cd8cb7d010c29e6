# Debian's and Ubuntu's ROCm packages (hipcc, libamdhip64-dev, rocm-device-libs; ROCm 5.2 with
# LLVM 15 on Debian 12) install HIP under /usr with no ROCm root folder. CMake's HIP language
# needs a root that holds lib/cmake/hip-lang, and clang needs to be told where the HIP headers and
# the device libraries are. When that layout is present and no HIP compiler was chosen, this
# file makes such a root from a symlink in the build tree and points CMake and clang at it, so a
# plain `cmake -DFLASHPORT_HIP=ON` works there. A real ROCm install (/opt/rocm) is left to CMake.
set(_fp_deb_lib /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE})
set(_fp_deb_clang /usr/lib/llvm-15/bin/clang++)
set(_fp_deb_root ${PROJECT_BINARY_DIR}/rocm-debian)
if(NOT DEFINED CMAKE_HIP_COMPILER AND NOT DEFINED ENV{HIPCXX} AND NOT EXISTS /opt/rocm
   AND CMAKE_LIBRARY_ARCHITECTURE AND EXISTS ${_fp_deb_lib}/cmake/hip-lang/hip-lang-config.cmake
   AND EXISTS ${_fp_deb_lib}/amdgcn/bitcode AND EXISTS ${_fp_deb_clang})
  file(MAKE_DIRECTORY ${_fp_deb_root}/lib/cmake)
  file(CREATE_LINK ${_fp_deb_lib}/cmake/hip-lang ${_fp_deb_root}/lib/cmake/hip-lang SYMBOLIC)
  set(CMAKE_HIP_COMPILER ${_fp_deb_clang} CACHE FILEPATH "HIP compiler (Debian ROCm layout)")
  set(CMAKE_HIP_COMPILER_ROCM_ROOT ${_fp_deb_root} CACHE PATH "ROCm root for CMake's HIP language")
  set(CMAKE_HIP_FLAGS
      "--rocm-path=/usr --rocm-device-lib-path=${_fp_deb_lib}/amdgcn/bitcode"
      CACHE STRING "Flags of the HIP compiler")
endif()
# hip-lang's dependencies (amd_comgr, AMDDeviceLibs) live in the multiarch cmake folder, which
# CMake's HIP try_compile projects do not search; they inherit the environment, so the path goes
# there, on every configure (each one loads hip-lang again).
if(CMAKE_HIP_COMPILER_ROCM_ROOT STREQUAL _fp_deb_root)
  set(ENV{CMAKE_PREFIX_PATH} "${_fp_deb_lib}/cmake:$ENV{CMAKE_PREFIX_PATH}")
endif()

# Install rules (included by the top-level CMakeLists.txt when FLASHPORT_INSTALL is ON).
#
#   <prefix>/lib/libflashport.so*              the library (SONAME libflashport.so.<major>)
#   <prefix>/lib/libflashport_<name>.so        every GPU plugin built, next to the library: the
#                                              registry looks in the library's own folder
#   <prefix>/include/flashport.h               the API (+ flashport_dlpack.h when built with it)
#   <prefix>/bin/flashport-bench               RPATH $ORIGIN/../lib, so it runs where installed
#   <prefix>/lib/cmake/flashport/              flashportConfig.cmake, its version file and the
#                                              exported target flashport::flashport
#   <prefix>/lib/pkgconfig/flashport.pc        pkg-config flashport
include(CMakePackageConfigHelpers)

install(TARGETS flashport EXPORT flashportTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/flashport.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(FLASHPORT_DLPACK)
  install(FILES ${PROJECT_SOURCE_DIR}/include/flashport_dlpack.h
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()

foreach(plugin flashport_cuda flashport_hip flashport_hipshim flashport_opencl)
  if(TARGET ${plugin})
    install(TARGETS ${plugin} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  endif()
endforeach()

if(TARGET flashport-bench)
  set_target_properties(flashport-bench PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  install(TARGETS flashport-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(FLASHPORT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashport)
install(EXPORT flashportTargets NAMESPACE flashport:: DESTINATION ${FLASHPORT_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/flashportConfig.cmake.in
  ${PROJECT_BINARY_DIR}/flashportConfig.cmake INSTALL_DESTINATION ${FLASHPORT_CMAKE_DIR})
# 0.x: a new minor version may change the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flashportConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flashportConfig.cmake
              ${PROJECT_BINARY_DIR}/flashportConfigVersion.cmake
        DESTINATION ${FLASHPORT_CMAKE_DIR})

# pkg-config: relocatable (prefix found from the .pc file's own folder, so `cmake --install
# --prefix` anywhere works) when the install dirs are relative.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(FLASHPORT_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH FLASHPORT_PC_UP /r/${CMAKE_INSTALL_LIBDIR}/pkgconfig /r)
  set(FLASHPORT_PC_PREFIX "\${pcfiledir}/${FLASHPORT_PC_UP}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(FLASHPORT_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  set(FLASHPORT_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(FLASHPORT_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(FLASHPORT_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/flashport.pc.in ${PROJECT_BINARY_DIR}/flashport.pc
               @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/flashport.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

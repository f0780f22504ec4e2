# The installed package: what `cmake --install` puts under the prefix and how other builds find
# it. Included from the top-level CMakeLists.txt after the libraries, the tools and the module.
#
#   include/dma/*.hpp (and the generated dma/version.hpp)     the public API
#   <libdir>/libdma.so.<v>, libdma.a                           dma::dma, dma::dma_static
#   <libdir>/libdma_client.so.<v>, libdma_client.a             dma::client, dma::client_static
#   <libdir>/cmake/dma/dmaConfig.cmake, dmaConfigVersion.cmake, dmaTargets*.cmake
#   <libdir>/pkgconfig/dma.pc, dma-client.pc
#   <libdir>/dma/dma.so                                        the Redis/Valkey module
#   bin/dma-*                                                  the tools
#
# libdma holds everything of src/ except the Redis client (protocol, fabric, worker, service,
# target): the server side (FabricService, ServiceSet) and the Target. libdma_client adds
# dma::Client over hiredis and links libdma, so one process using both sides has one copy of the
# process-wide registration cache (dma/memory.hpp), never two.
#
# Both are built from the objects of the static parts the tests and the module link
# (dma_protocol, dma_fabric, dma, dma_target, dma_client), compiled once: position-independent
# and with hidden visibility, so the shared libraries export only what include/dma/ marks
# DMA_EXPORT (dma/export.hpp; cmake/libdma.map keeps libstdc++'s instantiations out too).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(dma_server_parts dma_protocol dma_fabric dma dma_target)
set(dma_server_objects)
foreach(part ${dma_server_parts})
  list(APPEND dma_server_objects $<TARGET_OBJECTS:${part}>)
endforeach()
set(dma_client_objects $<TARGET_OBJECTS:dma_client>)

# SONAME: libdma.so.0.1 while the major version is 0 (every 0.x minor release may break the
# ABI), libdma.so.<major> from 1.0 on.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(dma_soversion ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
else()
  set(dma_soversion ${PROJECT_VERSION_MAJOR})
endif()

set(dma_public_includes
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

# What libdma itself needs: libfabric, isa-l (CRC32C), toml++ (Configuration::load), threads.
# Private to the shared library; the static one's consumers link them (the config file finds
# them again, dma.pc names them in Requires.private).
set(dma_server_dependencies PkgConfig::LIBFABRIC PkgConfig::ISAL tomlplusplus::tomlplusplus
                            Threads::Threads)

add_library(dma_shared SHARED ${dma_server_objects})
add_library(dma_static STATIC ${dma_server_objects})
add_library(dma_client_shared SHARED ${dma_client_objects})
add_library(dma_client_static STATIC ${dma_client_objects})
foreach(library dma_shared dma_static dma_client_shared dma_client_static)
  target_include_directories(${library} INTERFACE ${dma_public_includes})
  target_compile_features(${library} INTERFACE cxx_std_20)
endforeach()
target_link_libraries(dma_shared PRIVATE ${dma_server_dependencies})
target_link_libraries(dma_static PRIVATE ${dma_server_dependencies})
target_link_libraries(dma_client_shared PUBLIC dma_shared PRIVATE PkgConfig::HIREDIS)
target_link_libraries(dma_client_static PUBLIC dma_static PRIVATE PkgConfig::HIREDIS)

foreach(library dma_shared dma_client_shared)
  set_target_properties(${library} PROPERTIES VERSION ${PROJECT_VERSION}
                                              SOVERSION ${dma_soversion})
  # Every symbol resolved at link time (a missing dependency fails the build, not the user's
  # program), and only the public API in the dynamic symbol table.
  target_link_options(${library} PRIVATE -Wl,--version-script=${PROJECT_SOURCE_DIR}/cmake/libdma.map)
  if(NOT DMA_SANITIZE)
    # The sanitizer runtimes are linked into executables only, so a sanitized shared library
    # has undefined __asan_*/__tsan_* references by design.
    target_link_options(${library} PRIVATE -Wl,-z,defs)
  endif()
  set_property(TARGET ${library} APPEND PROPERTY LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/libdma.map)
endforeach()
# Installed names: libdma.so/libdma.a and libdma_client.so/libdma_client.a. The static archives
# are built into lib/static/ because lib/libdma.a and lib/libdma_client.a are the build's own
# parts (the worker and service alone, and the client alone).
set_target_properties(dma_shared PROPERTIES OUTPUT_NAME dma EXPORT_NAME dma)
set_target_properties(dma_static PROPERTIES OUTPUT_NAME dma EXPORT_NAME dma_static
                      ARCHIVE_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib/static)
set_target_properties(dma_client_shared PROPERTIES OUTPUT_NAME dma_client EXPORT_NAME client)
set_target_properties(dma_client_static PROPERTIES OUTPUT_NAME dma_client
                      EXPORT_NAME client_static
                      ARCHIVE_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib/static)
# The same names inside this build, for a project that adds this tree with add_subdirectory.
add_library(dma::dma ALIAS dma_shared)
add_library(dma::dma_static ALIAS dma_static)
add_library(dma::client ALIAS dma_client_shared)
add_library(dma::client_static ALIAS dma_client_static)

set(DMA_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/dma)
# The module under its own directory of libdir: it is a plugin loaded by path, not a library
# anything links. support/src/redis_server.cpp looks for it there from an installed tool.
set(DMA_INSTALL_MODULEDIR ${CMAKE_INSTALL_LIBDIR}/dma)

# An installed tool finds the installed module (support/src/redis_server.cpp).
target_compile_definitions(dma_support PRIVATE
                           DMA_INSTALLED_MODULE="${DMA_INSTALL_MODULEDIR}/dma.so")
# libdma_client.so finds the libdma.so installed beside it.
set_target_properties(dma_client_shared PROPERTIES INSTALL_RPATH "$ORIGIN")

install(TARGETS dma_shared dma_static dma_client_shared dma_client_static
        EXPORT dmaTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/dma DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp")
install(FILES ${PROJECT_BINARY_DIR}/include/dma/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dma)
install(EXPORT dmaTargets NAMESPACE dma:: DESTINATION ${DMA_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/dmaConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cmake/dmaConfig.cmake
                              INSTALL_DESTINATION ${DMA_INSTALL_CMAKEDIR}
                              PATH_VARS DMA_INSTALL_MODULEDIR)
# 0.x: only the same minor version is compatible (as the SONAME says); from 1.0, the same major.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(dma_compatibility SameMinorVersion)
else()
  set(dma_compatibility SameMajorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/dmaConfigVersion.cmake
                                 COMPATIBILITY ${dma_compatibility})
install(FILES ${PROJECT_BINARY_DIR}/cmake/dmaConfig.cmake
              ${PROJECT_BINARY_DIR}/cmake/dmaConfigVersion.cmake
        DESTINATION ${DMA_INSTALL_CMAKEDIR})

# pkg-config: paths relative to ${pcfiledir}, so a copied or relocated prefix still works.
file(RELATIVE_PATH dma_pc_prefix
     ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" dma_pc_prefix "${dma_pc_prefix}")
foreach(pc dma dma-client)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${pc}.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/${pc}.pc
                 @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/${pc}.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()

if(TARGET dma_redis_module)
  # Executable: redis-server refuses to load a module without execute permission, and CMake
  # on Debian installs shared objects without it (CMAKE_INSTALL_SO_NO_EXE).
  install(TARGETS dma_redis_module LIBRARY DESTINATION ${DMA_INSTALL_MODULEDIR}
          PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                      WORLD_READ WORLD_EXECUTE)
endif()
foreach(tool dma-cli dma-info dma-demo dma-soak dma-bench dma-bench-crc32c)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

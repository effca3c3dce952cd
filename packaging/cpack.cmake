# The Debian package (CPack's DEB generator): `cmake --build B && cpack --config
# B/CPackConfig.cmake`, or `packaging/dev.sh deb`, gives loom_<version>_amd64.deb with
# loom and loom-chat in /usr/bin, the desktop file, hicolor icons, AppStream
# metainfo, man pages and the copyright and changelog files. Dependencies come
# from dpkg-shlibdeps; only what is opened at run time is named by hand: Qt's
# SVG plugin (Depends), the Vulkan loader, a Vulkan driver and the Inter font
# (Recommends).
include(GNUInstallDirs)
set(CMAKE_INSTALL_DEFAULT_DIRECTORY_PERMISSIONS
    OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
set(_pkg ${PROJECT_SOURCE_DIR}/packaging/debian)
set(_gen ${CMAKE_BINARY_DIR}/packaging)
set(LOOM_APP_ID dev.loom.Loom)
# A fixed date (the release's) keeps the package reproducible.
set(LOOM_RELEASE_DATE "2026-12-03")
set(LOOM_RELEASE_DATE_RFC2822 "Thu, 03 Dec 2026 00:00:00 +0000")

# Man pages, from the programs' own --help through help2man (Debian's help2man).
find_program(LOOM_HELP2MAN help2man)
find_program(LOOM_GZIP gzip)
if(LOOM_HELP2MAN AND LOOM_GZIP)
  set(_man "")
  foreach(prog loom loom-chat)
    if(NOT TARGET ${prog})
      continue()
    endif()
    if(prog STREQUAL "loom")
      set(_desc "local LLM engine: run, benchmark and plan models across GPU and CPU")
    else()
      set(_desc "the Loom desktop app: chat with a local model and watch where it runs")
    endif()
    add_custom_command(
      OUTPUT ${_gen}/${prog}.1.gz
      COMMAND ${CMAKE_COMMAND} -E make_directory ${_gen}
      COMMAND ${CMAKE_COMMAND} -E env QT_QPA_PLATFORM=offscreen ${LOOM_HELP2MAN} --no-info
              --no-discard-stderr --section 1 --name ${_desc} --output ${_gen}/${prog}.1
              $<TARGET_FILE:${prog}>
      COMMAND ${LOOM_GZIP} -9nf ${_gen}/${prog}.1
      DEPENDS ${prog}
      COMMENT "Man page for ${prog} (help2man)")
    list(APPEND _man ${_gen}/${prog}.1.gz)
  endforeach()
  add_custom_target(loom_manpages ALL DEPENDS ${_man})
  install(FILES ${_man} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
else()
  message(STATUS "Loom: help2man not found: the package will have no man pages (install help2man)")
endif()

# Desktop integration (the app's own install rules put the .desktop file and icons).
if(LOOM_GUI)
  configure_file(${_pkg}/loom.metainfo.xml.in ${_gen}/${LOOM_APP_ID}.metainfo.xml @ONLY)
  install(FILES ${_gen}/${LOOM_APP_ID}.metainfo.xml DESTINATION ${CMAKE_INSTALL_DATADIR}/metainfo)
endif()

# /usr/share/doc/loom: copyright, and the changelog compressed as Debian policy asks.
configure_file(${_pkg}/changelog.in ${_gen}/changelog @ONLY)
if(LOOM_GZIP)
  add_custom_command(OUTPUT ${_gen}/changelog.gz
                     COMMAND ${LOOM_GZIP} -9nkf ${_gen}/changelog
                     DEPENDS ${_gen}/changelog)
  add_custom_target(loom_changelog ALL DEPENDS ${_gen}/changelog.gz)
  install(FILES ${_gen}/changelog.gz DESTINATION ${CMAKE_INSTALL_DOCDIR})
endif()
install(FILES ${_pkg}/copyright DESTINATION ${CMAKE_INSTALL_DOCDIR})

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME loom)
set(CPACK_PACKAGE_VENDOR "The Loom developers")
set(CPACK_PACKAGE_CONTACT "The Loom developers <loom-dev@example.org>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# Qt's SVG image plugin is loaded at run time (the app's icons are SVG), so
# dpkg-shlibdeps cannot see it: it is the one dependency named by hand.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libqt6svg6")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libvulkan1, mesa-vulkan-drivers | vulkan-icd, fonts-inter")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "local LLM workstation: chat with GGUF models on GPU and CPU at once
Loom runs one language model across several compute units: the GPU through
Vulkan for the big matrix work and the CPU through AVX-512/AVX2, each layer
placed where it serves best. The desktop app (loom-chat) shows the per-layer
placement and the latency it produces, and lets the user change it while
chatting. The command-line program (loom) runs, benchmarks and plans models.")
include(CPack)

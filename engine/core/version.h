#pragma once
// Loom's version and the git commit it was built from (written at build time by
// cmake/version.cmake, so a new commit shows without re-running CMake).

namespace loom {

/// The release version, e.g. "0.1.0" (CMake's PROJECT_VERSION).
const char* version();
/// The short git commit of the source tree ("unknown" outside a git checkout;
/// "-dirty" appended when tracked files had uncommitted changes).
const char* git_commit();
/// "0.1.0 (commit 1a2b3c4d5e6f)": what `--version` and the About box print.
const char* version_line();

}  // namespace loom

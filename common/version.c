/* version.c — see version.h. The values come from the build (CMake). */
#include "common/version.h"

#include "strata_git_commit.h" /* generated: STRATA_GIT_COMMIT */

#ifndef STRATA_VERSION
#define STRATA_VERSION "0.0.0"
#endif
#ifndef STRATA_BUILD_TYPE
#define STRATA_BUILD_TYPE "unknown"
#endif

const char *st_version(void) { return STRATA_VERSION; }
const char *st_git_commit(void) { return STRATA_GIT_COMMIT[0] ? STRATA_GIT_COMMIT : "unknown"; }
const char *st_build_type(void) { return STRATA_BUILD_TYPE[0] ? STRATA_BUILD_TYPE : "unknown"; }

void st_version_print(FILE *f, const char *prog) {
    fprintf(f, "%s %s (commit %s, %s build)\n", prog, st_version(), st_git_commit(), st_build_type());
}

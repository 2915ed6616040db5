/* version.h — what every Strata binary says about its build: the release
 * version, the git commit it was built from and the CMake build type. One
 * source for --version (every binary), GET /version and the gRPC GetStatus.
 *
 * The commit is read at build time (cmake/git_commit.cmake runs on every
 * build and rewrites the generated header only when it changed): 12 hex
 * digits, "+dirty" when tracked files differed from HEAD, or "unknown" when
 * the source is not a git checkout or git is missing.
 */
#ifndef STRATA_COMMON_VERSION_H
#define STRATA_COMMON_VERSION_H

#include <stdio.h>

const char *st_version(void);    /* "0.1.0" */
const char *st_git_commit(void); /* "1a2b3c4d5e6f", "1a2b3c4d5e6f+dirty" or "unknown" */
const char *st_build_type(void); /* "Release", "Debug", "Asan", ... ("unknown" if unset) */

/* Prints "PROG VERSION (commit C, BUILD build)\n" to f: the --version line. */
void st_version_print(FILE *f, const char *prog);

#endif

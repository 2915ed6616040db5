/* state_file.h — persistence of the live cluster state (strata-coordinator
 * --state FILE, default ./strata-state.json): the current placement (epoch,
 * stages), the highest epoch used, the model's checksum, and the known nodes
 * (name, data-plane address). JSON, written atomically: FILE.tmp, fsync,
 * rename over FILE, fsync of the directory. A restarted coordinator reads it,
 * waits for the placement's nodes to register again, and serves the same
 * placement under the same epoch (the workers still hold its stages, so the
 * assignment is idempotent and nothing reloads).
 */
#ifndef STRATA_COORDINATOR_STATE_FILE_H
#define STRATA_COORDINATOR_STATE_FILE_H

#include "common/err.h"
#include "coordinator/control/placement.h"
#include "coordinator/control/registry.h"

/* Writes the state. -1 + err (the path and errno) on failure. */
int state_save(const char *path, const placement *p, uint64_t last_epoch, const char *model_sha256,
               const registry *r, st_err *err);

/* Reads it into *p (epoch 0 = none) and *last_epoch, and adds the known nodes
 * to r (registry_add_known). Returns 1 when the file does not exist (nothing
 * restored), 0 when restored, -1 + err on a corrupt file or a state written
 * for a model with a different checksum. */
int state_load(const char *path, placement *p, uint64_t *last_epoch, const char *model_sha256,
               registry *r, st_err *err);

/* The same JSON as text (malloc'd; NULL when out of memory); r NULL: no
 * nodes (the etcd store keeps each node in its own key, etcd_store.c). */
char *state_dump(const placement *p, uint64_t last_epoch, const char *model_sha256, const registry *r);
/* Parses that text as state_load does (`what` names it in errors); r may be NULL. */
int state_parse(const char *text, size_t len, const char *what, placement *p, uint64_t *last_epoch,
                const char *model_sha256, registry *r, st_err *err);

#endif

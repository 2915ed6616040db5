/* journal.h — an append-only journal of small records (the registry's
 * changes between two state snapshots, docs/recovery.md "Coordinator state").
 *
 * File: records back to back, each
 *     u32 little-endian  payload length (1 .. JOURNAL_RECORD_MAX)
 *     4 bytes            the first 4 bytes of SHA-256(payload) (libcrypto)
 *     payload
 * A record whose length or checksum does not hold, or that the file ends
 * inside (a torn write: the process died mid-append), ends the replay: it and
 * everything after it are logged ("journal PATH: torn record at byte N: ...;
 * M byte(s) dropped") and cut off, so appends continue after the last whole
 * record.
 *
 * Durability: journal_append returns once the record is in the kernel
 * (write(2)): a crash of the process (SIGKILL) loses nothing appended.
 * journal_sync (fsync) makes it survive a power loss; the owner calls it in
 * batches (the coordinator: every tick, <= 250 ms), so one fsync covers many
 * records and none runs per record.
 */
#ifndef STRATA_COORDINATOR_JOURNAL_H
#define STRATA_COORDINATOR_JOURNAL_H

#include <stddef.h>

#include "common/err.h"

#define JOURNAL_RECORD_MAX (64u << 10)

typedef struct journal journal;

/* A replayed record (payload of len bytes, not NUL-terminated). Return 0, or
 * -1 with err to stop the replay (journal_open then fails). */
typedef int (*journal_fn)(const char *payload, size_t len, void *ud, st_err *err);

/* Opens (creates) path, replays its whole records in order through fn, cuts
 * off a torn tail, and leaves the file open for appending. NULL + err
 * ("journal PATH: REASON") when it cannot be read or written, or fn failed. */
journal *journal_open(const char *path, journal_fn fn, void *ud, st_err *err);

/* Appends one record (1 .. JOURNAL_RECORD_MAX bytes). -1 + err on a write
 * failure (the partial record, if any, is cut off again). */
int journal_append(journal *j, const void *payload, size_t len, st_err *err);

/* fsync when something was appended since the last sync. -1 + err on failure. */
int journal_sync(journal *j, st_err *err);

/* Empties the journal (after a snapshot that holds everything in it). */
int journal_reset(journal *j, st_err *err);

/* Records in the file now (replayed + appended since the last reset). */
size_t journal_records(const journal *j);

void journal_close(journal *j);

#endif

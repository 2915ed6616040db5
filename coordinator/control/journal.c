/* journal.c — the append-only record journal (journal.h). */
#include "coordinator/control/journal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/sha256.h"

struct journal {
    int fd;
    char *path;
    off_t size;     /* bytes of whole records */
    size_t records;
    bool dirty;     /* appended since the last fsync */
};

static uint32_t get_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8), p[2] = (unsigned char)(v >> 16),
    p[3] = (unsigned char)(v >> 24);
}

/* The first 4 bytes of SHA-256(payload). */
static int checksum(const void *payload, size_t len, unsigned char out[4]) {
    unsigned char d[32];
    const void *parts[] = {payload};
    if (st_sha256_parts(parts, &len, 1, d) != 0) return -1;
    memcpy(out, d, 4);
    return 0;
}

static int read_all(int fd, unsigned char **out, size_t *len) {
    struct stat st;
    if (fstat(fd, &st) != 0) return -1;
    size_t n = (size_t)st.st_size;
    unsigned char *buf = malloc(n ? n : 1);
    if (!buf) return errno = ENOMEM, -1;
    size_t off = 0;
    while (off < n) {
        ssize_t r = pread(fd, buf + off, n - off, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        off += (size_t)r;
    }
    *out = buf;
    *len = off;
    return 0;
}

journal *journal_open(const char *path, journal_fn fn, void *ud, st_err *err) {
    journal *j = calloc(1, sizeof *j);
    if (!j || !(j->path = strdup(path))) {
        free(j);
        return st_errf(err, "journal %s: out of memory", path), NULL;
    }
    j->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    unsigned char *buf = NULL;
    size_t len = 0;
    if (j->fd < 0 || read_all(j->fd, &buf, &len) != 0) {
        st_errf(err, "journal %s: %s", path, strerror(errno));
        journal_close(j);
        return NULL;
    }
    size_t off = 0;
    const char *why = NULL;
    while (off < len) {
        if (len - off < 8) {
            why = "the file ends inside a record header";
            break;
        }
        uint32_t n = get_le32(buf + off);
        unsigned char got[4];
        if (n == 0 || n > JOURNAL_RECORD_MAX) {
            why = "bad record length";
            break;
        }
        if (len - off - 8 < n) {
            why = "the file ends inside a record";
            break;
        }
        if (checksum(buf + off + 8, n, got) != 0 || memcmp(got, buf + off + 4, 4)) {
            why = "checksum mismatch";
            break;
        }
        if (fn && fn((const char *)buf + off + 8, n, ud, err) != 0) {
            free(buf);
            journal_close(j);
            return NULL;
        }
        off += 8 + n;
        j->records++;
    }
    free(buf);
    if (why) {
        ST_WARN("journal %s: torn record at byte %zu (%s); %zu byte(s) dropped, %zu whole record(s) kept", path,
                off, why, len - off, j->records);
        if (ftruncate(j->fd, (off_t)off) != 0 || fsync(j->fd) != 0) {
            st_errf(err, "journal %s: cannot cut off the torn tail: %s", path, strerror(errno));
            journal_close(j);
            return NULL;
        }
    }
    j->size = (off_t)off;
    return j;
}

int journal_append(journal *j, const void *payload, size_t len, st_err *err) {
    if (len == 0 || len > JOURNAL_RECORD_MAX)
        return st_errf(err, "journal %s: a record of %zu bytes (want 1..%u)", j->path, len, JOURNAL_RECORD_MAX);
    unsigned char hdr[8];
    put_le32(hdr, (uint32_t)len);
    if (checksum(payload, len, hdr + 4) != 0) return st_errf(err, "journal %s: cannot hash the record", j->path);
    /* one buffer, one pwrite: a record is torn only by a crash inside it */
    unsigned char stackbuf[1024], *rec = len + 8 <= sizeof stackbuf ? stackbuf : malloc(len + 8);
    if (!rec) return st_errf(err, "journal %s: out of memory", j->path);
    memcpy(rec, hdr, 8);
    memcpy(rec + 8, payload, len);
    size_t off = 0;
    int e = 0;
    while (off < len + 8) {
        ssize_t w = pwrite(j->fd, rec + off, len + 8 - off, j->size + (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            e = w < 0 ? errno : EIO;
            break;
        }
        off += (size_t)w;
    }
    if (rec != stackbuf) free(rec);
    if (e) {
        if (ftruncate(j->fd, j->size) != 0) /* keep the file whole-record; replay cuts it otherwise */
            ST_WARN("journal %s: cannot cut off a partial record: %s", j->path, strerror(errno));
        return st_errf(err, "journal %s: %s", j->path, strerror(e));
    }
    j->size += (off_t)(len + 8);
    j->records++;
    j->dirty = true;
    return 0;
}

int journal_sync(journal *j, st_err *err) {
    if (!j->dirty) return 0;
    if (fsync(j->fd) != 0) return st_errf(err, "journal %s: fsync: %s", j->path, strerror(errno));
    j->dirty = false;
    return 0;
}

int journal_reset(journal *j, st_err *err) {
    if (ftruncate(j->fd, 0) != 0 || fsync(j->fd) != 0)
        return st_errf(err, "journal %s: cannot empty it: %s", j->path, strerror(errno));
    j->size = 0;
    j->records = 0;
    j->dirty = false;
    return 0;
}

size_t journal_records(const journal *j) { return j->records; }

void journal_close(journal *j) {
    if (!j) return;
    if (j->fd >= 0) close(j->fd);
    free(j->path);
    free(j);
}

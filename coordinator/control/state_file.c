/* state_file.c — the live cluster state as an atomically written JSON file
 * (state_file.h). */
#include "coordinator/control/state_file.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *state_dump(const placement *p, uint64_t last_epoch, const char *model_sha256, const registry *r) {
    json_t *stages = json_array(), *nodes = json_array();
    for (int i = 0; i < p->n_stages; i++)
        json_array_append_new(stages, json_pack("{s:s,s:i,s:i,s:i}", "node", p->st[i].node, "first",
                                                p->st[i].first, "last", p->st[i].last, "tp", p->st[i].tp));
    for (int i = 0; r && i < r->n; i++)
        json_array_append_new(nodes, json_pack("{s:s,s:s}", "name", r->nodes[i].name, "data_address",
                                               r->nodes[i].data_address));
    json_t *root = json_pack("{s:i,s:I,s:I,s:i,s:s,s:o,s:o}", "version", 1, "epoch", (json_int_t)p->epoch,
                             "last_epoch", (json_int_t)last_epoch, "n_layers", p->n_layers,
                             "model_sha256", model_sha256 ? model_sha256 : "", "stages", stages,
                             "nodes", nodes);
    char *text = root ? json_dumps(root, JSON_INDENT(1)) : NULL;
    json_decref(root);
    return text;
}

int state_save(const char *path, const placement *p, uint64_t last_epoch, const char *model_sha256,
               const registry *r, st_err *err) {
    char *text = state_dump(p, last_epoch, model_sha256, r);
    if (!text) return st_errf(err, "state %s: out of memory", path);
    size_t len = strlen(text);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(text);
        return st_errf(err, "state %s: %s", tmp, strerror(errno));
    }
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    free(text);
    int e = off == len ? 0 : errno ? errno : EIO;
    if (!e && fsync(fd) != 0) e = errno;
    if (close(fd) != 0 && !e) e = errno;
    if (!e && rename(tmp, path) != 0) e = errno;
    if (e) {
        unlink(tmp);
        return st_errf(err, "state %s: %s", path, strerror(e));
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

static int parse(json_t *root, const char *path, placement *p, uint64_t *last_epoch, const char *model_sha256,
                 registry *r, st_err *err);

int state_load(const char *path, placement *p, uint64_t *last_epoch, const char *model_sha256,
               registry *r, st_err *err) {
    memset(p, 0, sizeof *p);
    *last_epoch = 0;
    if (access(path, F_OK) != 0 && errno == ENOENT) return 1;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return st_errf(err, "state %s: line %d: %s", path, je.line, je.text);
    return parse(root, path, p, last_epoch, model_sha256, r, err);
}

int state_parse(const char *text, size_t len, const char *what, placement *p, uint64_t *last_epoch,
                const char *model_sha256, registry *r, st_err *err) {
    memset(p, 0, sizeof *p);
    *last_epoch = 0;
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root) return st_errf(err, "state %s: %s", what, je.text);
    return parse(root, what, p, last_epoch, model_sha256, r, err);
}

/* Takes root. */
static int parse(json_t *root, const char *path, placement *p, uint64_t *last_epoch, const char *model_sha256,
                 registry *r, st_err *err) {
    json_error_t je;
    json_int_t epoch = 0, last = 0;
    int n_layers = 0;
    const char *sha = "";
    json_t *stages = NULL, *nodes = NULL;
    if (json_unpack_ex(root, &je, 0, "{s:I,s:I,s:i,s:s,s:o,s:o}", "epoch", &epoch, "last_epoch", &last,
                       "n_layers", &n_layers, "model_sha256", &sha, "stages", &stages, "nodes",
                       &nodes) != 0 ||
        !json_is_array(stages) || !json_is_array(nodes) || epoch < 0 || last < epoch) {
        json_decref(root);
        return st_errf(err, "state %s: not a strata state file (%s)", path, je.text);
    }
    if (model_sha256 && sha[0] && strcmp(sha, model_sha256)) {
        st_errf(err, "state %s was written for a model with sha256 %.12s..., this one is %.12s...; "
                "move the file away to start afresh", path, sha, model_sha256);
        json_decref(root);
        return -1;
    }
    size_t i;
    json_t *v;
    int rc = 0;
    json_array_foreach(stages, i, v) {
        const char *node;
        int first, lastl, tp;
        if (i >= PLACE_STAGE_MAX ||
            json_unpack(v, "{s:s,s:i,s:i,s:i}", "node", &node, "first", &first, "last", &lastl, "tp", &tp) ||
            strlen(node) >= sizeof p->st[0].node) {
            rc = st_errf(err, "state %s: bad stage %zu", path, i);
            break;
        }
        snprintf(p->st[i].node, sizeof p->st[i].node, "%s", node);
        p->st[i].first = first;
        p->st[i].last = lastl;
        p->st[i].tp = tp;
        p->n_stages = (int)i + 1;
    }
    json_array_foreach(nodes, i, v) {
        const char *name, *addr;
        if (rc || json_unpack(v, "{s:s,s:s}", "name", &name, "data_address", &addr)) {
            if (!rc) rc = st_errf(err, "state %s: bad node %zu", path, i);
            break;
        }
        if (r) registry_add_known(r, name, addr);
    }
    if (rc == 0) {
        p->epoch = (uint64_t)epoch;
        p->n_layers = n_layers;
        *last_epoch = (uint64_t)last;
        if (p->epoch && p->n_stages == 0) p->epoch = 0;
    } else {
        memset(p, 0, sizeof *p);
    }
    json_decref(root);
    return rc ? -1 : 0;
}

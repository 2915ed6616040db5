/* cluster_config.c — parses and validates the cluster INI file (libinih).
 * See cluster_config.h and docs/cluster-config.md. */
#include "coordinator/config/cluster_config.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SECTIONS (PLACE_MAX_STAGES + 8)
#define MAX_KEYS 64

/* One section header as seen in the raw text, in file order. */
typedef struct sect {
    char name[COORD_HOST_MAX];
    int line;
    int kind;      /* 0 cluster, 1 stage.N, 2 worker NAME, -1 unknown */
    int index;     /* stage index (kind 1), or order (kind 2) */
    char keys[MAX_KEYS][32]; /* keys seen (duplicate detection) */
    int n_keys;
    int has_address;
} sect;

typedef struct parser {
    const char *text, *pos; /* reader state */
    const char *name;       /* file name for messages */
    int line;               /* line of the last line handed to inih */
    bool line_too_long;
    sect sects[MAX_SECTIONS];
    int n_sects;
    bool too_many_sects;
    coord_config *cfg;
    st_err *err;
    bool failed;
    bool live; /* live mode (coord_config_load_live): no stage sections */
} parser;

static int fail(parser *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(parser *p, int line, const char *fmt, ...) {
    if (p->failed) return 0;
    p->failed = true;
    char msg[ST_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0)
        st_errf(p->err, "%s:%d: %s", p->name, line, msg);
    else
        st_errf(p->err, "%s: %s", p->name, msg);
    return 0; /* inih: handler error */
}

static void trim(char *s) {
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    size_t i = 0;
    while (s[i] && isspace((unsigned char)s[i])) i++;
    if (i) memmove(s, s + i, n - i + 1);
}

static void classify(sect *s, int order) {
    s->kind = -1;
    if (strcmp(s->name, "cluster") == 0) {
        s->kind = 0;
    } else if (strncmp(s->name, "stage.", 6) == 0) {
        const char *d = s->name + 6;
        if (*d && strspn(d, "0123456789") == strlen(d) && strlen(d) <= 3) {
            s->kind = 1;
            s->index = atoi(d);
        }
    } else if (strncmp(s->name, "worker", 6) == 0 && isspace((unsigned char)s->name[6])) {
        char tmp[COORD_HOST_MAX];
        snprintf(tmp, sizeof tmp, "%s", s->name + 6);
        trim(tmp);
        if (tmp[0]) {
            s->kind = 2;
            s->index = order;
        }
    }
}

/* Records "[name]" headers (same rules as inih: first non-space char '['). */
static void note_header(parser *p, const char *line) {
    while (*line == ' ' || *line == '\t') line++;
    if (*line != '[') return;
    const char *end = strchr(line + 1, ']');
    if (!end) return; /* inih reports the syntax error */
    if (p->n_sects >= MAX_SECTIONS) {
        p->too_many_sects = true;
        return;
    }
    sect *s = &p->sects[p->n_sects];
    memset(s, 0, sizeof *s);
    size_t n = (size_t)(end - line - 1);
    if (n >= sizeof s->name) n = sizeof s->name - 1;
    memcpy(s->name, line + 1, n);
    s->name[n] = '\0';
    trim(s->name);
    s->line = p->line;
    int order = 0;
    for (int i = 0; i < p->n_sects; i++)
        if (p->sects[i].kind == 2) order++;
    classify(s, order);
    p->n_sects++;
}

/* fgets-like reader over the text that counts lines and records headers. */
static char *reader(char *buf, int num, void *stream) {
    parser *p = stream;
    if (!*p->pos) return NULL;
    const char *nl = strchr(p->pos, '\n');
    size_t len = nl ? (size_t)(nl - p->pos + 1) : strlen(p->pos);
    p->line++;
    if (len > (size_t)num - 1) {
        if (!p->line_too_long)
            fail(p, p->line, "line longer than %d characters", num - 2);
        p->line_too_long = true;
        len = 0; /* hand inih an empty line and skip this one */
        buf[0] = '\n';
        buf[1] = '\0';
        p->pos += nl ? (size_t)(nl - p->pos + 1) : strlen(p->pos);
        return buf;
    }
    memcpy(buf, p->pos, len);
    buf[len] = '\0';
    p->pos += len;
    note_header(p, buf);
    return buf;
}

static int parse_int(parser *p, const char *sec, const char *key, const char *v, long lo, long hi,
                     int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || errno || *end || x < lo || x > hi)
        return fail(p, p->line, "[%s]: %s = '%s': expected an integer in [%ld, %ld]", sec, key, v,
                    lo, hi);
    *out = (int)x;
    return 1;
}

/* A fraction in (0, 1] ("0.9"). */
static int parse_fraction(parser *p, const char *sec, const char *key, const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || errno || *end || !(x > 0 && x <= 1))
        return fail(p, p->line, "[%s]: %s = '%s': expected a fraction in (0, 1], e.g. 0.9", sec, key, v);
    *out = x;
    return 1;
}

static int parse_bool(parser *p, const char *sec, const char *key, const char *v, bool *out) {
    if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "on") || !strcmp(v, "yes"))
        *out = true;
    else if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "no"))
        *out = false;
    else
        return fail(p, p->line, "[%s]: %s = '%s': expected true or false", sec, key, v);
    return 1;
}

static int set_str(parser *p, char **dst, const char *v) {
    free(*dst);
    *dst = strdup(v);
    if (!*dst) return fail(p, p->line, "out of memory");
    return 1;
}

static sect *current_sect(parser *p, const char *section) {
    for (int i = p->n_sects - 1; i >= 0; i--)
        if (strcmp(p->sects[i].name, section) == 0) return &p->sects[i];
    return NULL;
}

static int cluster_key(parser *p, const char *k, const char *v) {
    coord_config *c = p->cfg;
    if (!strcmp(k, "model")) {
        if (!*v) return fail(p, p->line, "[cluster]: model must not be empty");
        return set_str(p, &c->model, v);
    }
    if (!strcmp(k, "model_name")) {
        if (!*v) return fail(p, p->line, "[cluster]: model_name must not be empty");
        return set_str(p, &c->model_name, v);
    }
    if (!strcmp(k, "worker_model")) {
        if (!*v || v[0] == '/') return fail(p, p->line, "[cluster]: worker_model must be a relative path (under the workers' --model-dir)");
        for (const char *q = v; *q; q = strchr(q, '/') ? strchr(q, '/') + 1 : q + strlen(q))
            if (!strncmp(q, "..", 2) && (q[2] == '/' || !q[2]))
                return fail(p, p->line, "[cluster]: worker_model must not contain '..'");
        return set_str(p, &c->worker_model, v);
    }
    if (!strcmp(k, "cluster_key_file")) {
        if (!*v) return fail(p, p->line, "[cluster]: cluster_key_file must not be empty");
        return set_str(p, &c->cluster_key_file, v);
    }
    if (!strcmp(k, "act_dtype")) {
        if (!strcmp(v, "f32"))
            c->act_dtype = COORD_ACT_F32;
        else if (!strcmp(v, "bf16"))
            c->act_dtype = COORD_ACT_BF16;
        else
            return fail(p, p->line, "[cluster]: act_dtype = '%s': expected f32 or bf16", v);
        return 1;
    }
    if (!strcmp(k, "kv_block_size")) return parse_int(p, "cluster", k, v, 1, 4096, &c->kv_block_size);
    if (!strcmp(k, "kv_blocks")) return parse_int(p, "cluster", k, v, 1, 1 << 24, &c->kv_blocks);
    if (!strcmp(k, "prefix_caching")) return parse_bool(p, "cluster", k, v, &c->prefix_caching);
    if (!strcmp(k, "n_ctx")) return parse_int(p, "cluster", k, v, 0, 1 << 24, &c->n_ctx);
    if (!strcmp(k, "max_queue")) return parse_int(p, "cluster", k, v, 1, 1 << 20, &c->max_queue);
    if (!strcmp(k, "max_seqs")) return parse_int(p, "cluster", k, v, 1, 1 << 16, &c->max_seqs);
    if (!strcmp(k, "prefill_chunk"))
        return parse_int(p, "cluster", k, v, 1, 1 << 20, &c->prefill_chunk);
    if (!strcmp(k, "max_batch_tokens"))
        return parse_int(p, "cluster", k, v, 1, 1 << 20, &c->max_batch_tokens);
    if (!strcmp(k, "max_inflight"))
        return parse_int(p, "cluster", k, v, 0, 1 << 10, &c->max_inflight);
    if (!strcmp(k, "gpu_memory_utilization"))
        return parse_fraction(p, "cluster", k, v, &c->gpu_memory_utilization);
    if (!strcmp(k, "recovery_timeout"))
        return parse_int(p, "cluster", k, v, 1, 86400, &c->recovery_timeout_s);
    if (!strcmp(k, "grpc_ca") || !strcmp(k, "grpc_cert") || !strcmp(k, "grpc_key")) {
        /* Mutual TLS of the gRPC control API (docs/security.md): live mode only. */
        if (!p->live) return fail(p, p->line, "[cluster]: %s: the gRPC control API exists only in live mode (--live)", k);
        if (!*v) return fail(p, p->line, "[cluster]: %s must not be empty", k);
        return set_str(p, !strcmp(k, "grpc_ca") ? &c->grpc_ca : !strcmp(k, "grpc_cert") ? &c->grpc_cert : &c->grpc_key,
                       v);
    }
    if (!strcmp(k, "max_body_bytes")) {
        int bytes = 0; /* up to 1 GiB */
        if (!parse_int(p, "cluster", k, v, 1024, 1 << 30, &bytes)) return 0;
        c->max_body_bytes = (size_t)bytes;
        return 1;
    }
    if (!strcmp(k, "listen")) {
        st_err e;
        if (coord_parse_hostport(v, c->http_host, sizeof c->http_host, &c->http_port, 1, &e) != 0)
            return fail(p, p->line, "[cluster]: listen: %s", e.msg);
        return 1;
    }
    if (!strcmp(k, "api_key_file")) {
        if (!*v) return fail(p, p->line, "[cluster]: api_key_file must not be empty");
        return set_str(p, &c->api_key_file, v);
    }
    if (!strcmp(k, "http_tls_cert") || !strcmp(k, "http_tls_key")) {
        if (!*v) return fail(p, p->line, "[cluster]: %s must not be empty", k);
        return set_str(p, k[9] == 'c' ? &c->http_tls_cert : &c->http_tls_key, v);
    }
    if (!strcmp(k, "protect_metrics")) {
        if (!strcmp(v, "true") || !strcmp(v, "1"))
            c->protect_metrics = 1;
        else if (!strcmp(v, "false") || !strcmp(v, "0"))
            c->protect_metrics = 0;
        else
            return fail(p, p->line, "[cluster]: protect_metrics = '%s': expected true or false", v);
        return 1;
    }
    if (!strcmp(k, "max_connections"))
        return parse_int(p, "cluster", k, v, 1, 1 << 20, &c->max_connections);
    if (!strcmp(k, "header_timeout")) return parse_int(p, "cluster", k, v, 1, 3600, &c->header_timeout_s);
    if (!strcmp(k, "body_timeout")) return parse_int(p, "cluster", k, v, 1, 3600, &c->body_timeout_s);
    if (!strcmp(k, "idle_timeout")) return parse_int(p, "cluster", k, v, 1, 86400, &c->idle_timeout_s);
    if (!strcmp(k, "max_requests_per_key"))
        return parse_int(p, "cluster", k, v, 0, 1 << 20, &c->max_requests_per_key);
    if (!strcmp(k, "partition")) {
        st_err e;
        if (place_parse_list(v, c->partition, PLACE_MAX_STAGES, &c->n_partition, &e) != 0)
            return fail(p, p->line, "[cluster]: %s", e.msg);
        return 1;
    }
    return fail(p, p->line, "[cluster]: unknown key '%s'", k);
}

static int stage_key(parser *p, sect *s, coord_stage_cfg *st, const char *k, const char *v) {
    if (!strcmp(k, "address")) {
        st_err e;
        if (coord_parse_hostport(v, st->host, sizeof st->host, &st->port, 0, &e) != 0)
            return fail(p, p->line, "[%s]: address: %s", s->name, e.msg);
        s->has_address = 1;
        return 1;
    }
    if (!strcmp(k, "tp")) return parse_int(p, s->name, k, v, 1, 64, &st->tp);
    if (!strcmp(k, "backend")) {
        if (strcmp(v, "cpu") && strcmp(v, "cuda"))
            return fail(p, p->line, "[%s]: backend '%s' is not cpu or cuda", s->name, v);
        snprintf(st->backend, sizeof st->backend, "%s", v);
        return 1;
    }
    if (!strcmp(k, "layers")) return parse_int(p, s->name, k, v, 1, 1000000, &st->n_layers);
    return fail(p, p->line, "[%s]: unknown key '%s'", s->name, k);
}

/* Stage slot for a section: stage.N -> N; worker NAME -> its order. */
static coord_stage_cfg *stage_slot(parser *p, sect *s) {
    int idx = s->index;
    if (idx < 0 || idx >= PLACE_MAX_STAGES) return NULL;
    return &p->cfg->stages[idx];
}

static int handler(void *user, const char *section, const char *name, const char *value) {
    parser *p = user;
    if (p->failed) return 1;
    sect *s = current_sect(p, section);
    if (!s || section[0] == '\0')
        return fail(p, p->line, "key '%s' outside any section (start with [cluster])", name);
    if (s->kind < 0)
        return fail(p, s->line,
                    "unknown section [%s] (expected [cluster], [stage.N] or [worker NAME])",
                    s->name);
    for (int i = 0; i < s->n_keys; i++)
        if (!strcmp(s->keys[i], name))
            return fail(p, p->line, "[%s]: duplicate key '%s'", s->name, name);
    if (s->n_keys < MAX_KEYS) snprintf(s->keys[s->n_keys++], sizeof s->keys[0], "%s", name);
    if (s->kind == 0) return cluster_key(p, name, value);
    coord_stage_cfg *st = stage_slot(p, s);
    if (!st) return fail(p, s->line, "[%s]: stage index out of range", s->name);
    return stage_key(p, s, st, name, value);
}

int coord_parse_hostport(const char *s, char *host, size_t host_cap, int *port, int allow_port0,
                         st_err *err) {
    const char *colon, *h = s;
    size_t hlen;
    if (s[0] == '[') {
        const char *rb = strchr(s, ']');
        if (!rb || rb[1] != ':') return st_errf(err, "'%s': expected [ipv6]:port", s);
        h = s + 1;
        hlen = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon) return st_errf(err, "'%s': expected host:port", s);
        if (memchr(s, ':', (size_t)(colon - s)))
            return st_errf(err, "'%s': write an IPv6 address as [addr]:port", s);
        hlen = (size_t)(colon - s);
    }
    if (hlen == 0) return st_errf(err, "'%s': empty host", s);
    if (hlen >= host_cap) return st_errf(err, "'%s': host name too long", s);
    for (size_t i = 0; i < hlen; i++)
        if (isspace((unsigned char)h[i])) return st_errf(err, "'%s': space in host", s);
    char *end;
    errno = 0;
    long v = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || errno || v < (allow_port0 ? 0 : 1) || v > 65535)
        return st_errf(err, "'%s': port must be an integer in [%d, 65535]", s, allow_port0 ? 0 : 1);
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (int)v;
    return 0;
}

static void set_defaults(coord_config *c) {
    c->act_dtype = COORD_ACT_F32;
    c->kv_block_size = 16;
    c->kv_blocks = 1024;
    c->prefix_caching = true;
    snprintf(c->http_host, sizeof c->http_host, "127.0.0.1");
    c->http_port = 8000;
    c->max_queue = 256;
    c->max_seqs = 64;
    c->prefill_chunk = 256;
    c->max_batch_tokens = 512;
    c->gpu_memory_utilization = 0.90;
    c->max_body_bytes = 1u << 20;
    c->max_connections = 1024;
    c->header_timeout_s = 10;
    c->body_timeout_s = 60;
    c->idle_timeout_s = 60;
    c->max_requests_per_key = 128;
}

static char *default_model_name(const char *path) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".gguf")) n -= 5;
    return strndup(b, n);
}

/* Cross-section checks after the parse. */
static int finish(parser *p) {
    coord_config *c = p->cfg;
    int n_cluster = 0, n_stage = 0, n_worker = 0, cluster_line = 0;
    for (int i = 0; i < p->n_sects; i++) {
        sect *s = &p->sects[i];
        if (s->kind < 0)
            return fail(p, s->line,
                        "unknown section [%s] (expected [cluster], [stage.N] or [worker NAME])",
                        s->name);
        if (s->kind == 0) {
            n_cluster++;
            cluster_line = s->line;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(p->sects[j].name, s->name))
                return fail(p, s->line, "section [%s] appears twice (first at line %d)", s->name,
                            p->sects[j].line);
        if (s->kind == 1 || s->kind == 2) {
            if (s->index >= PLACE_MAX_STAGES)
                return fail(p, s->line, "[%s]: at most %d stages", s->name, PLACE_MAX_STAGES);
        }
        n_stage += s->kind == 1;
        n_worker += s->kind == 2;
    }
    if (!n_cluster) return fail(p, 0, "missing section [cluster]");
    if (n_stage && n_worker)
        return fail(p, 0, "use either [stage.N] or [worker NAME] sections, not both");
    int n = n_stage + n_worker;
    if (n == 0 && !p->live) return fail(p, 0, "no stages: add [stage.0], [stage.1], ... or [worker NAME] sections");
    if (n > 0 && p->live)
        return fail(p, 0, "live mode (--live): workers register themselves; remove the [stage.N] / [worker NAME] sections");
    if (n == 0) { /* live mode */
        if (!c->model) return fail(p, cluster_line, "[cluster]: missing key 'model' (GGUF path)");
        if (c->n_partition) return fail(p, 0, "[cluster] partition: live mode places layers itself");
        if (!c->model_name && !(c->model_name = default_model_name(c->model)))
            return fail(p, 0, "out of memory");
        return 1;
    }
    bool seen[PLACE_MAX_STAGES] = {0};
    for (int i = 0; i < p->n_sects; i++) {
        sect *s = &p->sects[i];
        if (s->kind != 1 && s->kind != 2) continue;
        if (s->index >= n)
            return fail(p, s->line, "[%s]: stage numbers must run from 0 to %d without gaps",
                        s->name, n - 1);
        seen[s->index] = true;
        coord_stage_cfg *st = &c->stages[s->index];
        st->line = s->line;
        char tmp[COORD_HOST_MAX];
        snprintf(tmp, sizeof tmp, "%s", s->kind == 1 ? s->name : s->name + 6);
        trim(tmp);
        if (strlen(tmp) >= sizeof st->name)
            return fail(p, s->line, "[%s]: name longer than %d characters", s->name,
                        (int)sizeof st->name - 1);
        memcpy(st->name, tmp, strlen(tmp) + 1);
        if (!s->has_address) return fail(p, s->line, "[%s]: missing key 'address' (host:port)", s->name);
    }
    for (int i = 0; i < n; i++)
        if (!seen[i]) return fail(p, 0, "missing section [stage.%d] (stages must run from 0 to %d)", i, n - 1);
    c->n_stages = n;
    if (!c->model) return fail(p, cluster_line, "[cluster]: missing key 'model' (GGUF path)");
    if (!c->model_name) {
        c->model_name = default_model_name(c->model);
        if (!c->model_name) return fail(p, 0, "out of memory");
    }
    int with_layers = 0;
    for (int i = 0; i < n; i++) with_layers += c->stages[i].n_layers > 0;
    if (with_layers && with_layers != n)
        return fail(p, 0, "'layers' is given for %d of %d stages: give it for all or none",
                    with_layers, n);
    if (with_layers && c->n_partition)
        return fail(p, 0, "give either [cluster] partition or per-stage 'layers', not both");
    if (c->n_partition && c->n_partition != n)
        return fail(p, 0, "[cluster] partition lists %d stages but %d are defined", c->n_partition,
                    n);
    if (c->max_inflight && c->max_inflight < n)
        return fail(p, 0, "[cluster] max_inflight = %d is below the %d stages (the pipeline would idle)",
                    c->max_inflight, n);
    return 1;
}

void coord_config_free(coord_config *cfg) {
    if (!cfg) return;
    free(cfg->path);
    free(cfg->model);
    free(cfg->model_name);
    free(cfg->grpc_ca);
    free(cfg->grpc_cert);
    free(cfg->grpc_key);
    free(cfg->api_key_file);
    free(cfg->http_tls_cert);
    free(cfg->http_tls_key);
    free(cfg->worker_model);
    free(cfg->cluster_key_file);
    free(cfg->stages);
    memset(cfg, 0, sizeof *cfg);
}

static int config_parse(const char *text, const char *name, coord_config *cfg, bool live, st_err *err) {
    memset(cfg, 0, sizeof *cfg);
    parser *p = calloc(1, sizeof *p);
    if (!p) return st_errf(err, "%s: out of memory", name);
    p->live = live;
    p->text = p->pos = text;
    p->name = name;
    p->cfg = cfg;
    p->err = err;
    set_defaults(cfg);
    cfg->stages = calloc(PLACE_MAX_STAGES, sizeof *cfg->stages);
    cfg->path = strdup(name);
    if (!cfg->stages || !cfg->path) {
        fail(p, 0, "out of memory");
    } else {
        for (int i = 0; i < PLACE_MAX_STAGES; i++) cfg->stages[i].tp = 1;
        int rc = ini_parse_stream(reader, p, handler, p);
        if (!p->failed && rc != 0) {
            if (rc < 0)
                fail(p, 0, "cannot parse");
            else
                fail(p, rc, "syntax error (expected [section], key = value, or a ; comment)");
        }
        if (!p->failed && p->too_many_sects) fail(p, 0, "more than %d sections", MAX_SECTIONS);
        if (!p->failed) finish(p);
    }
    bool failed = p->failed;
    free(p);
    if (failed) {
        coord_config_free(cfg);
        return -1;
    }
    return 0;
}

int coord_config_parse(const char *text, const char *name, coord_config *cfg, st_err *err) {
    return config_parse(text, name, cfg, false, err);
}

static int config_load(const char *path, coord_config *cfg, bool live, st_err *err) {
    memset(cfg, 0, sizeof *cfg);
    FILE *f = fopen(path, "rb");
    if (!f) return st_errf(err, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 4096) {
            if (cap > (64u << 20)) {
                free(buf);
                fclose(f);
                return st_errf(err, "%s: larger than 64 MiB", path);
            }
            cap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return st_errf(err, "%s: out of memory", path);
            }
            buf = nb;
        }
        size_t r = fread(buf + len, 1, cap - len - 1, f);
        len += r;
        if (r == 0) break;
    }
    int ferr = ferror(f);
    fclose(f);
    if (ferr) {
        free(buf);
        return st_errf(err, "%s: read error", path);
    }
    buf[len] = '\0';
    if (memchr(buf, '\0', len)) {
        free(buf);
        return st_errf(err, "%s: contains a NUL byte (not a text file)", path);
    }
    int rc = config_parse(buf, path, cfg, live, err);
    free(buf);
    return rc;
}

int coord_config_load(const char *path, coord_config *cfg, st_err *err) {
    return config_load(path, cfg, false, err);
}

int coord_config_load_live(const char *path, coord_config *cfg, st_err *err) {
    return config_load(path, cfg, true, err);
}

int coord_config_placement(const coord_config *cfg, int n_layers, place_range *ranges,
                           st_err *err) {
    int counts[PLACE_MAX_STAGES];
    int n_explicit = 0;
    if (cfg->n_partition) {
        n_explicit = cfg->n_partition;
        memcpy(counts, cfg->partition, sizeof(int) * (size_t)n_explicit);
    } else if (cfg->n_stages > 0 && cfg->stages[0].n_layers > 0) {
        n_explicit = cfg->n_stages;
        for (int i = 0; i < n_explicit; i++) counts[i] = cfg->stages[i].n_layers;
    }
    if (place_partition(n_layers, cfg->n_stages, n_explicit ? counts : NULL, n_explicit, ranges,
                        err) != 0)
        return st_err_prefix(err, "%s", cfg->path ? cfg->path : "config");
    return 0;
}

/* metrics.c — Prometheus registry and text exposition 0.0.4 (see metrics.h). */
#include "common/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"

struct metrics_series {
    metrics_family *fam;
    char *values[METRICS_MAX_LABELS];
    double value;                               /* counter, gauge */
    double sum;                                 /* histogram */
    uint64_t count;                             /* histogram */
    uint64_t buckets[METRICS_MAX_BUCKETS + 1];  /* per bucket (not cumulative); last is +Inf */
};

struct metrics_family {
    enum metrics_type type;
    char *name, *help;
    size_t n_labels;
    char *labels[METRICS_MAX_LABELS];
    double bounds[METRICS_MAX_BUCKETS];
    size_t n_bounds;
    pthread_mutex_t mu;
    metrics_series **series;
    size_t n_series, cap_series;
};

struct metrics_registry {
    pthread_mutex_t mu;
    metrics_family **fams;
    size_t n_fams, cap_fams;
    metrics_collect_fn collect[METRICS_MAX_COLLECTORS]; /* [0]: set_collector's */
    void *collect_ud[METRICS_MAX_COLLECTORS];
};


static void sb_double(st_strbuf *b, double v) {
    char tmp[40];
    int n = metrics_format_double(tmp, sizeof tmp, v);
    st_strbuf_putn(b, tmp, (size_t)n);
}

static void sb_u64(st_strbuf *b, uint64_t v) {
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    st_strbuf_putn(b, tmp, (size_t)n);
}

/* Label values: \ -> \\, " -> \", newline -> \n. Help: the same without quotes. */
static void sb_escaped(st_strbuf *b, const char *s, bool quote) {
    for (const char *p = s; *p; p++) {
        if (*p == '\\') st_strbuf_puts(b, "\\\\");
        else if (*p == '\n') st_strbuf_puts(b, "\\n");
        else if (*p == '"' && quote) st_strbuf_puts(b, "\\\"");
        else st_strbuf_putn(b, p, 1);
    }
}

/* ---- numbers ------------------------------------------------------------ */

int metrics_format_double(char *buf, size_t size, double v) {
    if (isnan(v)) return snprintf(buf, size, "NaN");
    if (isinf(v)) return snprintf(buf, size, v > 0 ? "+Inf" : "-Inf");
    if (v == 0) return snprintf(buf, size, "0");
    /* Shortest precision that round-trips, then Go's rule for 'g' with the
     * shortest precision: exponent form when the decimal exponent is < -4 or
     * >= 6 (strconv/ftoa.go), else plain decimals. */
    char e[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    if (prec > 17) prec = 17;
    int exp = atoi(strchr(e, 'e') + 1);
    if (exp < -4 || exp >= 6) return snprintf(buf, size, "%.*e", prec - 1, v);
    int decimals = prec - 1 - exp;
    return snprintf(buf, size, "%.*f", decimals > 0 ? decimals : 0, v);
}

/* ---- names -------------------------------------------------------------- */

static bool valid_metric_name(const char *s) {
    if (!s || !*s) return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                  (p != s && c >= '0' && c <= '9');
        if (!ok) return false;
    }
    return true;
}

static bool valid_label_name(const char *s) {
    if (!s || !*s || !strncmp(s, "__", 2)) return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                  (p != s && c >= '0' && c <= '9');
        if (!ok) return false;
    }
    return true;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !memcmp(s + n - m, suffix, m);
}

/* ---- registry ----------------------------------------------------------- */

metrics_registry *metrics_registry_new(st_err *err) {
    metrics_registry *r = calloc(1, sizeof *r);
    if (!r) {
        st_errf(err, "metrics: out of memory");
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

static void series_free(metrics_series *s) {
    if (!s) return;
    for (size_t i = 0; i < METRICS_MAX_LABELS; i++) free(s->values[i]);
    free(s);
}

static void family_free(metrics_family *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n_series; i++) series_free(f->series[i]);
    free(f->series);
    for (size_t i = 0; i < f->n_labels; i++) free(f->labels[i]);
    free(f->name);
    free(f->help);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

void metrics_registry_free(metrics_registry *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n_fams; i++) family_free(r->fams[i]);
    free(r->fams);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

void metrics_registry_set_collector(metrics_registry *r, metrics_collect_fn fn, void *ud) {
    pthread_mutex_lock(&r->mu);
    r->collect[0] = fn;
    r->collect_ud[0] = ud;
    pthread_mutex_unlock(&r->mu);
}

int metrics_registry_add_collector(metrics_registry *r, metrics_collect_fn fn, void *ud,
                                   st_err *err) {
    bool added = false;
    pthread_mutex_lock(&r->mu);
    for (int i = 1; i < METRICS_MAX_COLLECTORS && !added; i++) {
        if (!r->collect[i]) {
            r->collect[i] = fn;
            r->collect_ud[i] = ud;
            added = true;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return added ? 0 : st_errf(err, "metrics: more than %d collectors", METRICS_MAX_COLLECTORS - 1);
}

/* Splits "a, b" into f->labels; returns 0 or -1 with err. */
static int parse_labels(metrics_family *f, const char *labels, st_err *err) {
    if (!labels) return 0;
    const char *p = labels;
    while (*p) {
        while (*p == ' ') p++;
        const char *end = p;
        while (*end && *end != ',') end++;
        const char *stop = end;
        while (stop > p && stop[-1] == ' ') stop--;
        if (stop == p && !*end && f->n_labels == 0) break; /* "" or "  " */
        if (f->n_labels == METRICS_MAX_LABELS)
            return st_errf(err, "metric %s: more than %d labels", f->name, METRICS_MAX_LABELS);
        char *name = strndup(p, (size_t)(stop - p));
        if (!name) return st_errf(err, "metrics: out of memory");
        f->labels[f->n_labels++] = name;
        if (!valid_label_name(name))
            return st_errf(err, "metric %s: invalid label name '%s'", f->name, name);
        for (size_t i = 0; i + 1 < f->n_labels; i++)
            if (!strcmp(f->labels[i], name))
                return st_errf(err, "metric %s: duplicate label '%s'", f->name, name);
        if (f->type == METRICS_HISTOGRAM && !strcmp(name, "le"))
            return st_errf(err, "metric %s: histograms cannot have an 'le' label", f->name);
        p = *end ? end + 1 : end;
        if (*end && !*p) return st_errf(err, "metric %s: empty label name", f->name);
    }
    return 0;
}

static metrics_series *series_new(metrics_family *f, const char *const *values) {
    metrics_series *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->fam = f;
    for (size_t i = 0; i < f->n_labels; i++) {
        s->values[i] = strdup(values[i]);
        if (!s->values[i]) {
            series_free(s);
            return NULL;
        }
    }
    if (f->n_series == f->cap_series) {
        size_t cap = f->cap_series ? f->cap_series * 2 : 4;
        metrics_series **p = realloc(f->series, cap * sizeof *p);
        if (!p) {
            series_free(s);
            return NULL;
        }
        f->series = p;
        f->cap_series = cap;
    }
    f->series[f->n_series++] = s;
    return s;
}

static metrics_family *family_new(metrics_registry *r, enum metrics_type type, const char *name,
                                  const char *help, const char *labels, const double *bounds,
                                  size_t n_bounds, st_err *err) {
    if (!r) {
        st_errf(err, "metrics: no registry");
        return NULL;
    }
    if (!valid_metric_name(name)) {
        st_errf(err, "invalid metric name '%s'", name ? name : "(null)");
        return NULL;
    }
    if (type == METRICS_COUNTER && !ends_with(name, "_total")) {
        st_errf(err, "counter %s: name must end in _total", name);
        return NULL;
    }
    if (type == METRICS_HISTOGRAM) {
        static const char *reserved[] = {"_bucket", "_sum", "_count", "_total"};
        for (size_t i = 0; i < 4; i++) {
            if (ends_with(name, reserved[i])) {
                st_errf(err, "histogram %s: name must not end in %s", name, reserved[i]);
                return NULL;
            }
        }
        if (!bounds || n_bounds == 0 || n_bounds > METRICS_MAX_BUCKETS) {
            st_errf(err, "histogram %s: needs 1..%d bucket bounds", name, METRICS_MAX_BUCKETS);
            return NULL;
        }
        for (size_t i = 0; i < n_bounds; i++) {
            if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1]))) {
                st_errf(err, "histogram %s: bounds must be finite and strictly increasing", name);
                return NULL;
            }
        }
    }
    metrics_family *f = calloc(1, sizeof *f);
    if (!f) {
        st_errf(err, "metrics: out of memory");
        return NULL;
    }
    pthread_mutex_init(&f->mu, NULL);
    f->type = type;
    f->name = strdup(name);
    f->help = strdup(help ? help : "");
    if (!f->name || !f->help) {
        family_free(f);
        st_errf(err, "metrics: out of memory");
        return NULL;
    }
    if (parse_labels(f, labels, err) != 0) {
        family_free(f);
        return NULL;
    }
    if (type == METRICS_HISTOGRAM) {
        memcpy(f->bounds, bounds, n_bounds * sizeof *bounds);
        f->n_bounds = n_bounds;
    }
    /* An unlabeled family exports 0 from the start. */
    if (f->n_labels == 0 && !series_new(f, NULL)) {
        family_free(f);
        st_errf(err, "metrics: out of memory");
        return NULL;
    }

    pthread_mutex_lock(&r->mu);
    int rc = 0;
    for (size_t i = 0; i < r->n_fams; i++) {
        if (!strcmp(r->fams[i]->name, name)) {
            rc = st_errf(err, "metric %s registered twice", name);
            break;
        }
    }
    if (rc == 0 && r->n_fams == r->cap_fams) {
        size_t cap = r->cap_fams ? r->cap_fams * 2 : 16;
        metrics_family **p = realloc(r->fams, cap * sizeof *p);
        if (!p) rc = st_errf(err, "metrics: out of memory");
        else {
            r->fams = p;
            r->cap_fams = cap;
        }
    }
    if (rc == 0) r->fams[r->n_fams++] = f;
    pthread_mutex_unlock(&r->mu);
    if (rc != 0) {
        family_free(f);
        return NULL;
    }
    return f;
}

metrics_family *metrics_counter(metrics_registry *r, const char *name, const char *help,
                                const char *labels, st_err *err) {
    return family_new(r, METRICS_COUNTER, name, help, labels, NULL, 0, err);
}

metrics_family *metrics_gauge(metrics_registry *r, const char *name, const char *help,
                              const char *labels, st_err *err) {
    return family_new(r, METRICS_GAUGE, name, help, labels, NULL, 0, err);
}

metrics_family *metrics_histogram(metrics_registry *r, const char *name, const char *help,
                                  const char *labels, const double *bounds, size_t n,
                                  st_err *err) {
    return family_new(r, METRICS_HISTOGRAM, name, help, labels, bounds, n, err);
}

metrics_series *metrics_with(metrics_family *f, const char *const *values, st_err *err) {
    if (!f) {
        st_errf(err, "metrics: no family");
        return NULL;
    }
    for (size_t i = 0; i < f->n_labels; i++) {
        if (!values || !values[i]) {
            st_errf(err, "metric %s: missing value for label '%s'", f->name, f->labels[i]);
            return NULL;
        }
    }
    pthread_mutex_lock(&f->mu);
    metrics_series *found = NULL;
    for (size_t i = 0; i < f->n_series && !found; i++) {
        metrics_series *s = f->series[i];
        size_t j = 0;
        while (j < f->n_labels && !strcmp(s->values[j], values[j])) j++;
        if (j == f->n_labels) found = s;
    }
    if (!found) found = series_new(f, values);
    pthread_mutex_unlock(&f->mu);
    if (!found) st_errf(err, "metrics: out of memory");
    return found;
}

void metrics_counter_add(metrics_series *s, double v) {
    if (!s || s->fam->type != METRICS_COUNTER || !(v >= 0)) return;
    pthread_mutex_lock(&s->fam->mu);
    s->value += v;
    pthread_mutex_unlock(&s->fam->mu);
}

void metrics_gauge_set(metrics_series *s, double v) {
    if (!s || s->fam->type != METRICS_GAUGE) return;
    pthread_mutex_lock(&s->fam->mu);
    s->value = v;
    pthread_mutex_unlock(&s->fam->mu);
}

void metrics_gauge_add(metrics_series *s, double v) {
    if (!s || s->fam->type != METRICS_GAUGE) return;
    pthread_mutex_lock(&s->fam->mu);
    s->value += v;
    pthread_mutex_unlock(&s->fam->mu);
}

void metrics_histogram_observe(metrics_series *s, double v) {
    if (!s || s->fam->type != METRICS_HISTOGRAM) return;
    metrics_family *f = s->fam;
    size_t b = 0;
    while (b < f->n_bounds && !(v <= f->bounds[b])) b++; /* NaN lands in +Inf */
    pthread_mutex_lock(&f->mu);
    s->buckets[b]++;
    s->count++;
    s->sum += v;
    pthread_mutex_unlock(&f->mu);
}

void metrics_histogram_merge(metrics_series *s, const uint64_t *counts, size_t n, double sum) {
    if (!s || s->fam->type != METRICS_HISTOGRAM || !counts) return;
    metrics_family *f = s->fam;
    if (n != f->n_bounds + 1) return;
    pthread_mutex_lock(&f->mu);
    for (size_t b = 0; b < n; b++) {
        s->buckets[b] += counts[b];
        s->count += counts[b];
    }
    s->sum += sum;
    pthread_mutex_unlock(&f->mu);
}

double metrics_value(metrics_series *s) {
    if (!s) return 0;
    pthread_mutex_lock(&s->fam->mu);
    double v = s->fam->type == METRICS_HISTOGRAM ? (double)s->count : s->value;
    pthread_mutex_unlock(&s->fam->mu);
    return v;
}

double metrics_histogram_sum(metrics_series *s) {
    if (!s || s->fam->type != METRICS_HISTOGRAM) return 0;
    pthread_mutex_lock(&s->fam->mu);
    double v = s->sum;
    pthread_mutex_unlock(&s->fam->mu);
    return v;
}

void metrics_family_reset(metrics_family *f) {
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->n_series; i++) series_free(f->series[i]);
    f->n_series = 0;
    if (f->n_labels == 0) series_new(f, NULL); /* keep exporting 0 */
    pthread_mutex_unlock(&f->mu);
}

/* ---- rendering ---------------------------------------------------------- */

/* Writes {a="x",b="y"[,le="..."]} (nothing when there are no labels at all). */
static void sb_labels(st_strbuf *b, const metrics_family *f, const metrics_series *s,
                      const char *le) {
    if (f->n_labels == 0 && !le) return;
    st_strbuf_puts(b, "{");
    for (size_t i = 0; i < f->n_labels; i++) {
        if (i) st_strbuf_puts(b, ",");
        st_strbuf_puts(b, f->labels[i]);
        st_strbuf_puts(b, "=\"");
        sb_escaped(b, s->values[i], true);
        st_strbuf_puts(b, "\"");
    }
    if (le) {
        if (f->n_labels) st_strbuf_puts(b, ",");
        st_strbuf_puts(b, "le=\"");
        st_strbuf_puts(b, le);
        st_strbuf_puts(b, "\"");
    }
    st_strbuf_puts(b, "}");
}

static void render_family(st_strbuf *b, metrics_family *f) {
    static const char *type_names[] = {"counter", "gauge", "histogram"};
    st_strbuf_puts(b, "# HELP ");
    st_strbuf_puts(b, f->name);
    st_strbuf_puts(b, " ");
    sb_escaped(b, f->help, false);
    st_strbuf_puts(b, "\n# TYPE ");
    st_strbuf_puts(b, f->name);
    st_strbuf_puts(b, " ");
    st_strbuf_puts(b, type_names[f->type]);
    st_strbuf_puts(b, "\n");
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->n_series; i++) {
        metrics_series *s = f->series[i];
        if (f->type != METRICS_HISTOGRAM) {
            st_strbuf_puts(b, f->name);
            sb_labels(b, f, s, NULL);
            st_strbuf_puts(b, " ");
            sb_double(b, s->value);
            st_strbuf_puts(b, "\n");
            continue;
        }
        uint64_t cum = 0;
        for (size_t k = 0; k <= f->n_bounds; k++) {
            char le[40];
            if (k < f->n_bounds) metrics_format_double(le, sizeof le, f->bounds[k]);
            else snprintf(le, sizeof le, "+Inf");
            cum += s->buckets[k];
            st_strbuf_puts(b, f->name);
            st_strbuf_puts(b, "_bucket");
            sb_labels(b, f, s, le);
            st_strbuf_puts(b, " ");
            sb_u64(b, cum);
            st_strbuf_puts(b, "\n");
        }
        st_strbuf_puts(b, f->name);
        st_strbuf_puts(b, "_sum");
        sb_labels(b, f, s, NULL);
        st_strbuf_puts(b, " ");
        sb_double(b, s->sum);
        st_strbuf_puts(b, "\n");
        st_strbuf_puts(b, f->name);
        st_strbuf_puts(b, "_count");
        sb_labels(b, f, s, NULL);
        st_strbuf_puts(b, " ");
        sb_u64(b, s->count);
        st_strbuf_puts(b, "\n");
    }
    pthread_mutex_unlock(&f->mu);
}

char *metrics_render(metrics_registry *r, size_t *len_out, st_err *err) {
    if (!r) {
        st_errf(err, "metrics: no registry");
        return NULL;
    }
    pthread_mutex_lock(&r->mu);
    metrics_collect_fn fn[METRICS_MAX_COLLECTORS];
    void *ud[METRICS_MAX_COLLECTORS];
    memcpy(fn, r->collect, sizeof fn);
    memcpy(ud, r->collect_ud, sizeof ud);
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < METRICS_MAX_COLLECTORS; i++)
        if (fn[i]) fn[i](r, ud[i]);

    st_strbuf b = {0};
    st_strbuf_puts(&b, "");
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n_fams; i++) render_family(&b, r->fams[i]);
    pthread_mutex_unlock(&r->mu);
    if (b.oom) {
        free(b.p);
        st_errf(err, "metrics: out of memory while rendering");
        return NULL;
    }
    if (len_out) *len_out = b.len;
    return b.p;
}

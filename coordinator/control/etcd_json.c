/* etcd_json.c — etcd v3 JSON gateway messages (etcd_json.h). */
#include "coordinator/control/etcd_json.h"

#include <inttypes.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *etcd_b64(const void *data, size_t len) {
    if (len > (1u << 28)) return NULL;
    char *out = malloc(4 * ((len + 2) / 3) + 1);
    if (!out) return NULL;
    int n = EVP_EncodeBlock((unsigned char *)out, data, (int)len);
    out[n < 0 ? 0 : n] = 0;
    return out;
}

char *etcd_unb64(const char *text, size_t *len) {
    size_t tl = strlen(text);
    if (tl % 4 || tl > (1u << 28)) return NULL;
    unsigned char *out = malloc(tl / 4 * 3 + 1);
    if (!out) return NULL;
    int n = tl ? EVP_DecodeBlock(out, (const unsigned char *)text, (int)tl) : 0;
    if (n < 0) {
        free(out);
        return NULL;
    }
    /* EVP_DecodeBlock counts the padding's zero bytes */
    if (tl && text[tl - 1] == '=') n--;
    if (tl > 1 && text[tl - 2] == '=') n--;
    out[n] = 0;
    *len = (size_t)n;
    return (char *)out;
}

void etcd_kvs_free(etcd_kvs *k) {
    if (!k) return;
    for (size_t i = 0; i < k->n; i++) {
        free(k->kv[i].key);
        free(k->kv[i].value);
    }
    free(k->kv);
    memset(k, 0, sizeof *k);
}

/* ---------------------------------------------------------------- requests */

static json_t *b64_str(const void *data, size_t len) {
    char *b = etcd_b64(data, len);
    json_t *s = b ? json_string(b) : NULL;
    free(b);
    return s;
}

static json_t *i64_str(int64_t v) {
    char b[24];
    snprintf(b, sizeof b, "%" PRId64, v);
    return json_string(b);
}

static char *dump(json_t *o) {
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return t;
}

/* {"key":..., "range_end":...} of a key or a prefix */
static json_t *key_range(const char *key, bool prefix) {
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "key", b64_str(key, strlen(key)))) goto fail;
    if (prefix) {
        size_t n = strlen(key);
        char end[ETCD_KEY_MAX + 1];
        if (n == 0 || n > ETCD_KEY_MAX) goto fail;
        memcpy(end, key, n);
        /* the smallest key after every key with this prefix: the last byte
         * below 0xff incremented, the rest cut */
        size_t m = n;
        while (m > 0 && (unsigned char)end[m - 1] == 0xff) m--;
        if (m == 0) {
            end[0] = 0, m = 1; /* "\0": every key >= key */
        } else {
            end[m - 1] = (char)((unsigned char)end[m - 1] + 1);
        }
        if (json_object_set_new(o, "range_end", b64_str(end, m))) goto fail;
    }
    return o;
fail:
    json_decref(o);
    return NULL;
}

char *etcd_req_range(const char *key, bool prefix) { return dump(key_range(key, prefix)); }
char *etcd_req_deleterange(const char *key, bool prefix) { return dump(key_range(key, prefix)); }

static json_t *op_json(const etcd_op *op) {
    if (!op->value) {
        json_t *r = key_range(op->key, false);
        return r ? json_pack("{s:o}", "request_delete_range", r) : NULL;
    }
    json_t *p = json_pack("{s:o,s:o}", "key", b64_str(op->key, strlen(op->key)), "value",
                          b64_str(op->value, op->value_len));
    if (p && op->lease && json_object_set_new(p, "lease", i64_str(op->lease))) {
        json_decref(p);
        return NULL;
    }
    return p ? json_pack("{s:o}", "request_put", p) : NULL;
}

static json_t *cmp_json(const etcd_cmp *c) {
    json_t *o = json_pack("{s:o,s:s}", "key", b64_str(c->key, strlen(c->key)), "result", "EQUAL");
    if (!o) return NULL;
    int bad = 0;
    switch (c->target) {
    case ETCD_CMP_CREATE:
        bad = json_object_set_new(o, "target", json_string("CREATE")) ||
              json_object_set_new(o, "create_revision", i64_str(c->num));
        break;
    case ETCD_CMP_LEASE:
        bad = json_object_set_new(o, "target", json_string("LEASE")) ||
              json_object_set_new(o, "lease", i64_str(c->num));
        break;
    case ETCD_CMP_VALUE:
        bad = !c->value || json_object_set_new(o, "target", json_string("VALUE")) ||
              json_object_set_new(o, "value", b64_str(c->value, strlen(c->value)));
        break;
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *etcd_req_txn(const etcd_cmp *cmp, size_t n_cmp, const etcd_op *then, size_t n_then,
                   const etcd_op *otherwise, size_t n_otherwise) {
    json_t *c = json_array(), *t = json_array(), *f = json_array();
    json_t *o = c && t && f ? json_pack("{s:o,s:o,s:o}", "compare", c, "success", t, "failure", f) : NULL;
    if (!o) {
        json_decref(c), json_decref(t), json_decref(f);
        return NULL;
    }
    for (size_t i = 0; i < n_cmp; i++)
        if (json_array_append_new(c, cmp_json(&cmp[i]))) goto fail;
    for (size_t i = 0; i < n_then; i++)
        if (json_array_append_new(t, op_json(&then[i]))) goto fail;
    for (size_t i = 0; i < n_otherwise; i++)
        if (json_array_append_new(f, op_json(&otherwise[i]))) goto fail;
    return dump(o);
fail:
    json_decref(o);
    return NULL;
}

char *etcd_req_lease_grant(int64_t ttl_s) { return dump(json_pack("{s:o}", "TTL", i64_str(ttl_s))); }
char *etcd_req_lease_id(int64_t id) { return dump(json_pack("{s:o}", "ID", i64_str(id))); }

char *etcd_req_watch(const char *key, int64_t start_rev) {
    json_t *r = key_range(key, false);
    if (r && start_rev > 0 && json_object_set_new(r, "start_revision", i64_str(start_rev))) {
        json_decref(r);
        return NULL;
    }
    return r ? dump(json_pack("{s:o}", "create_request", r)) : NULL;
}

/* ---------------------------------------------------------------- responses */

static json_t *load(const char *body, size_t len, st_err *err) {
    json_error_t je;
    json_t *o = json_loadb(body, len, 0, &je);
    if (!o) return st_errf(err, "etcd: answer is not JSON (%s): %.80s", je.text, len ? body : ""), NULL;
    if (!json_is_object(o)) {
        json_decref(o);
        return st_errf(err, "etcd: answer is not a JSON object: %.80s", body), NULL;
    }
    return o;
}

/* An int64 field: a string of digits, a number, or missing (0). -1 + err otherwise. */
static int i64_field(json_t *o, const char *name, const char *where, int64_t *v, st_err *err) {
    json_t *f = json_object_get(o, name);
    *v = 0;
    if (!f) return 0;
    if (json_is_integer(f)) return *v = json_integer_value(f), 0;
    if (json_is_string(f)) {
        const char *s = json_string_value(f);
        char *end;
        long long x = strtoll(s, &end, 10);
        if (*s && !*end) return *v = x, 0;
    }
    return st_errf(err, "etcd: %s%s: not an integer", where, name);
}

static int error_obj(json_t *o, st_err *err) {
    json_t *e = json_object_get(o, "error");
    if (!e) return 0;
    const char *msg = NULL;
    json_int_t code = 0;
    if (json_is_object(e)) { /* a stream's error */
        msg = json_string_value(json_object_get(e, "message"));
        code = json_integer_value(json_object_get(e, "grpc_code"));
    } else {
        msg = json_string_value(json_object_get(o, "message"));
        if (!msg) msg = json_string_value(e);
        code = json_integer_value(json_object_get(o, "code"));
    }
    st_errf(err, "etcd: %s (code %lld)", msg ? msg : "error without a message", (long long)code);
    return 1;
}

int etcd_parse_error(const char *body, size_t len, st_err *err) {
    json_error_t je;
    json_t *o = json_loadb(body, len, 0, &je);
    int rc = json_is_object(o) ? error_obj(o, err) : 0;
    json_decref(o);
    return rc;
}

static int header_rev(json_t *o, int64_t *rev, st_err *err) {
    json_t *h = json_object_get(o, "header");
    if (!json_is_object(h)) return st_errf(err, "etcd: answer without a header");
    return i64_field(h, "revision", "header.", rev, err);
}

static int kvs_from(json_t *arr, etcd_kvs *out, st_err *err) {
    if (!arr) return 0;
    if (!json_is_array(arr)) return st_errf(err, "etcd: kvs: not an array");
    size_t n = json_array_size(arr);
    if (n == 0) return 0;
    etcd_kv *kv = calloc(n, sizeof *kv);
    if (!kv) return st_errf(err, "etcd: out of memory");
    out->kv = kv;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(arr, i);
        char where[32];
        snprintf(where, sizeof where, "kvs[%zu].", i);
        const char *k = json_string_value(json_object_get(e, "key"));
        const char *v = json_string_value(json_object_get(e, "value"));
        size_t kl = 0;
        if (!json_is_object(e) || !k) return st_errf(err, "etcd: %skey: missing", where);
        if (!(kv[i].key = etcd_unb64(k, &kl)) || strlen(kv[i].key) != kl)
            return out->n = i + 1, st_errf(err, "etcd: %skey: not base64 of a text key", where);
        out->n = i + 1;
        if (!(kv[i].value = etcd_unb64(v ? v : "", &kv[i].value_len)))
            return st_errf(err, "etcd: %svalue: not base64", where);
        if (i64_field(e, "create_revision", where, &kv[i].create_rev, err) ||
            i64_field(e, "mod_revision", where, &kv[i].mod_rev, err) || i64_field(e, "lease", where, &kv[i].lease, err))
            return -1;
    }
    return 0;
}

int etcd_parse_range(const char *body, size_t len, etcd_kvs *out, st_err *err) {
    memset(out, 0, sizeof *out);
    json_t *o = load(body, len, err);
    if (!o) return -1;
    int rc = error_obj(o, err) ? -1 : header_rev(o, &out->revision, err);
    if (rc == 0) rc = kvs_from(json_object_get(o, "kvs"), out, err);
    json_decref(o);
    if (rc) etcd_kvs_free(out);
    return rc ? -1 : 0;
}

int etcd_parse_txn(const char *body, size_t len, bool *succeeded, int64_t *revision, etcd_kvs *out, st_err *err) {
    if (out) memset(out, 0, sizeof *out);
    *succeeded = false;
    json_t *o = load(body, len, err);
    if (!o) return -1;
    int rc = error_obj(o, err) ? -1 : header_rev(o, revision, err);
    json_t *s = json_object_get(o, "succeeded");
    if (rc == 0 && s && !json_is_boolean(s)) rc = st_errf(err, "etcd: succeeded: not a boolean");
    if (rc == 0) *succeeded = json_is_true(s);
    json_t *resp = json_object_get(o, "responses");
    if (rc == 0 && resp && !json_is_array(resp)) rc = st_errf(err, "etcd: responses: not an array");
    size_t i;
    json_t *r;
    if (rc == 0 && out && resp)
        json_array_foreach(resp, i, r) {
            json_t *rr = json_object_get(r, "response_range");
            if (rr && !out->kv) {
                rc = kvs_from(json_object_get(rr, "kvs"), out, err);
                break;
            }
        }
    json_decref(o);
    if (rc && out) etcd_kvs_free(out);
    return rc ? -1 : 0;
}

int etcd_parse_lease(const char *body, size_t len, int64_t *id, int64_t *ttl, st_err *err) {
    *id = *ttl = 0;
    json_t *o = load(body, len, err);
    if (!o) return -1;
    json_t *r = json_object_get(o, "result");
    json_t *m = r ? r : o;
    int rc = error_obj(o, err) ? -1 : 0;
    if (rc == 0 && !json_is_object(m)) rc = st_errf(err, "etcd: result: not an object");
    if (rc == 0 && m == r && error_obj(r, err)) rc = -1;
    if (rc == 0) rc = i64_field(m, "ID", "", id, err);
    if (rc == 0) rc = i64_field(m, "TTL", "", ttl, err);
    if (rc == 0 && !json_object_get(m, "header")) rc = st_errf(err, "etcd: lease answer without a header");
    if (rc == 0 && r == NULL && *id == 0) rc = st_errf(err, "etcd: lease grant answered without an ID");
    json_decref(o);
    return rc;
}

int etcd_parse_header(const char *body, size_t len, int64_t *revision, st_err *err) {
    json_t *o = load(body, len, err);
    if (!o) return -1;
    int rc = error_obj(o, err) ? -1 : header_rev(o, revision, err);
    json_decref(o);
    return rc;
}

int etcd_parse_watch(const char *body, size_t len, etcd_watch_msg *m, st_err *err) {
    memset(m, 0, sizeof *m);
    json_t *o = load(body, len, err);
    if (!o) return -1;
    json_t *r = json_object_get(o, "result");
    int rc = error_obj(o, err) ? -1 : 0;
    if (rc == 0 && !json_is_object(r)) rc = st_errf(err, "etcd: watch message without a result");
    if (rc == 0) rc = header_rev(r, &m->revision, err);
    if (rc == 0) {
        m->created = json_is_true(json_object_get(r, "created"));
        m->canceled = json_is_true(json_object_get(r, "canceled"));
        if (m->canceled) {
            const char *why = json_string_value(json_object_get(r, "cancel_reason"));
            st_errf(err, "etcd: the watch was canceled: %s", why && *why ? why : "no reason given");
        }
        json_t *ev = json_object_get(r, "events");
        size_t i;
        json_t *e;
        if (ev && !json_is_array(ev)) rc = st_errf(err, "etcd: events: not an array");
        else
            json_array_foreach(ev, i, e) {
                const char *type = json_string_value(json_object_get(e, "type"));
                /* PUT is proto3's zero value: left out */
                if (!type || !strcmp(type, "PUT"))
                    m->put = true;
                else if (!strcmp(type, "DELETE"))
                    m->deleted = true;
                else {
                    rc = st_errf(err, "etcd: events[%zu].type: unknown \"%s\"", i, type);
                    break;
                }
            }
    }
    json_decref(o);
    return rc;
}

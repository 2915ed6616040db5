/* tokenizer.c — the tokenizer's public API (see tokenizer.h): loading the
 * vocabulary from GGUF, special tokens, splitting the text around special
 * tokens, dispatch to the SPM/BPE encoders, pieces, whole-sequence
 * detokenization and the streaming decoder.
 * Behaviour follows llama.cpp's src/llama-vocab.cpp (commit c392e50).
 */
#define _GNU_SOURCE /* memmem, qsort_r */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/utf8.h"
#include "model/tok_bpe.h"
#include "model/tok_spm.h"
#include "model/tok_util.h"
#include "model/tok_vocab.h"
#include "model/tokenizer.h"

/* ---- loading ---- */

static bool valid_id(const tok_vocab *v, int32_t id) { return id >= 0 && id < v->n; }

/* Reads an optional special-token id key into *id; out-of-range values (such
 * as 0xFFFFFFFF, "none") are ignored. -1 + err when the key has a bad type. */
static int load_special(const gguf_file *f, tok_vocab *v, const char *key, int32_t *id,
                        st_err *err) {
    if (!gguf_get(f, key)) return 0;
    int64_t x;
    if (gguf_get_i64(f, key, &x, err)) return -1;
    if (x < 0 || x >= v->n) {
        if (x != 0xFFFFFFFFll && x != -1) ST_WARN("tokenizer: %s = %lld is out of range, ignored", key, (long long)x);
        return 0;
    }
    *id = (int32_t)x;
    return 0;
}

/* An optional numeric array of n elements: float (f32/f64) when want_float,
 * else any integer type. *kv_out stays NULL when the key is absent. */
static int get_num_arr(const gguf_file *f, const char *key, bool want_float, uint64_t n,
                       const gguf_kv **kv_out, st_err *err) {
    const gguf_kv *kv = gguf_get(f, key);
    *kv_out = NULL;
    if (!kv) return 0;
    bool ok = kv->type == GGUF_TYPE_ARRAY;
    if (ok && want_float) {
        ok = kv->arr_type == GGUF_TYPE_FLOAT32 || kv->arr_type == GGUF_TYPE_FLOAT64;
    } else if (ok) {
        ok = kv->arr_type <= GGUF_TYPE_INT32 || kv->arr_type == GGUF_TYPE_UINT64 ||
             kv->arr_type == GGUF_TYPE_INT64;
    }
    if (!ok) return st_errf(err, "tokenizer: %s is not an array of %s", key, want_float ? "floats" : "integers");
    if (kv->arr_n != n)
        return st_errf(err, "tokenizer: %s has %llu entries for %llu tokens", key,
                       (unsigned long long)kv->arr_n, (unsigned long long)n);
    *kv_out = kv;
    return 0;
}

static int load_flag(const gguf_file *f, const char *key, bool *out, st_err *err) {
    if (!gguf_get(f, key)) return 0;
    return gguf_get_bool(f, key, out, err);
}

/* Decoded bytes of token id (tok_piece's definition) into out; returns the
 * length. out must hold 3 * text_len bytes. */
static size_t compute_piece(const tok_vocab *v, int32_t id, char *out) {
    const char *t = tok_text(v, id);
    size_t tl = v->text_len[id];
    switch (v->type[id]) {
    case TOK_TYPE_USER_DEFINED:
        memcpy(out, t, tl);
        return tl;
    case TOK_TYPE_NORMAL:
        break;
    case TOK_TYPE_BYTE:
        if (v->model == TOK_MODEL_SPM && tl == 6 && !memcmp(t, "<0x", 3) && t[5] == '>') {
            out[0] = (char)strtol((char[]){t[3], t[4], 0}, NULL, 16);
            return 1;
        }
        return 0;
    default: /* control, unknown, unused, undefined: nothing (llama.cpp, special = false) */
        return 0;
    }
    size_t o = 0;
    if (v->model == TOK_MODEL_SPM) { /* "▁" → ' ' */
        for (size_t i = 0; i < tl;) {
            if (i + 3 <= tl && !memcmp(t + i, "\xE2\x96\x81", 3)) {
                out[o++] = ' ';
                i += 3;
            } else {
                out[o++] = t[i++];
            }
        }
        return o;
    }
    /* BPE: reverse the byte-unicode mapping; characters outside the alphabet
     * are copied unchanged. */
    for (size_t i = 0; i < tl;) {
        uint32_t cp;
        int r = utf8_decode((const uint8_t *)t + i, tl - i, &cp);
        if (r > 0 && cp < sizeof v->cp_byte / sizeof v->cp_byte[0] && v->cp_byte[cp] >= 0) {
            out[o++] = (char)v->cp_byte[cp];
            i += (size_t)r;
        } else {
            size_t n = r > 0 ? (size_t)r : 1;
            memcpy(out + o, t + i, n);
            o += n;
            i += n;
        }
    }
    return o;
}

static int cmp_special(const void *a, const void *b, void *ctx) {
    const tok_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (v->text_len[x] != v->text_len[y]) return v->text_len[x] > v->text_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static const char *const EOG_NAMES[] = {"<|eot_id|>",    "<|im_end|>", "<|end|>", "<end_of_turn>",
                                        "<|endoftext|>", "<|eom_id|>", "<EOT>"};

tok_vocab *tok_vocab_load(const gguf_file *f, st_err *err) {
    char *model = NULL, *pre = NULL;
    tok_vocab *v = calloc(1, sizeof *v);
    if (!v) {
        st_errf(err, "tokenizer: out of memory");
        return NULL;
    }
    if (gguf_get_str(f, "tokenizer.ggml.model", &model, err)) goto fail;
    if (!strcmp(model, "llama")) {
        v->model = TOK_MODEL_SPM;
    } else if (!strcmp(model, "gpt2")) {
        v->model = TOK_MODEL_BPE;
    } else {
        st_errf(err, "tokenizer: unsupported tokenizer model '%s' (supported: llama, gpt2)", model);
        goto fail;
    }

    const gguf_kv *toks, *scores = NULL, *types = NULL;
    if (gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, err)) goto fail;
    if (toks->arr_n == 0 || toks->arr_n > INT32_MAX / 4) {
        st_errf(err, "tokenizer: tokenizer.ggml.tokens has %llu entries",
                (unsigned long long)toks->arr_n);
        goto fail;
    }
    v->n = (int32_t)toks->arr_n;
    if (get_num_arr(f, "tokenizer.ggml.scores", true, toks->arr_n, &scores, err) ||
        get_num_arr(f, "tokenizer.ggml.token_type", false, toks->arr_n, &types, err))
        goto fail;

    /* token strings (an empty one becomes "[EMPTY_<id>]", as in llama.cpp) */
    size_t n = (size_t)v->n, total = 0;
    for (size_t i = 0; i < n; i++) total += (toks->arr_str[i].len ? toks->arr_str[i].len : 32) + 1;
    v->text_blob = malloc(total);
    v->text_off = malloc(n * sizeof *v->text_off);
    v->text_len = malloc(n * sizeof *v->text_len);
    v->score = malloc(n * sizeof *v->score);
    v->type = malloc(n);
    v->eog = calloc(n, 1);
    v->piece_off = malloc((n + 1) * sizeof *v->piece_off);
    if (!v->text_blob || !v->text_off || !v->text_len || !v->score || !v->type || !v->eog ||
        !v->piece_off || tok_map_init(&v->tokens, n))
        goto oom;
    size_t off = 0, max_text = 0;
    for (size_t i = 0; i < n; i++) {
        const gguf_str *s = &toks->arr_str[i];
        char *dst = v->text_blob + off;
        size_t len;
        if (s->len == 0 || s->len > UINT32_MAX / 4) {
            len = (size_t)snprintf(dst, 32, "[EMPTY_%zu]", i);
        } else {
            memcpy(dst, s->data, s->len);
            len = s->len;
            dst[len] = 0;
        }
        v->text_off[i] = off;
        v->text_len[i] = (uint32_t)len;
        off += len + 1;
        if (len > max_text) max_text = len;
        v->score[i] = scores ? (float)gguf_arr_f64(scores, i) : 0.0f;
        int64_t t = types ? gguf_arr_i64(types, i) : TOK_TYPE_NORMAL;
        v->type[i] = (uint8_t)(t >= TOK_TYPE_NORMAL && t <= TOK_TYPE_BYTE ? t : TOK_TYPE_UNDEFINED);
        if (tok_map_put(&v->tokens, dst, len, (int32_t)i, true)) goto oom;
    }

    /* special ids and flags */
    v->bos = v->eos = v->eot = v->eom = v->unk = v->pad = -1;
    if (v->model == TOK_MODEL_SPM) {
        v->bos = 1 < v->n ? 1 : -1;
        v->eos = 2 < v->n ? 2 : -1;
        v->unk = 0;
        v->add_bos = true;
        v->add_space_prefix = true;
    }
    if (load_special(f, v, "tokenizer.ggml.bos_token_id", &v->bos, err) ||
        load_special(f, v, "tokenizer.ggml.eos_token_id", &v->eos, err) ||
        load_special(f, v, "tokenizer.ggml.eot_token_id", &v->eot, err) ||
        load_special(f, v, "tokenizer.ggml.eom_token_id", &v->eom, err) ||
        load_special(f, v, "tokenizer.ggml.unknown_token_id", &v->unk, err) ||
        load_special(f, v, "tokenizer.ggml.padding_token_id", &v->pad, err))
        goto fail;

    if (v->model == TOK_MODEL_BPE) {
        if (gguf_get(f, "tokenizer.ggml.pre") && gguf_get_str(f, "tokenizer.ggml.pre", &pre, err))
            goto fail;
        if (tok_bpe_init(v, f, pre, err)) goto fail;
        v->clean_spaces = true; /* llama.cpp's default for BPE (only some pre-tokenizers clear it) */
        if (v->pre == TOK_PRE_LLAMA3) v->add_bos = true;
    }
    if (load_flag(f, "tokenizer.ggml.add_bos_token", &v->add_bos, err) ||
        load_flag(f, "tokenizer.ggml.add_eos_token", &v->add_eos, err) ||
        load_flag(f, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix, err))
        goto fail;
    if (v->add_bos && v->bos < 0) ST_WARN("tokenizer: add_bos_token set but no BOS token");

    /* SPM byte fallback: "<0xAB>", else the 1-byte string */
    for (int b = 0; b < 256; b++) {
        char hex[7];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = tok_map_get(&v->tokens, hex, 6);
        if (id < 0) id = tok_map_get(&v->tokens, (char[]){(char)b}, 1);
        v->byte_token[b] = id;
    }

    /* end of generation */
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < sizeof EOG_NAMES / sizeof EOG_NAMES[0]; k++) {
            if (!strcmp(tok_text(v, (int32_t)i), EOG_NAMES[k])) {
                v->eog[i] = 1;
                v->type[i] = TOK_TYPE_CONTROL; /* llama.cpp overrides the type too */
            }
        }
    }
    if (v->eos >= 0) v->eog[v->eos] = 1;
    if (v->eot >= 0) v->eog[v->eot] = 1;
    if (v->eom >= 0) v->eog[v->eom] = 1;

    /* special tokens, longest first (ties by id) */
    size_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int t = v->type[i];
        ns += t == TOK_TYPE_CONTROL || t == TOK_TYPE_USER_DEFINED || t == TOK_TYPE_UNKNOWN;
    }
    v->special = malloc((ns ? ns : 1) * sizeof *v->special);
    if (!v->special) goto oom;
    for (size_t i = 0; i < n; i++) {
        int t = v->type[i];
        if (t == TOK_TYPE_CONTROL || t == TOK_TYPE_USER_DEFINED || t == TOK_TYPE_UNKNOWN)
            v->special[v->n_special++] = (int32_t)i;
    }
    qsort_r(v->special, v->n_special, sizeof *v->special, cmp_special, v);

    /* pieces */
    v->piece_blob = malloc(total + 1); /* a piece is never longer than its text */
    if (!v->piece_blob) goto oom;
    size_t po = 0;
    for (size_t i = 0; i < n; i++) {
        v->piece_off[i] = po;
        size_t pl = compute_piece(v, (int32_t)i, v->piece_blob + po);
        if (pl > v->max_piece_len) v->max_piece_len = pl;
        po += pl;
    }
    v->piece_off[n] = po;
    (void)max_text;

    free(model);
    free(pre);
    return v;
oom:
    st_errf(err, "tokenizer: out of memory");
fail:
    free(model);
    free(pre);
    tok_vocab_free(v);
    return NULL;
}

void tok_vocab_free(tok_vocab *v) {
    if (!v) return;
    if (v->model == TOK_MODEL_BPE) tok_bpe_free(v);
    tok_map_free(&v->tokens);
    free(v->text_blob);
    free(v->text_off);
    free(v->text_len);
    free(v->score);
    free(v->type);
    free(v->eog);
    free(v->piece_blob);
    free(v->piece_off);
    free(v->special);
    free(v);
}

/* ---- accessors ---- */

enum tok_model tok_model_kind(const tok_vocab *v) { return (enum tok_model)v->model; }
int32_t tok_n_vocab(const tok_vocab *v) { return v->n; }
int32_t tok_bos(const tok_vocab *v) { return v->bos; }
int32_t tok_eos(const tok_vocab *v) { return v->eos; }
int32_t tok_unk(const tok_vocab *v) { return v->unk; }
int32_t tok_pad(const tok_vocab *v) { return v->pad; }
bool tok_add_bos(const tok_vocab *v) { return v->add_bos; }
bool tok_add_eos(const tok_vocab *v) { return v->add_eos; }
bool tok_add_space_prefix(const tok_vocab *v) { return v->add_space_prefix; }
bool tok_is_eog(const tok_vocab *v, int32_t id) { return valid_id(v, id) && v->eog[id]; }
int tok_token_type(const tok_vocab *v, int32_t id) {
    return valid_id(v, id) ? v->type[id] : TOK_TYPE_UNDEFINED;
}
float tok_token_score(const tok_vocab *v, int32_t id) { return valid_id(v, id) ? v->score[id] : 0.0f; }
const char *tok_token_text(const tok_vocab *v, int32_t id, size_t *len_out) {
    if (!valid_id(v, id)) return NULL;
    if (len_out) *len_out = v->text_len[id];
    return tok_text(v, id);
}
int32_t tok_lookup(const tok_vocab *v, const char *text, size_t len) {
    return tok_map_get(&v->tokens, text, len);
}
size_t tok_max_piece_len(const tok_vocab *v) { return v->max_piece_len; }

/* ---- encoding ---- */

/* A fragment of the input: raw text [off, off + len) or a special token. */
typedef struct frag {
    int32_t id; /* -1: raw text */
    size_t off, len;
} frag;

typedef struct frags {
    frag *v;
    size_t n, cap;
} frags;

static int frags_insert(frags *fs, size_t at, frag f) {
    if (fs->n == fs->cap) {
        size_t nc = fs->cap ? fs->cap * 2 : 16;
        frag *nv = realloc(fs->v, nc * sizeof *nv);
        if (!nv) return -1;
        fs->v = nv;
        fs->cap = nc;
    }
    memmove(fs->v + at + 1, fs->v + at, (fs->n - at) * sizeof *fs->v);
    fs->v[at] = f;
    fs->n++;
    return 0;
}

/* True when [at, at + n) overlaps one of the plain spans. */
static bool overlaps_plain(size_t at, size_t n, const tok_span *plain, size_t n_plain) {
    for (size_t i = 0; i < n_plain; i++)
        if (at < plain[i].off + plain[i].len && plain[i].off < at + n) return true;
    return false;
}

/* llama.cpp's tokenizer_st_partition: for each special token, longest first,
 * split every raw fragment around its occurrences. Control and unknown
 * tokens take part only with parse_special, and then not where they overlap
 * a plain span (tok_encode_guarded). */
static int partition(const tok_vocab *v, const char *text, size_t len, bool parse_special,
                     const tok_span *plain, size_t n_plain, frags *fs) {
    fs->n = 0;
    if (len == 0) return 0;
    if (frags_insert(fs, 0, (frag){-1, 0, len})) return -1;
    for (size_t s = 0; s < v->n_special; s++) {
        int32_t id = v->special[s];
        bool user = v->type[id] == TOK_TYPE_USER_DEFINED;
        if (!parse_special && !user) continue;
        const char *st = tok_text(v, id);
        size_t sl = v->text_len[id];
        if (sl == 0) continue;
        for (size_t i = 0; i < fs->n; i++) {
            if (fs->v[i].id >= 0 || fs->v[i].len < sl) continue;
            frag f = fs->v[i];
            /* the first occurrence that is allowed here */
            const char *hit = NULL;
            for (size_t from = f.off; from + sl <= f.off + f.len;) {
                const char *h = memmem(text + from, f.off + f.len - from, st, sl);
                if (!h) break;
                size_t at = (size_t)(h - text);
                if (user || !overlaps_plain(at, sl, plain, n_plain)) {
                    hit = h;
                    break;
                }
                from = at + 1;
            }
            if (!hit) continue;
            size_t at = (size_t)(hit - text);
            /* replace f by [left] token [right]; the loop then visits right */
            size_t left = at - f.off, right = f.off + f.len - (at + sl);
            size_t k = i;
            if (left > 0) {
                fs->v[k] = (frag){-1, f.off, left};
                if (frags_insert(fs, ++k, (frag){id, 0, 0})) return -1;
            } else {
                fs->v[k] = (frag){id, 0, 0};
            }
            if (right > 0 && frags_insert(fs, k + 1, (frag){-1, at + sl, right})) return -1;
            i = k; /* next iteration looks at the right remainder */
        }
    }
    return 0;
}

static int encode_impl(const tok_vocab *v, const char *text, size_t len, bool add_special,
                       bool parse_special, const tok_span *plain, size_t n_plain,
                       int32_t **ids_out, size_t *n_out, st_err *err);

int tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_special,
               bool parse_special, int32_t **ids_out, size_t *n_out, st_err *err) {
    return encode_impl(v, text, len, add_special, parse_special, NULL, 0, ids_out, n_out, err);
}

int tok_encode_guarded(const tok_vocab *v, const char *text, size_t len, bool add_special,
                       const tok_span *plain, size_t n_plain, int32_t **ids_out, size_t *n_out,
                       st_err *err) {
    return encode_impl(v, text, len, add_special, true, plain, n_plain, ids_out, n_out, err);
}

static int encode_impl(const tok_vocab *v, const char *text, size_t len, bool add_special,
                       bool parse_special, const tok_span *plain, size_t n_plain,
                       int32_t **ids_out, size_t *n_out, st_err *err) {
    *ids_out = NULL;
    *n_out = 0;
    if (!text && len) return st_errf(err, "tokenizer: NULL text");
    tok_ids out = {0};
    frags fs = {0};
    if (partition(v, text, len, parse_special, plain, n_plain, &fs)) goto oom;

    if (add_special && v->add_bos) {
        if (v->bos < 0) {
            st_errf(err, "tokenizer: the vocabulary asks for BOS but has none");
            goto fail;
        }
        if (tok_ids_push(&out, v->bos)) goto oom;
    }
    bool prev_special = true; /* SPM: a space prefix at the start and after special tokens */
    for (size_t i = 0; i < fs.n; i++) {
        const frag *f = &fs.v[i];
        if (f->id >= 0) {
            if (tok_ids_push(&out, f->id)) goto oom;
            prev_special = true;
            continue;
        }
        int rc = v->model == TOK_MODEL_SPM
                     ? tok_spm_encode(v, text + f->off, f->len, v->add_space_prefix && prev_special,
                                      &out, err)
                     : tok_bpe_encode(v, text + f->off, f->len, &out, err);
        if (rc) goto fail;
        prev_special = false;
    }
    if (add_special && v->add_eos) {
        if (v->eos < 0) {
            st_errf(err, "tokenizer: the vocabulary asks for EOS but has none");
            goto fail;
        }
        if (tok_ids_push(&out, v->eos)) goto oom;
    }
    if (!out.v && !(out.v = malloc(sizeof *out.v))) goto oom;
    free(fs.v);
    *ids_out = out.v;
    *n_out = out.n;
    return 0;
oom:
    st_errf(err, "tokenizer: out of memory");
fail:
    free(fs.v);
    free(out.v);
    return -1;
}

/* ---- decoding ---- */

int tok_piece(const tok_vocab *v, int32_t id, char *buf, size_t cap) {
    if (!valid_id(v, id)) return -1;
    size_t n = v->piece_off[id + 1] - v->piece_off[id];
    if (n <= cap && n) memcpy(buf, v->piece_blob + v->piece_off[id], n);
    return (int)n;
}

/* llama_detokenize's clean_spaces passes (BPE vocabularies): drop the space
 * in " ?", " !", " .", " ,", " 's", " 'm", " 're", " 've", and around a lone
 * " ' ". Returns the new length. */
static size_t clean_spaces(char *t, size_t n) {
    size_t total = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char x = t[i];
        if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) total--;
        t[total++] = x;
    }
    n = total;
    total = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char x = t[i];
        if (x == '\'' && i + 1 < n && t[i - 1] == ' ' && t[i + 1] == ' ') {
            total--;
            t[++i] = 0;
        }
        t[total++] = x;
    }
    n = total;
    total = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char x = t[i];
        if (t[i - 1] == ' ' && x == '\'' && i + 1 < n) {
            char x1 = t[i + 1];
            if (x1 == 's' || x1 == 'm') {
                total--;
            } else if (i + 2 < n) {
                char x2 = t[i + 2];
                if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) total--;
            }
        }
        t[total++] = x;
    }
    return total;
}

int tok_detokenize(const tok_vocab *v, const int32_t *ids, size_t n, bool remove_special,
                   char **text_out, size_t *len_out, st_err *err) {
    *text_out = NULL;
    if (len_out) *len_out = 0;
    bool remove_space = v->add_space_prefix;
    if (remove_special && v->add_bos && n > 0 && ids[0] == v->bos) {
        remove_space = false;
        ids++;
        n--;
    }
    if (remove_special && v->add_eos && n > 0 && ids[n - 1] == v->eos) n--;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!valid_id(v, ids[i]))
            return st_errf(err, "tokenizer: token id %d out of range [0, %d)", ids[i], v->n);
        total += v->piece_off[ids[i] + 1] - v->piece_off[ids[i]];
    }
    char *s = malloc(total + 1);
    if (!s) return st_errf(err, "tokenizer: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = v->piece_blob + v->piece_off[ids[i]];
        size_t pl = v->piece_off[ids[i] + 1] - v->piece_off[ids[i]];
        if (remove_space && pl && p[0] == ' ') {
            p++;
            pl--;
        }
        remove_space = false;
        memcpy(s + o, p, pl);
        o += pl;
    }
    if (v->clean_spaces) o = clean_spaces(s, o);
    s[o] = 0;
    *text_out = s;
    if (len_out) *len_out = o;
    return 0;
}

/* ---- streaming decoder ---- */

struct tok_stream {
    const tok_vocab *v;
    bool strip_next;
    utf8_stream u; /* the character boundary and U+FFFD (common/utf8.h) */
    size_t max_out;
};

tok_stream *tok_stream_new(const tok_vocab *v, bool strip_first_space) {
    tok_stream *ts = calloc(1, sizeof *ts);
    if (!ts) return NULL;
    ts->v = v;
    ts->strip_next = strip_first_space;
    /* a piece, or a flush plus one U+FFFD for a bad id */
    ts->max_out = UTF8_STREAM_MAX_OUT(v->max_piece_len + 1);
    return ts;
}

void tok_stream_free(tok_stream *ts) { free(ts); }

size_t tok_stream_max_out(const tok_stream *ts) { return ts->max_out; }

int tok_stream_push(tok_stream *ts, int32_t id, char *out, size_t cap) {
    if (cap < ts->max_out) return -1;
    const tok_vocab *v = ts->v;
    if (!valid_id(v, id)) { /* what was held, then one U+FFFD for the bad id */
        size_t o = utf8_stream_flush(&ts->u, out);
        memcpy(out + o, UTF8_REPLACEMENT, 3);
        ts->strip_next = false;
        return (int)(o + 3);
    }
    const char *p = v->piece_blob + v->piece_off[id];
    size_t pl = v->piece_off[id + 1] - v->piece_off[id];
    if (ts->strip_next && pl && p[0] == ' ') {
        p++;
        pl--;
    }
    ts->strip_next = false;
    return (int)utf8_stream_push(&ts->u, p, pl, out);
}

int tok_stream_flush(tok_stream *ts, char *out, size_t cap) {
    if (cap < ts->max_out) return -1;
    return (int)utf8_stream_flush(&ts->u, out);
}

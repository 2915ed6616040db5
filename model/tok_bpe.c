/* tok_bpe.c — byte-level BPE (GPT-2 style) encoding of one raw-text
 * fragment, following llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp,
 * commit c392e50):
 *   1. invalid UTF-8 bytes become U+FFFD (as llama.cpp's
 *      unicode_cpts_from_utf8 does), so the regex sees valid UTF-8;
 *   2. pre-tokenize into words with the pre-tokenizer regex (PCRE2, UTF +
 *      UCP); any text between matches is a word of its own;
 *   3. map each word's bytes to GPT-2's byte-unicode alphabet
 *      (bytes_to_unicode in openai/gpt-2 encoder.py);
 *   4. with ignore_merges (Llama 3) a word that is a token is emitted whole;
 *      otherwise split it into characters and merge the adjacent pair with
 *      the lowest merge rank (ties: leftmost) until none applies;
 *   5. emit each symbol's token; a symbol that is no token falls back to its
 *      single bytes that are tokens (others are dropped, as in llama.cpp).
 * Also owns the BPE setup at load: byte alphabet, merges, regex.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/utf8.h"
#include "model/tok_bpe.h"

/* GPT-2's pre-tokenizer (openai/gpt-2 encoder.py). */
static const char RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Llama 3's (tokenizer.json), with (?i:...) spelled out as llama.cpp does so
 * that Unicode case folding (e.g. U+017F ſ ~ s) cannot widen it. */
static const char RE_LLAMA3[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

int tok_bpe_init(tok_vocab *v, const gguf_file *f, const char *pre, st_err *err) {
    /* byte alphabet: printable bytes map to themselves, the rest to 256.. */
    int next = 256;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        v->byte_cp[b] = keep ? (uint32_t)b : (uint32_t)next++;
    }
    for (size_t i = 0; i < sizeof v->cp_byte / sizeof v->cp_byte[0]; i++) v->cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) v->cp_byte[v->byte_cp[b]] = (int16_t)b;

    /* pre-tokenizer */
    if (!pre || !strcmp(pre, "default") || !strcmp(pre, "gpt2") || !strcmp(pre, "gpt-2")) {
        v->pre = TOK_PRE_GPT2;
    } else if (!strcmp(pre, "llama3") || !strcmp(pre, "llama-v3") || !strcmp(pre, "llama-bpe")) {
        v->pre = TOK_PRE_LLAMA3;
        v->ignore_merges = true;
    } else {
        ST_WARN("tokenizer: unknown pre-tokenizer '%s', using GPT-2's regex", pre);
        v->pre = TOK_PRE_GPT2;
    }
    const char *pat = v->pre == TOK_PRE_LLAMA3 ? RE_LLAMA3 : RE_GPT2;
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return st_errf(err, "tokenizer: pre-tokenizer regex: %s at %zu", (char *)msg, (size_t)eo);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
    v->re = re;

    /* merges "left right" → rank; the first occurrence of a pair wins */
    const gguf_kv *kv;
    if (gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &kv, err)) return -1;
    size_t total = 0;
    for (uint64_t i = 0; i < kv->arr_n; i++) total += kv->arr_str[i].len + 1;
    v->merge_blob = malloc(total + 1);
    if (!v->merge_blob || tok_map_init(&v->merges, kv->arr_n))
        return st_errf(err, "tokenizer: out of memory");
    size_t off = 0;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        const gguf_str *s = &kv->arr_str[i];
        char *dst = v->merge_blob + off;
        memcpy(dst, s->data, s->len);
        dst[s->len] = 0;
        off += s->len + 1;
        /* llama.cpp splits at the first space after the first byte */
        const char *sp = s->len > 1 ? memchr(dst + 1, ' ', s->len - 1) : NULL;
        if (!sp) continue;
        if (tok_map_put(&v->merges, dst, s->len, (int32_t)i, false))
            return st_errf(err, "tokenizer: merge table full");
    }
    return 0;
}

void tok_bpe_free(tok_vocab *v) {
    if (v->re) pcre2_code_free((pcre2_code *)v->re);
    v->re = NULL;
    tok_map_free(&v->merges);
    free(v->merge_blob);
}

typedef struct bpe_sym {
    int prev, next;
    size_t off, n;
} bpe_sym;

typedef struct bpe_bigram {
    int left, right;
    int32_t rank;
    size_t ln, rn; /* symbol lengths when queued: the pair is stale when they changed */
} bpe_bigram;

/* llm_bigram_bpe's comparator: lowest rank on top, ties by the smaller left. */
static bool bpe_lower(const void *pa, const void *pb) {
    const bpe_bigram *l = pa, *r = pb;
    return l->rank > r->rank || (l->rank == r->rank && l->left > r->left);
}

typedef struct bpe_work {
    bpe_sym *syms;
    size_t cap;
    tok_heap q;
} bpe_work;

static int add_bigram(const tok_vocab *v, const char *w, bpe_work *k, int left, int right) {
    if (left == -1 || right == -1) return 0;
    const bpe_sym *l = &k->syms[left], *r = &k->syms[right];
    int32_t rank = tok_map_get_pair(&v->merges, w + l->off, l->n, ' ', w + r->off, r->n);
    if (rank < 0) return 0;
    bpe_bigram b = {left, right, rank, l->n, r->n};
    return tok_heap_push(&k->q, &b);
}

/* BPE of one byte-encoded word w[0..len). */
static int bpe_word(const tok_vocab *v, const char *w, size_t len, bpe_work *k, tok_ids *out) {
    if (v->ignore_merges) {
        int32_t id = tok_map_get(&v->tokens, w, len);
        if (id >= 0) return tok_ids_push(out, id);
    }
    if (len > k->cap) {
        bpe_sym *ns = realloc(k->syms, len * sizeof *ns);
        if (!ns) return -1;
        k->syms = ns;
        k->cap = len;
    }
    int n_sym = 0;
    for (size_t off = 0; off < len;) {
        size_t cl = tok_utf8_len((uint8_t)w[off]);
        if (cl > len - off) cl = len - off;
        k->syms[n_sym] = (bpe_sym){n_sym - 1, 0, off, cl};
        off += cl;
        k->syms[n_sym].next = off == len ? -1 : n_sym + 1;
        n_sym++;
    }
    k->q.n = 0;
    for (int i = 1; i < n_sym; i++)
        if (add_bigram(v, w, k, i - 1, i)) return -1;
    bpe_bigram b;
    while (tok_heap_pop(&k->q, &b)) {
        bpe_sym *l = &k->syms[b.left], *r = &k->syms[b.right];
        /* llama.cpp compares the pair's text; the left start never moves, so
         * the text is unchanged exactly when both lengths are. */
        if (l->n == 0 || r->n == 0 || l->n != b.ln || r->n != b.rn) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) k->syms[r->next].prev = b.left;
        if (add_bigram(v, w, k, l->prev, b.left)) return -1;
        if (add_bigram(v, w, k, b.left, l->next)) return -1;
    }
    for (int i = 0; i < n_sym; i++) {
        const bpe_sym *s = &k->syms[i];
        if (s->n == 0) continue;
        int32_t id = tok_map_get(&v->tokens, w + s->off, s->n);
        if (id >= 0) {
            if (tok_ids_push(out, id)) return -1;
            continue;
        }
        for (size_t j = 0; j < s->n; j++) {
            int32_t bid = tok_map_get(&v->tokens, w + s->off + j, 1);
            if (bid >= 0 && tok_ids_push(out, bid)) return -1;
        }
    }
    return 0;
}

/* Byte-encodes raw[0..n) into buf (capacity >= 2n) and runs BPE on it. */
static int encode_word(const tok_vocab *v, const char *raw, size_t n, char *buf, bpe_work *k,
                       tok_ids *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) o += utf8_encode(v->byte_cp[(uint8_t)raw[i]], buf + o);
    return bpe_word(v, buf, o, k, out);
}

int tok_bpe_encode(const tok_vocab *v, const char *raw, size_t raw_len, tok_ids *out,
                   st_err *err) {
    /* 1. sanitize: each byte that starts no valid character becomes U+FFFD */
    char *text = malloc(raw_len * 3 + 1);
    char *wbuf = malloc(raw_len * 6 + 8); /* byte-encoded word: <= 2 bytes per input byte */
    bpe_work k = {0};
    tok_heap_init(&k.q, sizeof(bpe_bigram), bpe_lower);
    pcre2_match_data *md = NULL;
    int rc = -1;
    if (!text || !wbuf) goto oom;
    size_t len = utf8_sanitize_bytes_to(raw, raw_len, text);

    /* 2. pre-tokenize */
    const pcre2_code *re = v->re;
    md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) goto oom;
    size_t pos = 0;
    while (pos < len) {
        int m = pcre2_match(re, (PCRE2_SPTR)text, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        size_t ms, me;
        if (m == PCRE2_ERROR_NOMATCH) {
            ms = me = len;
        } else if (m < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(m, msg, sizeof msg);
            st_errf(err, "tokenizer: pre-tokenizer regex match: %s", (char *)msg);
            goto done;
        } else {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            ms = ov[0];
            me = ov[1];
        }
        if (ms > pos && encode_word(v, text + pos, ms - pos, wbuf, &k, out)) goto oom;
        if (me > ms) {
            if (encode_word(v, text + ms, me - ms, wbuf, &k, out)) goto oom;
            pos = me;
        } else if (ms < len) {
            /* empty match (no alternative allows one, but be safe): take one character */
            size_t cl = tok_utf8_len((uint8_t)text[ms]);
            if (cl > len - ms) cl = len - ms;
            if (encode_word(v, text + ms, cl, wbuf, &k, out)) goto oom;
            pos = ms + cl;
        } else {
            pos = len;
        }
    }
    rc = 0;
    goto done;
oom:
    st_errf(err, "tokenizer: out of memory");
done:
    if (md) pcre2_match_data_free(md);
    tok_heap_free(&k.q);
    free(k.syms);
    free(wbuf);
    free(text);
    return rc;
}

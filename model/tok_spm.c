/* tok_spm.c — SentencePiece BPE encoding of one raw-text fragment, following
 * llama.cpp's llm_tokenizer_spm (src/llama-vocab.cpp, commit c392e50):
 *   1. prepend ' ' when asked (add_space_prefix at the start of the text or
 *      after a special token), then escape every ' ' to "▁" (U+2581);
 *   2. split into UTF-8 characters (length from the lead byte; invalid bytes
 *      are 1-byte symbols);
 *   3. repeatedly merge the adjacent pair whose concatenation is a
 *      vocabulary token with the highest score (ties: leftmost);
 *   4. emit each final symbol's token, or its bytes as byte-fallback tokens
 *      "<0xAB>" (<unk> when the vocabulary has no byte tokens).
 */
#include <stdlib.h>
#include <string.h>

#include "model/tok_spm.h"

typedef struct spm_sym {
    int prev, next;
    size_t off; /* into the escaped text */
    size_t n;   /* 0: merged away */
} spm_sym;

typedef struct spm_bigram {
    int left, right;
    float score;
    size_t size;
} spm_bigram;

/* std::priority_queue comparator of llm_bigram_spm: highest score on top,
 * ties broken by the smaller left index. */
static bool spm_lower(const void *pa, const void *pb) {
    const spm_bigram *l = pa, *r = pb;
    return l->score < r->score || (l->score == r->score && l->left > r->left);
}

static int try_add_bigram(const tok_vocab *v, const char *text, spm_sym *syms, tok_heap *q,
                          int left, int right) {
    if (left == -1 || right == -1) return 0;
    size_t n = syms[left].n + syms[right].n;
    int32_t id = tok_map_get(&v->tokens, text + syms[left].off, n);
    if (id < 0) return 0;
    spm_bigram b = {left, right, v->score[id], n};
    return tok_heap_push(q, &b);
}

int tok_spm_encode(const tok_vocab *v, const char *raw, size_t raw_len, bool space_prefix,
                   tok_ids *out, st_err *err) {
    /* 1. escape (each ' ' grows from 1 to 3 bytes) */
    size_t n_spaces = space_prefix ? 1 : 0;
    for (size_t i = 0; i < raw_len; i++) n_spaces += raw[i] == ' ';
    size_t len = raw_len + (space_prefix ? 1 : 0) + 2 * n_spaces;
    char *text = malloc(len + 1);
    spm_sym *syms = malloc((len + 1) * sizeof *syms);
    tok_heap q;
    tok_heap_init(&q, sizeof(spm_bigram), spm_lower);
    int rc = -1;
    if (!text || !syms) goto oom;
    size_t o = 0;
    if (space_prefix) {
        memcpy(text + o, "\xE2\x96\x81", 3);
        o += 3;
    }
    for (size_t i = 0; i < raw_len; i++) {
        if (raw[i] == ' ') {
            memcpy(text + o, "\xE2\x96\x81", 3);
            o += 3;
        } else {
            text[o++] = raw[i];
        }
    }
    text[o] = 0;

    /* 2. symbols */
    int n_sym = 0;
    for (size_t off = 0; off < len;) {
        size_t cl = tok_utf8_len((uint8_t)text[off]);
        if (cl > len - off) cl = len - off;
        syms[n_sym].off = off;
        syms[n_sym].n = cl;
        syms[n_sym].prev = n_sym - 1;
        off += cl;
        syms[n_sym].next = off == len ? -1 : n_sym + 1;
        n_sym++;
    }

    /* 3. merges */
    for (int i = 1; i < n_sym; i++)
        if (try_add_bigram(v, text, syms, &q, i - 1, i)) goto oom;
    spm_bigram b;
    while (tok_heap_pop(&q, &b)) {
        spm_sym *l = &syms[b.left], *r = &syms[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) syms[r->next].prev = b.left;
        if (try_add_bigram(v, text, syms, &q, l->prev, b.left)) goto oom;
        if (try_add_bigram(v, text, syms, &q, b.left, l->next)) goto oom;
    }

    /* 4. output. A merged symbol is always a token (a pair is only queued
     * when its text is one), so llama.cpp's rev_merge resegmentation never
     * applies: a symbol is either a token or a single character. */
    for (int i = n_sym ? 0 : -1; i != -1; i = syms[i].next) {
        const spm_sym *s = &syms[i];
        int32_t id = tok_map_get(&v->tokens, text + s->off, s->n);
        if (id >= 0) {
            if (tok_ids_push(out, id)) goto oom;
            continue;
        }
        for (size_t j = 0; j < s->n; j++) {
            uint8_t byte = (uint8_t)text[s->off + j];
            int32_t bid = v->byte_token[byte] >= 0 ? v->byte_token[byte] : v->unk;
            if (bid < 0) {
                st_errf(err, "tokenizer: byte 0x%02X has no byte token and the vocabulary has no <unk>",
                        byte);
                goto done;
            }
            if (tok_ids_push(out, bid)) goto oom;
        }
    }
    rc = 0;
    goto done;
oom:
    st_errf(err, "tokenizer: out of memory");
done:
    tok_heap_free(&q);
    free(syms);
    free(text);
    return rc;
}

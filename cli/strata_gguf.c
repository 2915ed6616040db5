/* strata_gguf.c — the strata-gguf tool: `inspect` prints a GGUF file's
 * metadata and tensor table (like gguf-dump); `synth` writes a random-weight
 * Llama model (model/synth.h); `quantize` rewrites a model with Q8_0 or Q4_0
 * weights (model/quantize.h, like llama.cpp's llama-quantize). Errors are one
 * line on stderr, exit status 1; command-line errors exit 2.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/version.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/log.h"
#include "model/gguf.h"
#include "model/quantize.h"
#include "model/synth.h"

#define ARRAY_SHOW 8 /* array elements printed before "..." */
#define STR_SHOW 60  /* string bytes printed before "..." */

static void usage(FILE *o) {
    fprintf(o,
            "usage: strata-gguf inspect FILE\n"
            "       strata-gguf synth --out FILE [--preset bench-1b|llama-3-8b|"
            "llama-3.1-70b-layers]\n"
            "                   [--n-embd N] [--n-layer N] [--n-head N] [--n-head-kv N] "
            "[--n-ff N]\n"
            "                   [--n-vocab N] [--ctx N] [--dtype f32|f16|bf16|q8_0] [--seed S]\n"
            "                   [--vocab-from GGUF|none] [--name NAME]\n"
            "       strata-gguf quantize [--allow-requantize] IN OUT q8_0|q4_0\n"
            "                   quantizes the weight matrices as llama-quantize --pure does (row\n"
            "                   length a multiple of 32, else kept); norms stay as they are\n"
            "       strata-gguf --version\n"
            "exit status: 0 ok, 1 bad or unreadable file, 2 bad command line\n");
}

static void put_str(const char *s, uint64_t n) {
    putchar('"');
    uint64_t m = n > STR_SHOW ? STR_SHOW : n;
    for (uint64_t i = 0; i < m; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c < 32 || c == 127) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('"');
    if (m < n) fputs("...", stdout);
}

static void put_scalar(uint32_t type, const void *p) {
    union {
        uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
        float f32; uint64_t u64; int64_t i64; double f64;
    } u;
    switch (type) {
    case GGUF_TYPE_UINT8: memcpy(&u, p, 1); printf("%u", u.u8); break;
    case GGUF_TYPE_INT8: memcpy(&u, p, 1); printf("%d", u.i8); break;
    case GGUF_TYPE_BOOL: memcpy(&u, p, 1); fputs(u.u8 ? "true" : "false", stdout); break;
    case GGUF_TYPE_UINT16: memcpy(&u, p, 2); printf("%u", u.u16); break;
    case GGUF_TYPE_INT16: memcpy(&u, p, 2); printf("%d", u.i16); break;
    case GGUF_TYPE_UINT32: memcpy(&u, p, 4); printf("%" PRIu32, u.u32); break;
    case GGUF_TYPE_INT32: memcpy(&u, p, 4); printf("%" PRId32, u.i32); break;
    case GGUF_TYPE_FLOAT32: memcpy(&u, p, 4); printf("%g", u.f32); break;
    case GGUF_TYPE_UINT64: memcpy(&u, p, 8); printf("%" PRIu64, u.u64); break;
    case GGUF_TYPE_INT64: memcpy(&u, p, 8); printf("%" PRId64, u.i64); break;
    case GGUF_TYPE_FLOAT64: memcpy(&u, p, 8); printf("%g", u.f64); break;
    default: fputs("?", stdout);
    }
}

static size_t scalar_size(uint32_t t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static int cmd_inspect(const char *path) {
    st_err err;
    gguf_file *f = gguf_open(path, &err);
    if (!f) {
        fprintf(stderr, "strata-gguf: %s\n", err.msg);
        return 1;
    }
    printf("%s: GGUF v%" PRIu32 ", %zu bytes, alignment %zu, data section at byte %zu\n", path,
           gguf_version(f), gguf_file_size(f), gguf_alignment(f), gguf_data_offset(f));
    int64_t nkv = gguf_n_kv(f);
    printf("* %" PRId64 " key/value pair(s)\n", nkv);
    for (int64_t i = 0; i < nkv; i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        char tname[32];
        uint64_t count = 1;
        if (kv->type == GGUF_TYPE_ARRAY) {
            snprintf(tname, sizeof tname, "[%s]", gguf_type_name(kv->arr_type));
            count = kv->arr_n;
        } else {
            snprintf(tname, sizeof tname, "%s", gguf_type_name(kv->type));
        }
        printf("%6" PRId64 ": %-9s | %8" PRIu64 " | %.*s = ", i + 1, tname, count,
               (int)(kv->key.len > 200 ? 200 : kv->key.len), kv->key.data);
        if (kv->type == GGUF_TYPE_STRING) {
            put_str(kv->v.str.data, kv->v.str.len);
        } else if (kv->type == GGUF_TYPE_ARRAY) {
            uint64_t m = kv->arr_n > ARRAY_SHOW ? ARRAY_SHOW : kv->arr_n;
            size_t es = scalar_size(kv->arr_type);
            putchar('[');
            for (uint64_t j = 0; j < m; j++) {
                if (j) fputs(", ", stdout);
                if (kv->arr_type == GGUF_TYPE_STRING)
                    put_str(kv->arr_str[j].data, kv->arr_str[j].len);
                else if (es)
                    put_scalar(kv->arr_type, (const uint8_t *)kv->arr_data + j * es);
                else
                    fputs("[...]", stdout);
            }
            if (m < kv->arr_n) printf(", ... (%" PRIu64 " more)", kv->arr_n - m);
            putchar(']');
        } else {
            put_scalar(kv->type, &kv->v);
        }
        putchar('\n');
    }
    int64_t nt = gguf_n_tensors(f);
    uint64_t total = 0, total_el = 0;
    printf("* %" PRId64 " tensor(s)\n", nt);
    printf("%6s  %-32s %-7s %-28s %12s %12s\n", "#", "name", "type", "shape (ne0, ne1, ...)",
           "bytes", "offset");
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char shape[96];
        int n = snprintf(shape, sizeof shape, "[");
        for (uint32_t d = 0; d < t->n_dims && n < (int)sizeof shape; d++)
            n += snprintf(shape + n, sizeof shape - (size_t)n, "%s%" PRId64, d ? ", " : "",
                          t->ne[d]);
        if (n < (int)sizeof shape) snprintf(shape + n, sizeof shape - (size_t)n, "]");
        printf("%6" PRId64 "  %-32.*s %-7s %-28s %12" PRIu64 " %12" PRIu64 "\n", i + 1,
               (int)(t->name.len > 200 ? 200 : t->name.len), t->name.data,
               gguf_tensor_type_name(t->type), shape, t->nbytes, t->offset);
        total += t->nbytes;
        total_el += (uint64_t)gguf_tensor_nelements(t);
    }
    printf("* total: %" PRIu64 " elements, %" PRIu64 " bytes (%.2f GiB)\n", total_el, total,
           (double)total / (1024.0 * 1024.0 * 1024.0));
    gguf_close(f);
    return 0;
}

static int parse_i64(const char *opt, const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0) {
        fprintf(stderr, "strata-gguf: %s: '%s' is not a non-negative integer\n", opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* The default vocabulary: tokenizer/ggml-vocab-llama-spm.gguf under
 * $STRATA_SHARED, else ../shared, else the shared/ folder beside the repository
 * this binary was built in (<repo>/<build>/cli/strata-gguf). */
static int default_vocab(char *buf, size_t cap) {
    const char *rel = "tokenizer/ggml-vocab-llama-spm.gguf";
    const char *sh = getenv("STRATA_SHARED");
    if (sh && *sh) {
        snprintf(buf, cap, "%s/%s", sh, rel);
        return 0; /* explicit: use it even if missing, so the error names it */
    }
    snprintf(buf, cap, "../shared/%s", rel);
    if (access(buf, R_OK) == 0) return 0;
    char exe[2048];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(buf, cap, "%s/../../../shared/%s", exe, rel);
        if (access(buf, R_OK) == 0) return 0;
    }
    return -1;
}

static int cmd_synth(int argc, char **argv) {
    synth_params p;
    synth_params_default(&p);
    p.n_vocab = 0;
    p.verbose = 1;
    const char *out = NULL, *preset = NULL, *vocab = NULL, *dtype = NULL, *name = NULL;
    int64_t v_embd = -1, v_layer = -1, v_head = -1, v_kv = -1, v_ff = -1, v_vocab = -1,
            v_ctx = -1, v_seed = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "strata-gguf: synth: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        const char *val = argv[++i];
        struct {
            const char *opt;
            int64_t *dst;
        } nums[] = {{"--n-embd", &v_embd}, {"--n-layer", &v_layer}, {"--n-head", &v_head},
                    {"--n-head-kv", &v_kv}, {"--n-ff", &v_ff},      {"--n-vocab", &v_vocab},
                    {"--ctx", &v_ctx},     {"--seed", &v_seed}};
        int done = 0;
        for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++)
            if (strcmp(a, nums[k].opt) == 0) {
                if (parse_i64(a, val, nums[k].dst)) return 2;
                done = 1;
            }
        if (done) continue;
        if (strcmp(a, "--out") == 0) out = val;
        else if (strcmp(a, "--preset") == 0) preset = val;
        else if (strcmp(a, "--vocab-from") == 0) vocab = val;
        else if (strcmp(a, "--dtype") == 0) dtype = val;
        else if (strcmp(a, "--name") == 0) name = val;
        else {
            fprintf(stderr, "strata-gguf: synth: unknown option %s\n", a);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "strata-gguf: synth: --out FILE is required\n");
        return 2;
    }
    st_err err;
    if (preset && synth_preset(preset, &p, &err)) {
        fprintf(stderr, "strata-gguf: %s\n", err.msg);
        return 1;
    }
    if (v_embd >= 0) p.n_embd = v_embd;
    if (v_layer >= 0) p.n_layer = v_layer;
    if (v_head >= 0) p.n_head = v_head;
    if (v_kv >= 0) p.n_head_kv = v_kv;
    if (v_ff >= 0) p.n_ff = v_ff;
    if (v_vocab >= 0) p.n_vocab = v_vocab;
    if (v_ctx >= 0) p.n_ctx = v_ctx;
    if (v_seed >= 0) p.seed = (uint64_t)v_seed;
    if (name) p.name = name;
    if (dtype) {
        if (strcmp(dtype, "f32") == 0) p.dtype = GGML_TYPE_F32;
        else if (strcmp(dtype, "f16") == 0) p.dtype = GGML_TYPE_F16;
        else if (strcmp(dtype, "bf16") == 0) p.dtype = GGML_TYPE_BF16;
        else if (strcmp(dtype, "q8_0") == 0) p.dtype = GGML_TYPE_Q8_0;
        else {
            fprintf(stderr, "strata-gguf: synth: --dtype %s: expected f32, f16, bf16 or q8_0\n",
                    dtype);
            return 2;
        }
    }
    char vbuf[4096];
    if (!vocab) {
        if (default_vocab(vbuf, sizeof vbuf)) {
            fprintf(stderr, "strata-gguf: synth: no vocabulary found (looked for "
                            "$STRATA_SHARED, ../shared and the shared/ folder beside the "
                            "repository); pass --vocab-from GGUF or --vocab-from none\n");
            return 1;
        }
        vocab = vbuf;
    }
    p.vocab_path = strcmp(vocab, "none") == 0 ? NULL : vocab;
    if (synth_validate(&p, &err)) {
        fprintf(stderr, "strata-gguf: %s\n", err.msg);
        return 1;
    }
    double t0 = st_now_s();
    if (synth_write(&p, out, &err)) {
        fprintf(stderr, "strata-gguf: %s\n", err.msg);
        return 1;
    }
    double secs = st_now_s() - t0;
    gguf_file *f = gguf_open(out, &err);
    if (!f) {
        fprintf(stderr, "strata-gguf: written file does not read back: %s\n", err.msg);
        return 1;
    }
    uint32_t nv = 0;
    gguf_get_u32(f, "llama.vocab_size", &nv, NULL);
    p.n_vocab = nv;
    printf("%s: %" PRId64 " params (n_embd %" PRId64 ", %" PRId64 " layers, %" PRId64
           " heads, %" PRId64 " KV heads, n_ff %" PRId64 ", vocab %" PRIu32 ", %s), %.2f GiB, "
           "%.1f s\n",
           out, synth_n_params(&p), p.n_embd, p.n_layer, p.n_head, p.n_head_kv, p.n_ff, nv,
           ggml_type_name(p.dtype), (double)gguf_file_size(f) / (1024.0 * 1024.0 * 1024.0), secs);
    gguf_close(f);
    return 0;
}

/* ---- quantize ---- */

/* OUT.tmp while it is being written: removed if the process is interrupted. */
static char quant_tmp[4096];

static void on_signal(int sig) {
    if (quant_tmp[0]) unlink(quant_tmp);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void notice(void *ctx, const char *msg) {
    (void)ctx;
    fprintf(stderr, "strata-gguf: quantize: %s\n", msg);
}

/* "q8_0"/"q4_0" in any case, or llama-quantize's ftype numbers 7 and 2. */
static int parse_qtype(const char *s, uint32_t *type) {
    char low[16];
    size_t n = strlen(s);
    if (n >= sizeof low) return -1;
    for (size_t i = 0; i <= n; i++) low[i] = (char)tolower((unsigned char)s[i]);
    if (strcmp(low, "q8_0") == 0 || strcmp(low, "7") == 0) *type = GGML_TYPE_Q8_0;
    else if (strcmp(low, "q4_0") == 0 || strcmp(low, "2") == 0) *type = GGML_TYPE_Q4_0;
    else return -1;
    return 0;
}

static int cmd_quantize(int argc, char **argv) {
    const char *pos[3];
    int npos = 0;
    quantize_params p = {.notice = notice};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--allow-requantize") == 0) {
            p.allow_requantize = true;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "strata-gguf: quantize: unknown option %s\n", a);
            return 2;
        } else if (npos < 3) {
            pos[npos++] = a;
        } else {
            fprintf(stderr, "strata-gguf: quantize: too many arguments (IN OUT TYPE)\n");
            return 2;
        }
    }
    if (npos != 3) {
        fprintf(stderr, "strata-gguf: quantize: expected IN OUT TYPE (q8_0 or q4_0)\n");
        return 2;
    }
    const char *in = pos[0], *out = pos[1];
    if (parse_qtype(pos[2], &p.type)) {
        fprintf(stderr, "strata-gguf: quantize: unknown type '%s' (q8_0 or q4_0)\n", pos[2]);
        return 2;
    }
    if (strlen(out) + 5 > sizeof quant_tmp) {
        fprintf(stderr, "strata-gguf: quantize: output path too long\n");
        return 2;
    }
    snprintf(quant_tmp, sizeof quant_tmp, "%s.tmp", out);
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], on_signal);
    double t0 = st_now_s();
    st_err err;
    quantize_stats st;
    int rc = quantize_file(in, out, &p, &st, &err);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL);
    quant_tmp[0] = 0;
    if (rc) {
        fprintf(stderr, "strata-gguf: %s\n", err.msg);
        return 1;
    }
    double secs = st_now_s() - t0;
    const double mib = 1024.0 * 1024.0;
    printf("%s: %s (file type %d): %" PRId64 " of %" PRId64 " tensors quantized, %" PRId64
           " already %s, %" PRId64 " kept (row length), %" PRId64 " copied; tensor data %.2f MiB "
           "-> %.2f MiB, %.1f s\n",
           out, ggml_type_name(p.type), st_llama_ftype(p.type), st.n_quantized, st.n_tensors,
           st.n_same, ggml_type_name(p.type), st.n_kept, st.n_copied, (double)st.bytes_in / mib,
           (double)st.bytes_out / mib, secs);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "inspect") == 0) {
        if (argc != 3) {
            fprintf(stderr, "strata-gguf: inspect takes exactly one FILE\n");
            return 2;
        }
        return cmd_inspect(argv[2]);
    }
    if (strcmp(argv[1], "synth") == 0) return cmd_synth(argc - 2, argv + 2);
    if (strcmp(argv[1], "quantize") == 0) return cmd_quantize(argc - 2, argv + 2);
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        st_version_print(stdout, "strata-gguf");
        return 0;
    }
    fprintf(stderr, "strata-gguf: unknown command '%s' (inspect, synth, quantize)\n", argv[1]);
    return 2;
}

/* strata_run.c — strata-run: generate a completion in one process.
 *
 *   strata-run --model FILE --prompt TEXT [-n N] [--temp T] [--top-k K] [--top-p P]
 *              [--min-p P] [--repeat-penalty R] [--presence-penalty X]
 *              [--frequency-penalty X] [--seed S] [--threads N] [--tp N]
 *              [--stop STR]... [--ignore-eos] [--json] [--top-logprobs K]
 *              [--cache-type f16|f32]   (KV cache element type; llama.cpp's default is f16)
 *              [--backend cpu|cuda]     (cuda: one GPU per TP rank, NCCL; docs/cuda-backend.md)
 *
 * Streams the completion text to stdout as tokens are sampled. With --json it
 * prints one JSON object instead (prompt_tokens, completion_tokens, text,
 * finish_reason, ttft_s, prefill_tok_s, decode_tok_s and, with
 * --top-logprobs K, per-step top-K ids and natural-log probabilities).
 * Exit codes: 0 ok, 1 runtime error (bad model file, failed forward), 2 bad
 * command line. Errors are one line on stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "common/version.h"
#include "engine/generate.h"
#include "model/gguf.h"
#include "model/sampler.h"
#include "model/stop.h"
#include "model/tokenizer.h"

typedef struct run_opts {
    const char *model, *prompt;
    const char *backend; /* "cpu" (default) or "cuda" */
    int n_predict, threads, tp, top_logprobs;
    uint32_t kv_type; /* KV cache element type (GGML_TYPE_F32 or F16) */
    bool json, ignore_eos, seed_set;
    const char *stops[STOP_MAX_STRINGS];
    int n_stops;
    sampler_params sp;
} run_opts;

/* Streaming state shared with the per-token callback. */
typedef struct run_stream {
    const run_opts *o;
    tok_stream *ts;
    stop_matcher stop;
    char *piece;
    size_t piece_cap;
    char *text; /* everything emitted so far */
    size_t text_len, text_cap;
    bool stopped; /* a stop string matched */
} run_stream;

/* The --help text, laid out like llama-cli's: every flag with its spellings,
 * what it does and its default. The OpenAI-style spellings (--max-tokens,
 * --temperature) are accepted beside llama.cpp's (-n, --temp). */
static void usage(FILE *f) {
    sampler_params d = sampler_default_params();
    fprintf(f,
            "usage: strata-run -m FILE -p PROMPT [options]\n"
            "\n"
            "Generates text from PROMPT with a GGUF model in this one process (no cluster).\n"
            "\n"
            "----- model and prompt -----\n"
            "\n"
            "-m,    --model FNAME                model path, GGUF (required)\n"
            "-p,    --prompt PROMPT              prompt to start generation with (required)\n"
            "-n,    --n-predict N, --max-tokens N\n"
            "                                    number of tokens to predict (default: 128)\n"
            "       --ignore-eos                 generate past the end-of-sequence token, up to -n\n"
            "       --stop STRING                stop when STRING appears; not printed\n"
            "                                    (repeatable, at most %d)\n"
            "\n"
            "----- sampling -----\n"
            "\n"
            "       --temp N, --temperature N    temperature; 0 = greedy (default: %.1f)\n"
            "       --top-k N                    top-k sampling; 0 = off (default: %d)\n"
            "       --top-p N                    top-p (nucleus) sampling; 1.0 = off (default: %.2f)\n"
            "       --min-p N                    min-p sampling; 0.0 = off (default: %.2f)\n"
            "       --repeat-penalty N           penalize repeated tokens; 1.0 = off (default: %.1f)\n"
            "       --presence-penalty N         OpenAI presence penalty; 0.0 = off (default: %.1f)\n"
            "       --frequency-penalty N        OpenAI frequency penalty; 0.0 = off (default: %.1f)\n"
            "-s,    --seed SEED                  RNG seed (default: random; the same seed gives the same text)\n"
            "\n"
            "----- compute -----\n"
            "\n"
            "-t,    --threads N                  CPU threads per rank (default: all cores)\n"
            "       --tp N                       tensor-parallel ranks (default: 1)\n"
            "       --backend cpu|cuda           compute backend (default: cpu)\n"
            "       --cache-type f16|f32         KV cache type (default: the model's activation type)\n"
            "\n"
            "----- output -----\n"
            "\n"
            "       --json                       one JSON object at the end: text, token ids, timings\n"
            "       --top-logprobs N             with --json: the N most likely tokens at each step\n"
            "                                    (default: 0, at most %d)\n"
            "\n"
            "-h,    --help                       print this help and exit\n"
            "       --version                    print the version, git commit and build type and exit\n"
            "\n"
            "exit status: 0 ok, 1 the model could not be loaded or run, 2 a bad command line\n"
            "example: strata-run -m stories260K.gguf -p \"Once upon a time\" --max-tokens 64 --temperature 0\n",
            STOP_MAX_STRINGS, d.temperature, d.top_k, d.top_p, d.min_p, d.repeat_penalty, d.presence_penalty,
            d.frequency_penalty, SAMPLER_MAX_TOP_LOGPROBS);
}

static int bad_flag(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "strata-run: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return -1;
}

static int parse_int(const char *flag, const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "strata-run: %s: expected an integer in [%d, %d], got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_float(const char *flag, const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end) return bad_flag("%s: expected a number, got '%s'", flag, s);
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, run_opts *o) {
    enum { O_TEMP = 256, O_TOPK, O_TOPP, O_MINP, O_REP, O_PRES, O_FREQ, O_SEED, O_THREADS, O_TP,
           O_STOP, O_IGN, O_JSON, O_TOPLP, O_HELP, O_CACHE, O_BACKEND, O_VERSION };
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},       {"prompt", required_argument, 0, 'p'},
        {"n-predict", required_argument, 0, 'n'},   {"temp", required_argument, 0, O_TEMP},
        {"max-tokens", required_argument, 0, 'n'},  {"temperature", required_argument, 0, O_TEMP},
        {"version", no_argument, 0, O_VERSION},
        {"top-k", required_argument, 0, O_TOPK},    {"top-p", required_argument, 0, O_TOPP},
        {"min-p", required_argument, 0, O_MINP},    {"repeat-penalty", required_argument, 0, O_REP},
        {"presence-penalty", required_argument, 0, O_PRES},
        {"frequency-penalty", required_argument, 0, O_FREQ},
        {"seed", required_argument, 0, O_SEED},     {"threads", required_argument, 0, O_THREADS},
        {"tp", required_argument, 0, O_TP},         {"stop", required_argument, 0, O_STOP},
        {"ignore-eos", no_argument, 0, O_IGN},      {"json", no_argument, 0, O_JSON},
        {"top-logprobs", required_argument, 0, O_TOPLP}, {"help", no_argument, 0, O_HELP},
        {"cache-type", required_argument, 0, O_CACHE},
        {"backend", required_argument, 0, O_BACKEND},
        {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->tp = 1;
    o->sp = sampler_default_params();
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":m:p:n:t:s:h", longopts, NULL)) != -1) {
        int rc = 0, iv;
        switch (c) {
        case 'h': usage(stdout); exit(0);
        case 'm': o->model = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'n': rc = parse_int("-n/--max-tokens", optarg, 1, 1 << 20, &o->n_predict); break;
        case O_TEMP: rc = parse_float("--temp/--temperature", optarg, &o->sp.temperature); break;
        case O_TOPK: rc = parse_int("--top-k", optarg, 0, 1 << 30, &iv); o->sp.top_k = iv; break;
        case O_TOPP: rc = parse_float("--top-p", optarg, &o->sp.top_p); break;
        case O_MINP: rc = parse_float("--min-p", optarg, &o->sp.min_p); break;
        case O_REP: rc = parse_float("--repeat-penalty", optarg, &o->sp.repeat_penalty); break;
        case O_PRES: rc = parse_float("--presence-penalty", optarg, &o->sp.presence_penalty); break;
        case O_FREQ: rc = parse_float("--frequency-penalty", optarg, &o->sp.frequency_penalty); break;
        case 's':
        case O_SEED: {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end || optarg[0] == '-')
                rc = bad_flag("%s: expected an unsigned integer, got '%s'", "--seed", optarg);
            o->sp.seed = v;
            o->seed_set = true;
            break;
        }
        case 't':
        case O_THREADS: rc = parse_int("--threads", optarg, 1, 1024, &o->threads); break;
        case O_TP: rc = parse_int("--tp", optarg, 1, 64, &o->tp); break;
        case O_STOP:
            if (o->n_stops == STOP_MAX_STRINGS) rc = bad_flag("--stop: at most %s stop strings%s", "4", "");
            else o->stops[o->n_stops++] = optarg;
            break;
        case O_IGN: o->ignore_eos = true; break;
        case O_JSON: o->json = true; break;
        case O_TOPLP: rc = parse_int("--top-logprobs", optarg, 0, SAMPLER_MAX_TOP_LOGPROBS, &o->top_logprobs); break;
        case O_CACHE:
            if (!strcmp(optarg, "f16")) o->kv_type = GGML_TYPE_F16;
            else if (!strcmp(optarg, "f32")) o->kv_type = GGML_TYPE_F32;
            else rc = bad_flag("--cache-type: expected f16 or f32, got '%s'%s", optarg, "");
            break;
        case O_HELP: usage(stdout); exit(0);
        case O_VERSION: st_version_print(stdout, "strata-run"); exit(0);
        case O_BACKEND:
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0)
                rc = bad_flag("--backend: expected cpu or cuda, got '%s'%s", optarg, "");
            else o->backend = optarg;
            break;
        case ':': rc = bad_flag("option %s needs a value%s", argv[optind - 1], ""); break;
        default: rc = bad_flag("unknown option '%s'%s (see --help)", argv[optind - 1], ""); break;
        }
        if (rc) return -1;
    }
    if (optind < argc) return bad_flag("unexpected argument '%s'%s", argv[optind], "");
    if (!o->model) return bad_flag("--model FILE is required%s%s", "", "");
    if (!o->prompt) return bad_flag("--prompt TEXT is required%s%s", "", "");
    if (o->top_logprobs > 0 && !o->json)
        return bad_flag("--top-logprobs is reported in the JSON output: add --json%s%s", "", "");
    if (!o->seed_set) o->sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    o->sp.n_top_logprobs = o->top_logprobs;
    st_err err;
    if (sampler_params_validate(&o->sp, &err)) return bad_flag("%s%s", err.msg, "");
    return 0;
}

static int text_append(run_stream *rs, const char *s, size_t n) {
    if (rs->text_len + n + 1 > rs->text_cap) {
        size_t cap = rs->text_cap ? rs->text_cap * 2 : 4096;
        while (cap < rs->text_len + n + 1) cap *= 2;
        char *t = realloc(rs->text, cap);
        if (!t) return -1;
        rs->text = t;
        rs->text_cap = cap;
    }
    memcpy(rs->text + rs->text_len, s, n);
    rs->text_len += n;
    rs->text[rs->text_len] = 0;
    return 0;
}

/* Emits text that the stop matcher released: to stdout when streaming. */
static void emit(run_stream *rs, const char *s, size_t n) {
    if (!n) return;
    text_append(rs, s, n);
    if (!rs->o->json) {
        fwrite(s, 1, n, stdout);
        fflush(stdout);
    }
}

static void feed_text(run_stream *rs, const char *s, size_t n) {
    const char *out;
    size_t out_len;
    st_err err;
    int r = stop_feed(&rs->stop, s, n, &out, &out_len, &err);
    if (r >= 0) emit(rs, out, out_len);
    if (r == 1) rs->stopped = true;
}

static int on_token(void *user, int req, int index, int32_t token) {
    run_stream *rs = user;
    int n = tok_stream_push(rs->ts, token, rs->piece, rs->piece_cap);
    if (n > 0) feed_text(rs, rs->piece, (size_t)n);
    return rs->stopped ? 1 : 0;
}

static void finish_text(run_stream *rs) {
    int n = tok_stream_flush(rs->ts, rs->piece, rs->piece_cap);
    if (n > 0 && !rs->stopped) feed_text(rs, rs->piece, (size_t)n);
    if (!rs->stopped) {
        const char *out;
        size_t out_len;
        stop_flush(&rs->stop, &out, &out_len);
        emit(rs, out, out_len);
    }
}

static const char *finish_reason(const gen_result *r, bool stopped) {
    if (stopped || r->stop == GEN_STOP_EOS) return "stop";
    return "length";
}

static void print_json(const run_opts *o, const int32_t *prompt, size_t n_prompt, const gen_result *r,
                       const run_stream *rs, const gen_timing *t) {
    json_t *root = json_object();
    json_t *pt = json_array(), *ct = json_array();
    for (size_t i = 0; i < n_prompt; i++) json_array_append_new(pt, json_integer(prompt[i]));
    for (int i = 0; i < r->n_tokens; i++) json_array_append_new(ct, json_integer(r->tokens[i]));
    json_object_set_new(root, "prompt_tokens", pt);
    json_object_set_new(root, "completion_tokens", ct);
    json_object_set_new(root, "text", json_stringn(rs->text ? rs->text : "", rs->text_len));
    json_object_set_new(root, "finish_reason", json_string(finish_reason(r, rs->stopped)));
    json_object_set_new(root, "ttft_s", json_real(t->ttft_s));
    json_object_set_new(root, "prefill_tok_s", json_real(t->prefill_tok_s));
    json_object_set_new(root, "decode_tok_s", json_real(t->decode_tok_s));
    if (o->top_logprobs > 0) {
        json_t *steps = json_array();
        for (int i = 0; i < r->n_tokens; i++) {
            json_t *step = json_object(), *top = json_array();
            json_object_set_new(step, "id", json_integer(r->tokens[i]));
            json_object_set_new(step, "logprob", json_real(r->logprobs[i]));
            for (int k = 0; k < r->top_k; k++) {
                int32_t id = r->top_ids[(size_t)i * r->top_k + k];
                if (id < 0) continue;
                json_t *pair = json_array();
                json_array_append_new(pair, json_integer(id));
                json_array_append_new(pair, json_real(r->top_logprobs[(size_t)i * r->top_k + k]));
                json_array_append_new(top, pair);
            }
            json_object_set_new(step, "top_logprobs", top);
            json_array_append_new(steps, step);
        }
        json_object_set_new(root, "steps", steps);
    }
    char *s = json_dumps(root, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (s) puts(s);
    free(s);
    json_decref(root);
}

int main(int argc, char **argv) {
    run_opts o;
    if (parse_args(argc, argv, &o)) return 2;
    if (getenv("STRATA_LOG") == NULL) st_log_set_level(ST_LOG_WARN);

    st_err err;
    int rc = 1;
    gguf_file *gf = NULL;
    tok_vocab *vocab = NULL;
    gen_engine *g = NULL;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    gen_result res = {0};
    run_stream rs = {.o = &o};
    bool stop_ok = false;

    if (!(gf = gguf_open(o.model, &err)) || !(vocab = tok_vocab_load(gf, &err))) goto fail;
    if (tok_encode(vocab, o.prompt, strlen(o.prompt), true, false, &prompt, &n_prompt, &err)) goto fail;
    if (n_prompt == 0) {
        st_errf(&err, "the prompt tokenizes to no tokens");
        goto fail;
    }
    if (stop_init(&rs.stop, o.stops, o.n_stops, &err)) goto fail;
    stop_ok = true;
    gen_params gp = {.model_path = o.model, .tp = o.tp, .n_threads = o.threads, .max_seqs = 1,
                    .kv_type = o.kv_type, .backend = o.backend};
    if (!(g = gen_open(&gp, &err))) goto fail;

    rs.ts = tok_stream_new(vocab, false);
    rs.piece_cap = tok_stream_max_out(rs.ts);
    rs.piece = malloc(rs.piece_cap);
    if (!rs.ts || !rs.piece) {
        st_errf(&err, "out of memory");
        goto fail;
    }
    gen_request rq = {.prompt = prompt, .n_prompt = (int)n_prompt, .max_tokens = o.n_predict,
                      .ignore_eos = o.ignore_eos, .sampling = o.sp};
    gen_timing timing;
    if (gen_run(g, &rq, 1, &res, &timing, on_token, &rs, &err)) goto fail;
    finish_text(&rs);
    if (o.json) {
        print_json(&o, prompt, n_prompt, &res, &rs, &timing);
    } else {
        fputc('\n', stdout);
        fprintf(stderr, "[%d prompt tokens, %d generated; TTFT %.3f s, prefill %.1f tok/s, decode %.1f tok/s]\n",
                (int)n_prompt, res.n_tokens, timing.ttft_s, timing.prefill_tok_s, timing.decode_tok_s);
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "strata-run: %s\n", err.msg);
out:
    gen_result_free(&res);
    free(rs.piece);
    free(rs.text);
    tok_stream_free(rs.ts);
    if (stop_ok) stop_free(&rs.stop);
    gen_close(g);
    free(prompt);
    tok_vocab_free(vocab);
    gguf_close(gf);
    return rc;
}

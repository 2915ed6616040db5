/* strata_bench.c — strata-bench: single-process prefill/decode speed of a model.
 *
 *   strata-bench --model FILE [--batch B] [--prompt-len P] [--gen N] [--threads N]
 *                [--tp N] [--reps R] [--json]
 *
 * Each repetition runs B sequences of P random prompt tokens (ids drawn with a
 * fixed seed, EOS ignored) and generates N tokens each, greedily. Figures are
 * the best repetition after one warm-up:
 *   prefill tok/s = B*P / prefill seconds        TTFT = prefill seconds
 *   decode tok/s  = tokens after the first / decode seconds (aggregate over B)
 *   TPOT          = decode seconds / decode steps (per sequence, seconds)
 *   all-reduce %  = rank 0's seconds inside collectives / its busy seconds
 *   weights       = resident weight bytes summed over ranks (backend accounting)
 *   peak RSS      = getrusage(RUSAGE_SELF).ru_maxrss
 * --json adds every repetition's decode tok/s ("decode_tok_s_reps") and the
 * KV-cache bytes one decode token reads, averaged over the decode steps
 * ("kv_read_bytes_per_token": K and V of every position so far, every layer;
 * the cache is f32, the engine's default), for the roofline.
 * Compare decode against the memory-read roofline with bench/roofline.sh.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/log.h"
#include "compute/cpu/threadpool.h"
#include "engine/generate.h"

typedef struct bench_opts {
    const char *model;
    int batch, prompt_len, gen, threads, tp, reps;
    int json;
} bench_opts;

typedef struct bench_result {
    gen_timing t;
    double comm_share;
} bench_result;

static int parse_pos_int(const char *flag, const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > (1 << 24)) {
        fprintf(stderr, "strata-bench: %s: expected a positive integer, got '%s'\n", flag, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, bench_opts *o) {
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},      {"batch", required_argument, 0, 'b'},
        {"prompt-len", required_argument, 0, 'p'}, {"gen", required_argument, 0, 'n'},
        {"threads", required_argument, 0, 't'},    {"tp", required_argument, 0, 'T'},
        {"reps", required_argument, 0, 'r'},       {"json", no_argument, 0, 'j'},
        {0, 0, 0, 0}};
    *o = (bench_opts){.batch = 1, .prompt_len = 64, .gen = 32, .tp = 1, .reps = 3};
    opterr = 0;
    int c, rc = 0;
    while (!rc && (c = getopt_long(argc, argv, ":m:b:p:n:t:r:j", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'b': rc = parse_pos_int("--batch", optarg, &o->batch); break;
        case 'p': rc = parse_pos_int("--prompt-len", optarg, &o->prompt_len); break;
        case 'n': rc = parse_pos_int("--gen", optarg, &o->gen); break;
        case 't': rc = parse_pos_int("--threads", optarg, &o->threads); break;
        case 'T': rc = parse_pos_int("--tp", optarg, &o->tp); break;
        case 'r': rc = parse_pos_int("--reps", optarg, &o->reps); break;
        case 'j': o->json = 1; break;
        default:
            fprintf(stderr, "strata-bench: unknown or incomplete option '%s'\n", argv[optind - 1]);
            rc = -1;
        }
    }
    if (!rc && !o->model) {
        fprintf(stderr, "strata-bench: --model FILE is required\n");
        rc = -1;
    }
    return rc;
}

/* Rank 0's collective seconds and busy seconds, cumulative. */
static void rank0_times(gen_engine *g, double *comm_s, double *busy_s) {
    stage_rank_stats rs;
    *comm_s = *busy_s = 0;
    if (stage_rank_stats_get(gen_stage(g), 0, &rs) == 0) {
        *comm_s = rs.comm_seconds;
        *busy_s = rs.busy_seconds;
    }
}

static size_t total_weight_bytes(gen_engine *g, int tp) {
    size_t sum = 0;
    for (int r = 0; r < tp; r++) {
        stage_rank_stats rs;
        if (stage_rank_stats_get(gen_stage(g), r, &rs) == 0) sum += rs.weight_bytes;
    }
    return sum;
}

static int run_once(gen_engine *g, const bench_opts *o, const gen_request *reqs, bench_result *out,
                    st_err *err) {
    gen_result *res = calloc((size_t)o->batch, sizeof *res);
    if (!res) return st_errf(err, "out of memory");
    double c0, b0, c1, b1;
    rank0_times(g, &c0, &b0);
    int rc = gen_run(g, reqs, o->batch, res, &out->t, NULL, NULL, err);
    rank0_times(g, &c1, &b1);
    out->comm_share = b1 > b0 ? (c1 - c0) / (b1 - b0) : 0;
    for (int i = 0; i < o->batch; i++) gen_result_free(&res[i]);
    free(res);
    return rc;
}

int main(int argc, char **argv) {
    bench_opts o;
    if (parse_args(argc, argv, &o)) return 2;
    if (!getenv("STRATA_LOG")) st_log_set_level(ST_LOG_WARN);
    if (o.threads == 0) o.threads = st_cpu_count();

    st_err err;
    gen_params gp = {.model_path = o.model, .tp = o.tp, .n_threads = o.threads,
                     .max_seqs = o.batch, .n_ctx = o.prompt_len + o.gen + 1,
                     .max_batch_tokens = o.batch * o.prompt_len};
    gen_engine *g = gen_open(&gp, &err);
    if (!g) {
        fprintf(stderr, "strata-bench: %s\n", err.msg);
        return 1;
    }
    const llama_config *cfg = gen_config(g);

    /* Random prompts from a fixed LCG, avoiding BOS/EOS. */
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)o.batch * (size_t)o.prompt_len);
    gen_request *reqs = calloc((size_t)o.batch, sizeof *reqs);
    uint64_t s = 42;
    for (size_t i = 0; i < (size_t)o.batch * (size_t)o.prompt_len; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 3 + (int32_t)((s >> 33) % (uint64_t)(cfg->n_vocab - 3));
    }
    for (int b = 0; b < o.batch; b++) {
        reqs[b] = (gen_request){.prompt = ids + (size_t)b * o.prompt_len, .n_prompt = o.prompt_len,
                                .max_tokens = o.gen, .ignore_eos = true,
                                .sampling = sampler_greedy_params()};
    }

    bench_result best = {0}, r;
    double *rep_tok_s = calloc((size_t)o.reps + 1, sizeof *rep_tok_s);
    int rc = rep_tok_s ? 0 : 1;
    if (rc) fprintf(stderr, "strata-bench: out of memory\n");
    for (int rep = 0; rc == 0 && rep <= o.reps; rep++) { /* rep 0 is the warm-up */
        if (run_once(g, &o, reqs, &r, &err)) {
            fprintf(stderr, "strata-bench: %s\n", err.msg);
            rc = 1;
            break;
        }
        if (rep == 0) continue;
        rep_tok_s[rep - 1] = r.t.decode_tok_s;
        if (best.t.decode_tok_s == 0 || r.t.decode_tok_s > best.t.decode_tok_s) {
            double keep_prefill = best.t.prefill_tok_s, keep_ttft = best.t.ttft_s;
            best = r;
            if (keep_prefill > best.t.prefill_tok_s) { /* keep the best prefill too */
                best.t.prefill_tok_s = keep_prefill;
                best.t.ttft_s = keep_ttft;
            }
        } else if (r.t.prefill_tok_s > best.t.prefill_tok_s) {
            best.t.prefill_tok_s = r.t.prefill_tok_s;
            best.t.ttft_s = r.t.ttft_s;
        }
    }
    if (rc == 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double rss_gib = (double)ru.ru_maxrss * 1024.0 / (1024.0 * 1024.0 * 1024.0);
        double wgib = (double)total_weight_bytes(g, o.tp) / (1024.0 * 1024.0 * 1024.0);
        double tpot = best.t.decode_steps ? best.t.decode_s / best.t.decode_steps : 0;
        /* Decode step i (0 <= i < gen - 1) attends over prompt_len + i + 1 positions. */
        double kv_pos = o.gen > 1 ? o.prompt_len + o.gen / 2.0 : 0;
        double kv_bytes = kv_pos * cfg->n_layer * 2.0 * cfg->n_head_kv * cfg->head_dim * sizeof(float);
        if (o.json) {
            json_t *reps = json_array();
            for (int i = 0; i < o.reps; i++) json_array_append_new(reps, json_real(rep_tok_s[i]));
            json_t *j = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
                                  "model", o.model, "batch", o.batch, "prompt_len", o.prompt_len,
                                  "gen", o.gen, "threads", o.threads, "tp", o.tp,
                                  "prefill_tok_s", best.t.prefill_tok_s, "decode_tok_s",
                                  best.t.decode_tok_s, "ttft_s", best.t.ttft_s, "tpot_s", tpot,
                                  "allreduce_share", best.comm_share, "weights_gib", wgib,
                                  "peak_rss_gib", rss_gib);
            json_object_set_new(j, "decode_tok_s_reps", reps);
            json_object_set_new(j, "kv_read_bytes_per_token", json_real(kv_bytes));
            char *txt = json_dumps(j, JSON_COMPACT);
            puts(txt);
            free(txt);
            json_decref(j);
        } else {
            printf("%-6s %-5s %-4s %-7s %-4s %12s %11s %9s %9s %8s %8s %8s\n", "batch", "plen", "gen",
                   "threads", "tp", "prefill t/s", "decode t/s", "TTFT s", "TPOT ms", "AR %",
                   "wts GiB", "RSS GiB");
            printf("%-6d %-5d %-4d %-7d %-4d %12.1f %11.2f %9.3f %9.2f %8.1f %8.2f %8.2f\n", o.batch,
                   o.prompt_len, o.gen, o.threads, o.tp, best.t.prefill_tok_s, best.t.decode_tok_s,
                   best.t.ttft_s, tpot * 1e3, best.comm_share * 100, wgib, rss_gib);
        }
    }
    free(rep_tok_s);
    free(ids);
    free(reqs);
    gen_close(g);
    return rc;
}

/* stratactl.c — the operator CLI of the gRPC control API (strata.v1.Control,
 * proto/control.proto) through rpc/grpc_client. Human-readable tables by
 * default, JSON (field names as in control.proto) with --json.
 *
 *   stratactl [--addr HOST:PORT[,HOST:PORT...]] [--json] [--timeout S] [--ca F --cert F --key F] COMMAND
 *     status | nodes | placement show | placement set --stages a:0-2,b:3-4
 *     placement auto [--dry-run] | drain NODE [--wait] | undrain NODE | node remove NODE
 *     generate PROMPT [--max-tokens N]
 *   stratactl --version
 *
 * --addr HOST (no port) means HOST:7070, the coordinator's default gRPC port;
 * IPv6 as [ADDR]:PORT or [ADDR]. --addr A,B,... names a leader and its
 * standbys (--etcd, docs/recovery.md): the command goes to the first that
 * answers GetStatus (a standby answers UNAVAILABLE and runs nothing). JSON follows proto3's mapping: 64-bit
 * integers (lease ids, epochs, byte counts) are strings, so that jq and
 * JavaScript do not round them. Progress bars only when stderr is a terminal.
 *
 * Exit codes (docs/control-api.md): 0 ok; 1 the server answered an error
 * status (printed as "CODE: message"); 2 usage error; 3 the server is
 * unavailable or the deadline passed.
 *
 * Mutual TLS (docs/security.md): --ca/--cert/--key ($STRATA_CA, $STRATA_CERT,
 * $STRATA_KEY) give the cluster CA and an operator certificate (CN
 * "operator:NAME"); the coordinator's certificate must name the --addr host.
 */
#include <errno.h>
#include <jansson.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/version.h"
#include "proto/control.pb-c.h"
#include "rpc/grpc_client.h"

#define SVC "/strata.v1.Control/"
#define DEFAULT_PORT 7070
#define DEFAULT_ADDR "127.0.0.1:7070"
#define DRAIN_WAIT_S 600.0 /* drain --wait without --timeout */
#define MAX_ADDRS 8        /* --addr a,b,...: a leader and its standbys, as the worker's --coordinator */
#define PROBE_S 3.0        /* each coordinator's GetStatus while looking for the leader */

enum { EXIT_OK = 0, EXIT_SERVER = 1, EXIT_USAGE = 2, EXIT_UNAVAILABLE = 3 };

static const char usage_text[] =
    "usage: stratactl [--addr HOST:PORT[,...]] [--json] [--timeout S] [--ca F --cert F --key F] COMMAND\n"
    "commands:\n"
    "  status                                cluster summary\n"
    "  nodes                                 registered workers, state, heartbeat age, load\n"
    "  placement show                        current (and pending) placement\n"
    "  placement set --stages N:A-B[,N:A-B]  explicit stages, layers inclusive\n"
    "  placement auto [--dry-run]            automatic placement\n"
    "  drain NODE [--wait]                   no new work on NODE; its stages move away; --wait: until\n"
    "                                        NODE holds no stage and no sequence (like kubectl drain)\n"
    "  undrain NODE                          a drained NODE is ready again (for the next placement change)\n"
    "  node remove NODE                      forget NODE's record (not while it holds a stage: drain it\n"
    "                                        first); if it still runs, it registers again as a new node\n"
    "  generate PROMPT [--max-tokens N]      stream generated text\n"
    "options:\n"
    "  --addr HOST[:PORT] coordinator gRPC control address, port 7070 when left out\n"
    "                     (default $STRATACTL_ADDR or " DEFAULT_ADDR "); A,B,... (up to 8): coordinators\n"
    "                     on etcd, the command goes to the one that leads\n"
    "  --json             JSON output (generate: one JSON object per chunk; 64-bit numbers as strings)\n"
    "  --timeout S        deadline in seconds (default 10; generate: 600; drain --wait: the whole\n"
    "                     wait, default 600)\n"
    "  --version          print the version, git commit and build type\n"
    "  --ca FILE          cluster CA certificate: mutual TLS (default $STRATA_CA)\n"
    "  --cert FILE        operator certificate, CN operator:NAME (default $STRATA_CERT)\n"
    "  --key FILE         its private key (default $STRATA_KEY); docs/security.md\n"
    "exit codes: 0 ok, 1 server error, 2 usage error, 3 unavailable or timed out\n";

typedef struct opts {
    const char *addr;      /* the one the command goes to */
    const char *addrs[MAX_ADDRS];
    int n_addrs;
    rpc_tls tls;           /* all NULL: plaintext */
    int json;
    double timeout;
    const char *stages;
    int dry_run, wait;
    long max_tokens;
    char addr_arg[MAX_ADDRS * 300];     /* --addr's list, split in place */
    char addr_buf[MAX_ADDRS][300];      /* each with the default port added */
    const char *words[4];
    int n_words;
} opts;

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "stratactl: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (stratactl --help for usage)\n");
    return EXIT_USAGE;
}

/* ------------------------------------------------------------------ protobuf -> JSON */

static json_t *pb_to_json(const ProtobufCMessage *m);

static json_t *field_value(const ProtobufCFieldDescriptor *f, const void *p) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32: return json_integer(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: return json_integer(*(const uint32_t *)p);
    /* 64-bit integers as decimal strings (proto3's JSON mapping): lease ids
     * are random 64-bit numbers, and JSON numbers above 2^53 lose digits in
     * jq and JavaScript. */
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64: {
        char buf[24];
        snprintf(buf, sizeof buf, "%lld", (long long)*(const int64_t *)p);
        return json_string(buf);
    }
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: {
        char buf[24];
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)*(const uint64_t *)p);
        return json_string(buf);
    }
    case PROTOBUF_C_TYPE_FLOAT: return json_real(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE: return json_real(*(const double *)p);
    case PROTOBUF_C_TYPE_BOOL: return json_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumValue *v =
            protobuf_c_enum_descriptor_get_value(f->descriptor, *(const int *)p);
        return v ? json_string(v->name) : json_integer(*(const int *)p);
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        return json_string(s ? s : "");
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        return json_integer((json_int_t)b->len); /* no bytes fields in control.proto */
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)p;
        return sub ? pb_to_json(sub) : json_null();
    }
    }
    return json_null();
}

/* Every field, with its control.proto name (absent sub-messages are null). */
static json_t *pb_to_json(const ProtobufCMessage *m) {
    json_t *o = json_object();
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *base = (const char *)m + f->offset;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
            const char *arr = *(char *const *)base;
            size_t sz = f->type == PROTOBUF_C_TYPE_MESSAGE || f->type == PROTOBUF_C_TYPE_STRING
                            ? sizeof(void *)
                        : f->type == PROTOBUF_C_TYPE_INT64 || f->type == PROTOBUF_C_TYPE_UINT64 ||
                                f->type == PROTOBUF_C_TYPE_SINT64 ||
                                f->type == PROTOBUF_C_TYPE_FIXED64 ||
                                f->type == PROTOBUF_C_TYPE_SFIXED64 ||
                                f->type == PROTOBUF_C_TYPE_DOUBLE
                            ? 8
                        : f->type == PROTOBUF_C_TYPE_BOOL  ? sizeof(protobuf_c_boolean)
                        : f->type == PROTOBUF_C_TYPE_BYTES ? sizeof(ProtobufCBinaryData)
                                                           : 4;
            json_t *a = json_array();
            for (size_t k = 0; k < n; k++) json_array_append_new(a, field_value(f, arr + k * sz));
            json_object_set_new(o, f->name, a);
        } else {
            json_object_set_new(o, f->name, field_value(f, base));
        }
    }
    return o;
}

static void print_json(const ProtobufCMessage *m) {
    json_t *j = pb_to_json(m);
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s) printf("%s\n", s);
    free(s);
    json_decref(j);
}

/* ------------------------------------------------------------------ calls */

/* Set when the channel is TLS: a failed handshake shows as UNAVAILABLE. */
static const char *unavailable_hint = "";
static const char *ctl_addr = DEFAULT_ADDR; /* for the hints */

static int status_exit(const char *what, const rpc_status *st) {
    fprintf(stderr, "stratactl: %s: %s: %s%s\n", what, rpc_code_name(st->code), st->msg,
            st->code == RPC_UNAVAILABLE ? unavailable_hint : "");
    /* The usual mistakes: nothing listens there, or it is not a live
     * coordinator's gRPC port (a static coordinator has no control API; the
     * HTTP port speaks HTTP/1.1). */
    if ((st->code == RPC_UNAVAILABLE || st->code == RPC_INTERNAL) &&
        (strstr(st->msg, "HTTP/2") || strstr(st->msg, "http1")))
        fprintf(stderr,
                "stratactl: hint: %s answers, but not with gRPC: is it an HTTP port, such as the "
                "coordinator's OpenAI API (8000)? The control API is the --grpc-listen address of a "
                "coordinator started with --live (default port 7070).\n",
                ctl_addr);
    else if (st->code == RPC_UNAVAILABLE && strstr(st->msg, "is a standby"))
        fprintf(stderr,
                "stratactl: hint: give every coordinator, --addr A,B,... (or $STRATACTL_ADDR), and "
                "stratactl sends the command to the one that leads.\n");
    else if (st->code == RPC_UNAVAILABLE || st->code == RPC_UNIMPLEMENTED)
        fprintf(stderr,
                "stratactl: hint: is a coordinator running with --live and its gRPC control API on %s "
                "(--grpc-listen, default port 7070)? A coordinator without --live (static cluster "
                "config) has no control API.\n",
                ctl_addr);
    if (st->code == RPC_UNAVAILABLE || st->code == RPC_DEADLINE_EXCEEDED) return EXIT_UNAVAILABLE;
    return EXIT_SERVER;
}

/* One unary call; on success *out is the unpacked reply. Returns an exit code. */
static int unary(rpc_client *c, const opts *o, const char *name, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *rdesc, ProtobufCMessage **out) {
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return status_exit(name, &(rpc_status){RPC_RESOURCE_EXHAUSTED, "out of memory"});
    protobuf_c_message_pack(req, buf);
    char method[128];
    snprintf(method, sizeof method, SVC "%s", name);
    uint8_t *rep = NULL;
    size_t rlen = 0;
    rpc_status st;
    int rc = rpc_client_unary(c, method, buf, len, o->timeout > 0 ? o->timeout : 10.0, &rep,
                              &rlen, &st);
    free(buf);
    if (rc != 0) return status_exit(name, &st);
    *out = protobuf_c_message_unpack(rdesc, NULL, rlen, rep);
    free(rep);
    if (!*out) {
        fprintf(stderr, "stratactl: %s: the reply does not decode as %s\n", name, rdesc->name);
        return EXIT_SERVER;
    }
    return EXIT_OK;
}

/* ------------------------------------------------------------------ formatting */

/* The state words of /metrics' strata_worker_state (docs/metrics.md); a ready
 * node that holds a stage of the serving placement is "serving". */
static const char *state_name(Strata__V1__NodeState s) {
    switch (s) {
    case STRATA__V1__NODE_STATE__NODE_STATE_REGISTERED: return "registered";
    case STRATA__V1__NODE_STATE__NODE_STATE_READY: return "ready";
    case STRATA__V1__NODE_STATE__NODE_STATE_SUSPECT: return "suspect";
    case STRATA__V1__NODE_STATE__NODE_STATE_DEAD: return "dead";
    case STRATA__V1__NODE_STATE__NODE_STATE_DRAINING: return "draining";
    default: return "unknown";
    }
}

static void fmt_bytes(char *out, size_t n, uint64_t b) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    snprintf(out, n, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

static void print_placement_table(const char *title, const Strata__V1__Placement *p) {
    printf("%s: epoch %llu, %u layers, %zu stages\n", title, (unsigned long long)p->epoch,
           p->n_layers, p->n_stages);
    if (p->n_stages == 0) return;
    printf("  %-6s %-20s %-10s %s\n", "STAGE", "NODE", "LAYERS", "TP");
    for (size_t i = 0; i < p->n_stages; i++) {
        const Strata__V1__Stage *s = p->stages[i];
        char layers[32];
        snprintf(layers, sizeof layers, "%u-%u", s->first_layer, s->last_layer);
        printf("  %-6zu %-20s %-10s %u\n", i, s->node, layers, s->tp);
    }
}

static void print_placement(const Strata__V1__PlacementReply *r) {
    if (r->current) print_placement_table("current", r->current);
    else printf("current: none\n");
    if (r->unchanged)
        printf("unchanged: the current placement already is the one asked for (no new epoch, nothing reloaded)\n");
    if (r->pending) {
        print_placement_table("pending", r->pending);
        for (size_t i = 0; i < r->n_loading; i++) {
            const Strata__V1__NodeLoad *l = r->loading[i];
            double pct = l->bytes_total ? 100.0 * (double)l->bytes_loaded / (double)l->bytes_total
                                        : 0.0;
            printf("  loading %-20s %5.1f%%\n", l->node, pct);
        }
    }
}

/* ------------------------------------------------------------------ commands */

static int cmd_status(rpc_client *c, const opts *o) {
    Strata__V1__GetStatusRequest req = STRATA__V1__GET_STATUS_REQUEST__INIT;
    Strata__V1__GetStatusReply *r = NULL;
    int rc = unary(c, o, "GetStatus", &req.base, &strata__v1__get_status_reply__descriptor,
                   (ProtobufCMessage **)&r);
    if (rc) return rc;
    if (o->json) {
        print_json(&r->base);
    } else {
        printf("%-16s %s (%u layers)\n", "model", r->model, r->n_layers);
        printf("%-16s %s\n", "serving", r->serving ? "yes" : "no");
        if (r->recovery) {
            const Strata__V1__RecoveryStatus *v = r->recovery;
            printf("%-16s %s", "recovery", v->state);
            if (v->loading_epoch) printf(" (epoch %llu loading)", (unsigned long long)v->loading_epoch);
            printf(": stage %u of epoch %llu lost on node %s %.1f s ago; %u sequence(s) held "
                   "(recovery_timeout %.0f s)\n",
                   v->lost_stage, (unsigned long long)v->lost_epoch, v->lost_node, v->since_s,
                   v->held_sequences, v->timeout_s);
            printf("%-16s %s\n", "lost because", v->reason);
        }
        const Strata__V1__EtcdWrites *w = r->etcd_writes; /* --etcd: the leader's writes (docs/recovery.md) */
        if (w)
            printf("%-16s %s: %llu queued, the oldest missing for %.1f s; %llu txn(s) refused, %llu change(s) dropped\n",
                   "etcd writes", w->queued || w->unwritten_s > 0 ? "NOT all in etcd" : "all in etcd",
                   (unsigned long long)w->queued, w->unwritten_s, (unsigned long long)w->txns_refused,
                   (unsigned long long)w->changes_dropped);
        if (w && *w->last_refusal) printf("%-16s %.1f s ago: %s\n", "etcd refused", w->last_refusal_age_s, w->last_refusal);
        printf("%-16s %llu (%u stages)\n", "placement epoch",
               (unsigned long long)r->placement_epoch, r->n_stages);
        printf("%-16s %u ready / %u total\n", "nodes", r->nodes_ready, r->nodes_total);
        printf("%-16s %u sequences\n", "running", r->running_sequences);
        printf("%-16s %.1f s\n", "uptime", r->uptime_s);
        printf("%-16s %s\n", "version", r->version);
    }
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return EXIT_OK;
}

/* The serving placement (NULL: none, or the call failed; free it). */
static Strata__V1__PlacementReply *get_placement(rpc_client *c, const opts *o) {
    Strata__V1__GetPlacementRequest req = STRATA__V1__GET_PLACEMENT_REQUEST__INIT;
    Strata__V1__PlacementReply *r = NULL;
    if (unary(c, o, "GetPlacement", &req.base, &strata__v1__placement_reply__descriptor,
              (ProtobufCMessage **)&r))
        return NULL;
    return r;
}

static bool in_placement(const Strata__V1__Placement *p, const char *node) {
    for (size_t i = 0; p && i < p->n_stages; i++)
        if (!strcmp(p->stages[i]->node, node)) return true;
    return false;
}

static const char *fmt_gpu(char *buf, size_t cap, size_t g) {
    snprintf(buf, cap, "GPU%zu", g);
    return buf;
}

static int cmd_nodes(rpc_client *c, const opts *o) {
    Strata__V1__ListNodesRequest req = STRATA__V1__LIST_NODES_REQUEST__INIT;
    Strata__V1__ListNodesReply *r = NULL;
    int rc = unary(c, o, "ListNodes", &req.base, &strata__v1__list_nodes_reply__descriptor,
                   (ProtobufCMessage **)&r);
    if (rc) return rc;
    Strata__V1__PlacementReply *pl = o->json ? NULL : get_placement(c, o);
    if (o->json) {
        print_json(&r->base);
    } else {
        printf("%-16s %-10s %7s  %-22s %-10s %-21s %7s %-13s %5s\n", "NAME", "STATE", "HB_AGE",
               "DEVICES", "HOST_MEM", "DATA_ADDR", "RUNNING", "KV_USED/FREE", "BUSY");
        for (size_t i = 0; i < r->n_nodes; i++) {
            const Strata__V1__NodeInfo *n = r->nodes[i];
            char devs[96] = "-", mem[32], age[16], kv[32], each[32];
            size_t off = 0;
            for (size_t d = 0; d < n->n_devices && off < sizeof devs; d++) {
                fmt_bytes(each, sizeof each, n->devices[d]->memory_bytes);
                off += (size_t)snprintf(devs + off, sizeof devs - off, "%s%ux %s %s",
                                        d ? "," : "", n->devices[d]->count,
                                        n->devices[d]->kind, each);
            }
            fmt_bytes(mem, sizeof mem, n->host_memory_bytes);
            snprintf(age, sizeof age, "%.1fs", n->heartbeat_age_s);
            snprintf(kv, sizeof kv, "%u/%u", n->kv_blocks_used, n->kv_blocks_free);
            bool serving = n->state == STRATA__V1__NODE_STATE__NODE_STATE_READY && pl &&
                           in_placement(pl->current, n->name);
            printf("%-16s %-10s %7s  %-22s %-10s %-21s %7u %-13s %4.0f%%\n", n->name,
                   serving ? "serving" : state_name(n->state), age, devs, mem,
                   n->data_address[0] ? n->data_address : "-", n->running_sequences, kv,
                   n->busy_fraction * 100.0);
            /* GPU nodes: each GPU, the link summary (TP rule) and the link
             * matrix as `nvidia-smi topo -m` prints it, on lines of their own. */
            for (size_t d = 0; d < n->n_devices; d++) {
                const Strata__V1__Device *dv = n->devices[d];
                for (size_t g = 0; g < dv->n_gpus; g++) {
                    const Strata__V1__Gpu *gp = dv->gpus[g];
                    fmt_bytes(each, sizeof each, gp->memory_bytes);
                    printf("  gpu %zu: %s, %s, %s", g, gp->name, each, gp->pci_bus_id[0] ? gp->pci_bus_id : "-");
                    if (gp->n_links) printf(", NUMA %d", gp->numa_node);
                    printf("\n");
                }
                if (n->link_summary && n->link_summary[0]) printf("  links: %s\n", n->link_summary);
                if (dv->n_gpus && dv->gpus[0]->n_links == dv->n_gpus) {
                    const size_t cols = dv->n_gpus + n->n_nics;
#define CELL(i, text) printf((i) + 1 < cols ? " %-7s" : " %s\n", text)
                    printf("  %-8s", "topo");
                    for (size_t g = 0; g < dv->n_gpus; g++) CELL(g, fmt_gpu(each, sizeof each, g));
                    for (size_t k = 0; k < n->n_nics; k++) CELL(dv->n_gpus + k, n->nics[k]);
                    for (size_t g = 0; g < dv->n_gpus; g++) {
                        const Strata__V1__Gpu *gp = dv->gpus[g];
                        printf("  %-8s", fmt_gpu(each, sizeof each, g));
                        for (size_t j = 0; j < cols; j++)
                            CELL(j, j < gp->n_links ? gp->links[j] : j - gp->n_links < gp->n_nic_links ? gp->nic_links[j - gp->n_links] : "?");
                    }
#undef CELL
                }
            }
            if (!n->n_devices && n->link_summary && n->link_summary[0]) printf("  links: %s\n", n->link_summary);
        }
    }
    if (pl) protobuf_c_message_free_unpacked(&pl->base, NULL);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return EXIT_OK;
}

/* After placement set / auto: polls GetPlacement every 100 ms while the new
 * placement (epoch) loads, drawing a progress bar on stderr (the weights
 * loaded over all its stages, from PlacementReply.loading), until it serves
 * (exit 0) or is dropped because it failed to load (exit 1). At most 10 min. */
static int wait_loading(rpc_client *c, const opts *o, uint64_t epoch) {
    const int width = 30;
    /* \r frames only on a terminal; else one line when it starts loading. */
    const bool bar = !o->json && isatty(STDERR_FILENO);
    if (!o->json && !bar) fprintf(stderr, "loading placement epoch %llu\n", (unsigned long long)epoch);
    uint64_t last_total = 0;
    for (int it = 0; it < 6000; it++) {
        Strata__V1__GetPlacementRequest req = STRATA__V1__GET_PLACEMENT_REQUEST__INIT;
        Strata__V1__PlacementReply *r = NULL;
        int rc = unary(c, o, "GetPlacement", &req.base, &strata__v1__placement_reply__descriptor,
                       (ProtobufCMessage **)&r);
        if (rc) return rc;
        if (!r->pending || r->pending->epoch != epoch) {
            uint64_t cur = r->current ? r->current->epoch : 0;
            protobuf_c_message_free_unpacked(&r->base, NULL);
            if (cur == epoch && bar) { /* the final frame: everything loaded */
                char b[32];
                fmt_bytes(b, sizeof b, last_total);
                fprintf(stderr, "\rloading epoch %llu [", (unsigned long long)epoch);
                for (int k = 0; k < width; k++) fputc('#', stderr);
                fprintf(stderr, "] 100.0%% %s / %s", b, b);
            }
            if (bar) fprintf(stderr, "\n");
            if (cur == epoch) {
                if (!o->json) fprintf(stderr, "placement epoch %llu is serving\n", (unsigned long long)epoch);
                return EXIT_OK;
            }
            fprintf(stderr, "stratactl: placement epoch %llu failed to load (epoch %llu keeps serving); "
                    "see the coordinator's log\n", (unsigned long long)epoch, (unsigned long long)cur);
            return EXIT_SERVER;
        }
        uint64_t done = 0, total = 0;
        for (size_t i = 0; i < r->n_loading; i++) {
            done += r->loading[i]->bytes_loaded;
            total += r->loading[i]->bytes_total;
        }
        last_total = total;
        protobuf_c_message_free_unpacked(&r->base, NULL);
        if (bar) {
            double f = total ? (double)done / (double)total : 0.0;
            int fill = (int)(f * width + 0.5);
            char a[32], b[32];
            fmt_bytes(a, sizeof a, done);
            fmt_bytes(b, sizeof b, total);
            fprintf(stderr, "\rloading epoch %llu [", (unsigned long long)epoch);
            for (int k = 0; k < width; k++) fputc(k < fill ? '#' : '-', stderr);
            fprintf(stderr, "] %5.1f%% %s / %s", 100.0 * f, a, b);
            fflush(stderr);
        }
        usleep(100000);
    }
    fprintf(stderr, "%sstratactl: placement epoch %llu still loading after 600 s\n", bar ? "\n" : "",
            (unsigned long long)epoch);
    return EXIT_UNAVAILABLE;
}

static int placement_reply(rpc_client *c, const opts *o, const char *name,
                           const ProtobufCMessage *req) {
    Strata__V1__PlacementReply *r = NULL;
    int rc = unary(c, o, name, req, &strata__v1__placement_reply__descriptor,
                   (ProtobufCMessage **)&r);
    if (rc) return rc;
    if (o->json) print_json(&r->base);
    else print_placement(r);
    bool wait = strcmp(name, "GetPlacement") && !o->dry_run && r->pending;
    uint64_t epoch = r->pending ? r->pending->epoch : 0;
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return wait ? wait_loading(c, o, epoch) : EXIT_OK;
}

static int parse_uint(const char *s, const char *end, uint32_t *out) {
    if (s == end) return -1;
    uint64_t v = 0;
    for (const char *p = s; p < end; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (uint64_t)(*p - '0');
        if (v > 1000000) return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

/* "node-a:0-2,node-b:3-4" -> stages (node strings point into `buf`). */
static int parse_stages(char *buf, Strata__V1__Stage *st, Strata__V1__Stage **ptrs, size_t max,
                        size_t *n) {
    *n = 0;
    for (char *item = strtok(buf, ","); item; item = strtok(NULL, ",")) {
        char *colon = strrchr(item, ':');
        if (!colon || colon == item || *n == max)
            return usage_error("bad stage \"%s\" (want NODE:FIRST-LAST)", item);
        *colon = '\0';
        const char *range = colon + 1, *dash = strchr(range, '-');
        strata__v1__stage__init(&st[*n]);
        st[*n].node = item;
        const char *end = range + strlen(range);
        if (dash ? parse_uint(range, dash, &st[*n].first_layer) ||
                       parse_uint(dash + 1, end, &st[*n].last_layer)
                 : parse_uint(range, end, &st[*n].first_layer)) {
            *colon = ':';
            return usage_error("bad layer range in \"%s\" (want NODE:FIRST-LAST)", item);
        }
        if (!dash) st[*n].last_layer = st[*n].first_layer;
        ptrs[*n] = &st[*n];
        (*n)++;
    }
    if (*n == 0) return usage_error("%s", "--stages is empty");
    return 0;
}

static int cmd_placement(rpc_client *c, const opts *o) {
    const char *sub = o->n_words > 1 ? o->words[1] : "show";
    if (!strcmp(sub, "show")) {
        Strata__V1__GetPlacementRequest req = STRATA__V1__GET_PLACEMENT_REQUEST__INIT;
        return placement_reply(c, o, "GetPlacement", &req.base);
    }
    if (!strcmp(sub, "auto")) {
        Strata__V1__AutoPlacementRequest req = STRATA__V1__AUTO_PLACEMENT_REQUEST__INIT;
        req.dry_run = o->dry_run;
        return placement_reply(c, o, "AutoPlacement", &req.base);
    }
    if (!strcmp(sub, "set")) {
        if (!o->stages) return usage_error("%s", "placement set needs --stages NODE:A-B[,...]");
        char *buf = strdup(o->stages);
        Strata__V1__Stage st[256], *ptrs[256];
        size_t n = 0;
        int rc = parse_stages(buf, st, ptrs, 256, &n);
        if (rc == 0) {
            Strata__V1__SetPlacementRequest req = STRATA__V1__SET_PLACEMENT_REQUEST__INIT;
            req.stages = ptrs;
            req.n_stages = n;
            rc = placement_reply(c, o, "SetPlacement", &req.base);
        }
        free(buf);
        return rc;
    }
    return usage_error("unknown placement command \"%s\" (show, set, auto)", sub);
}

/* drain --wait: polls every 0.2 s until NODE holds no stage of the current
 * placement, no placement change is loading, and its last heartbeat reports
 * no running sequence; at most --timeout seconds (600): then exit 3. */
static int wait_drained(rpc_client *c, const opts *o, const char *node) {
    opts call = *o;
    call.timeout = 10.0; /* per call; o->timeout bounds the whole wait */
    double limit = o->timeout > 0 ? o->timeout : DRAIN_WAIT_S, t0 = st_now_s();
    const bool tty = !o->json && isatty(STDERR_FILENO);
    for (;;) {
        Strata__V1__PlacementReply *pl = get_placement(c, &call);
        if (!pl) return EXIT_UNAVAILABLE;
        bool staged = in_placement(pl->current, node), pending = pl->pending != NULL;
        protobuf_c_message_free_unpacked(&pl->base, NULL);
        Strata__V1__ListNodesRequest req = STRATA__V1__LIST_NODES_REQUEST__INIT;
        Strata__V1__ListNodesReply *r = NULL;
        int rc = unary(c, &call, "ListNodes", &req.base, &strata__v1__list_nodes_reply__descriptor,
                       (ProtobufCMessage **)&r);
        if (rc) return rc;
        uint32_t running = 0;
        for (size_t i = 0; i < r->n_nodes; i++)
            if (!strcmp(r->nodes[i]->name, node)) running = r->nodes[i]->running_sequences;
        protobuf_c_message_free_unpacked(&r->base, NULL);
        double t = st_now_s() - t0;
        if (!staged && !pending && running == 0) {
            if (tty) fprintf(stderr, "\n");
            if (!o->json) printf("%s: drained (no stage, no sequence) after %.1f s\n", node, t);
            return EXIT_OK;
        }
        if (tty) {
            fprintf(stderr, "\rwaiting for %s: %s, %s, %u sequence(s) [%.0f s]   ", node,
                    staged ? "holds a stage" : "no stage", pending ? "a placement is loading" : "nothing loading",
                    running, t);
            fflush(stderr);
        }
        if (t >= limit) {
            if (tty) fprintf(stderr, "\n");
            fprintf(stderr, "stratactl: drain --wait: %s still %s after %.0f s (--timeout)\n", node,
                    staged ? "holds a stage" : pending ? "waits for a placement change to load"
                                                       : "reports running sequences",
                    limit);
            return EXIT_UNAVAILABLE;
        }
        usleep(200000);
    }
}

/* drain and undrain (method "Drain" / "Undrain"). */
static int cmd_drain(rpc_client *c, const opts *o, const char *method) {
    Strata__V1__DrainRequest req = STRATA__V1__DRAIN_REQUEST__INIT;
    req.node = (char *)o->words[1];
    Strata__V1__DrainReply *r = NULL;
    int rc = unary(c, o, method, &req.base, &strata__v1__drain_reply__descriptor,
                   (ProtobufCMessage **)&r);
    if (rc) return rc;
    if (o->json) print_json(&r->base);
    else
        printf("%s: %s (placement epoch %llu)\n", r->node, state_name(r->state),
               (unsigned long long)r->placement_epoch);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return o->wait && !strcmp(method, "Drain") ? wait_drained(c, o, o->words[1]) : EXIT_OK;
}

/* node remove NODE (method "RemoveNode"). */
static int cmd_node_remove(rpc_client *c, const opts *o) {
    Strata__V1__RemoveNodeRequest req = STRATA__V1__REMOVE_NODE_REQUEST__INIT;
    req.node = (char *)o->words[2];
    Strata__V1__RemoveNodeReply *r = NULL;
    int rc = unary(c, o, "RemoveNode", &req.base, &strata__v1__remove_node_reply__descriptor,
                   (ProtobufCMessage **)&r);
    if (rc) return rc;
    if (o->json) print_json(&r->base);
    else
        printf("%s: removed (it was %s)\n", r->node,
               r->was ? state_name(r->was) : "known from the coordinator's state only");
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return EXIT_OK;
}

typedef struct gen_state {
    const opts *o;
    int bad;
    int any_text;
} gen_state;

static int on_chunk(const uint8_t *msg, size_t len, void *ud) {
    gen_state *g = ud;
    Strata__V1__GenerateChunk *ch = strata__v1__generate_chunk__unpack(NULL, len, msg);
    if (!ch) {
        g->bad = 1;
        return 1;
    }
    if (g->o->json) {
        json_t *j = pb_to_json(&ch->base);
        char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (s) printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        fputs(ch->text, stdout);
        if (ch->text[0]) g->any_text = 1;
    }
    fflush(stdout);
    strata__v1__generate_chunk__free_unpacked(ch, NULL);
    return 0;
}

static int cmd_generate(rpc_client *c, const opts *o) {
    Strata__V1__GenerateRequest req = STRATA__V1__GENERATE_REQUEST__INIT;
    req.prompt = (char *)o->words[1];
    req.max_tokens = (uint32_t)o->max_tokens;
    size_t len = strata__v1__generate_request__get_packed_size(&req);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return EXIT_SERVER;
    strata__v1__generate_request__pack(&req, buf);
    gen_state g = {o, 0, 0};
    rpc_status st;
    int rc = rpc_client_stream(c, SVC "Generate", buf, len, o->timeout > 0 ? o->timeout : 600.0,
                               on_chunk, &g, &st);
    free(buf);
    if (!o->json && g.any_text) putchar('\n');
    if (g.bad) {
        fprintf(stderr, "stratactl: Generate: a chunk does not decode as strata.v1.GenerateChunk\n");
        return EXIT_SERVER;
    }
    if (rc != 0) return status_exit("Generate", &st);
    return EXIT_OK;
}

/* ------------------------------------------------------------------ main */

/* HOST -> HOST:7070, [V6] -> [V6]:7070, a bare IPv6 address -> [V6]:7070;
 * a port must be 1..65535. 0, or the usage exit code (message printed). */
static int normalize_addr(const char **addr, char buf[300]) {
    const char *a = *addr, *port = NULL;
    if (a[0] == '[') {
        const char *close = strchr(a, ']');
        if (!close || close == a + 1) return usage_error("--addr \"%s\": an IPv6 address is [ADDR] or [ADDR]:PORT", a);
        if (close[1] == ':') port = close + 2;
        else if (close[1]) return usage_error("--addr \"%s\": an IPv6 address is [ADDR] or [ADDR]:PORT", a);
    } else {
        const char *colon = strchr(a, ':');
        if (colon && strchr(colon + 1, ':')) { /* a bare IPv6 address: no port */
            snprintf(buf, 300, "[%s]:%d", a, DEFAULT_PORT);
            *addr = buf;
            return 0;
        }
        if (colon == a) return usage_error("--addr \"%s\": no host", a);
        if (colon) port = colon + 1;
    }
    if (port) {
        char *end;
        errno = 0;
        long p = strtol(port, &end, 10);
        if (!*port || *end || errno || p < 1 || p > 65535)
            return usage_error("--addr \"%s\": the port must be a number in 1..65535", a);
        return 0;
    }
    if (strlen(a) + 8 >= 300) return usage_error("--addr \"%.64s...\": too long", a);
    snprintf(buf, 300, "%s:%d", a, DEFAULT_PORT);
    *addr = buf;
    return 0;
}

/* --addr A,B,...: each address normalized into o->addrs. */
static int split_addrs(opts *o) {
    if (strlen(o->addr) >= sizeof o->addr_arg) return usage_error("--addr \"%.64s...\": too long", o->addr);
    strcpy(o->addr_arg, o->addr);
    for (char *save = NULL, *a = strtok_r(o->addr_arg, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
        if (o->n_addrs == MAX_ADDRS) return usage_error("--addr: at most 8 coordinators, not \"%s\"", o->addr);
        o->addrs[o->n_addrs] = a;
        int rc = normalize_addr(&o->addrs[o->n_addrs], o->addr_buf[o->n_addrs]);
        if (rc) return rc;
        o->n_addrs++;
    }
    if (!o->n_addrs) return usage_error("--addr \"%s\": no address", o->addr);
    o->addr = o->addrs[0];
    return 0;
}

static int parse_args(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->addr = getenv("STRATACTL_ADDR");
    if (!o->addr || !*o->addr) o->addr = DEFAULT_ADDR;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--dry-run")) {
            o->dry_run = 1;
        } else if (!strcmp(a, "--wait")) {
            o->wait = 1;
        } else if (!strcmp(a, "--addr") || !strcmp(a, "--timeout") || !strcmp(a, "--stages") ||
                   !strcmp(a, "--max-tokens") || !strcmp(a, "--ca") || !strcmp(a, "--cert") || !strcmp(a, "--key")) {
            if (!val) return usage_error("%s needs a value", a);
            i++;
            char *end;
            if (!strcmp(a, "--addr")) {
                o->addr = val;
                if (!*val) return usage_error("%s", "--addr is empty");
            } else if (!strcmp(a, "--ca")) {
                o->tls.ca = val;
            } else if (!strcmp(a, "--cert")) {
                o->tls.cert = val;
            } else if (!strcmp(a, "--key")) {
                o->tls.key = val;
            } else if (!strcmp(a, "--stages")) {
                o->stages = val;
            } else if (!strcmp(a, "--timeout")) {
                errno = 0;
                o->timeout = strtod(val, &end);
                if (errno || *end || !(o->timeout > 0))
                    return usage_error("--timeout wants seconds > 0, not \"%s\"", val);
            } else {
                errno = 0;
                o->max_tokens = strtol(val, &end, 10);
                if (errno || *end || o->max_tokens < 1 || o->max_tokens > 1000000)
                    return usage_error("--max-tokens wants 1..1000000, not \"%s\"", val);
            }
        } else if (a[0] == '-' && a[1] != '\0') {
            return usage_error("unknown option \"%s\"", a);
        } else {
            if (o->n_words == 4) return usage_error("unexpected argument \"%s\"", a);
            o->words[o->n_words++] = a;
        }
    }
    if (o->n_words == 0) return usage_error("%s", "no command");
    if (!o->tls.ca) o->tls.ca = getenv("STRATA_CA");
    if (!o->tls.cert) o->tls.cert = getenv("STRATA_CERT");
    if (!o->tls.key) o->tls.key = getenv("STRATA_KEY");
    const char *cmd = o->words[0];
    int want_min = 1, want_max = 1;
    if (!strcmp(cmd, "placement")) want_max = 2;
    else if (!strcmp(cmd, "drain") || !strcmp(cmd, "undrain") || !strcmp(cmd, "generate"))
        want_min = want_max = 2;
    else if (!strcmp(cmd, "node"))
        want_min = want_max = 3;
    else if (strcmp(cmd, "status") && strcmp(cmd, "nodes"))
        return usage_error("unknown command \"%s\"", cmd);
    if (o->n_words < want_min)
        return usage_error("%s needs an argument", cmd);
    if (o->n_words > want_max) return usage_error("too many arguments for %s", cmd);
    if (!strcmp(cmd, "generate") && !o->words[1][0])
        return usage_error("%s", "generate needs a non-empty PROMPT");
    if (!strcmp(cmd, "node") && strcmp(o->words[1], "remove"))
        return usage_error("unknown command \"node %s\" (node remove NODE)", o->words[1]);
    if (o->wait && strcmp(cmd, "drain")) return usage_error("%s", "--wait goes with drain only");
    return split_addrs(o);
}

/* With several --addr: the client of the first coordinator that answers
 * GetStatus (the leader; a standby answers UNAVAILABLE naming it), with
 * o->addr set to it; NULL after printing why each one did not (exit 3). */
static rpc_client *find_leader(opts *o, const rpc_tls *tls) {
    Strata__V1__GetStatusRequest req = STRATA__V1__GET_STATUS_REQUEST__INIT;
    uint8_t buf[16];
    size_t len = protobuf_c_message_pack(&req.base, buf);
    double t = o->timeout > 0 && o->timeout < PROBE_S ? o->timeout : PROBE_S;
    char why[MAX_ADDRS][600]; /* st_err and rpc_status messages are 512 */
    for (int i = 0; i < o->n_addrs; i++) {
        st_err err = {{0}};
        rpc_client *c = rpc_client_create(o->addrs[i], tls, &err);
        if (!c) {
            snprintf(why[i], sizeof why[i], "%s", err.msg);
            continue;
        }
        uint8_t *rep = NULL;
        size_t rlen = 0;
        rpc_status st;
        int rc = rpc_client_unary(c, SVC "GetStatus", buf, len, t, &rep, &rlen, &st);
        free(rep);
        if (rc == 0) {
            o->addr = o->addrs[i];
            return c;
        }
        snprintf(why[i], sizeof why[i], "%s: %s", rpc_code_name(st.code), st.msg);
        rpc_client_destroy(c);
    }
    fprintf(stderr, "stratactl: none of the %d coordinators answers as the leader:\n", o->n_addrs);
    for (int i = 0; i < o->n_addrs; i++) fprintf(stderr, "  %s: %s\n", o->addrs[i], why[i]);
    return NULL;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage_text, stdout);
            return EXIT_OK;
        }
        if (!strcmp(argv[i], "--version")) {
            st_version_print(stdout, "stratactl");
            return EXIT_OK;
        }
    }
    opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    ctl_addr = o.addr;
    st_err err;
    int tls = rpc_tls_given(&o.tls, "--", &err);
    if (tls < 0) {
        fprintf(stderr, "stratactl: %s (or $STRATA_CA, $STRATA_CERT, $STRATA_KEY)\n", err.msg);
        return EXIT_USAGE;
    }
    if (tls)
        unavailable_hint = " (mutual TLS: a refused handshake looks the same; check that the coordinator's "
                           "certificate is from --ca and names the --addr host, and that --cert is from the "
                           "same CA)";
    rpc_client *c;
    if (o.n_addrs > 1) {
        if (!(c = find_leader(&o, tls ? &o.tls : NULL))) return EXIT_UNAVAILABLE;
        ctl_addr = o.addr;
    } else if (!(c = rpc_client_create(o.addr, tls ? &o.tls : NULL, &err))) {
        fprintf(stderr, "stratactl: %s\n", err.msg);
        return tls ? EXIT_USAGE : EXIT_UNAVAILABLE;
    }
    const char *cmd = o.words[0];
    if (!strcmp(cmd, "status")) rc = cmd_status(c, &o);
    else if (!strcmp(cmd, "nodes")) rc = cmd_nodes(c, &o);
    else if (!strcmp(cmd, "placement")) rc = cmd_placement(c, &o);
    else if (!strcmp(cmd, "drain")) rc = cmd_drain(c, &o, "Drain");
    else if (!strcmp(cmd, "undrain")) rc = cmd_drain(c, &o, "Undrain");
    else if (!strcmp(cmd, "node")) rc = cmd_node_remove(c, &o);
    else rc = cmd_generate(c, &o);
    rpc_client_destroy(c);
    return rc;
}

/* test_placement.c — the live-mode placement rules (coordinator/control/placement.h),
 * the registry's states and failure detection (coordinator/control/registry.h) with
 * a driven clock, and the state file round trip (coordinator/control/state_file.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fcntl.h>
#include <sys/stat.h>

#include "coordinator/control/journal.h"
#include "coordinator/control/placement.h"
#include "coordinator/control/registry.h"
#include "coordinator/control/state_file.h"
#include "rpc/rpc_code.h"
#include "tests/testutil.h"

#define MIB (1ull << 20)

static place_model model5(void) {
    place_model m;
    memset(&m, 0, sizeof m);
    m.n_layers = 5;
    for (int l = 0; l < 5; l++) m.layer_bytes[l] = 100000;
    m.embd_bytes = 50000;
    m.head_bytes = 60000;
    m.kv_bytes_per_layer = MIB; /* a layer costs 1 MiB + 100000 */
    return m;
}

static void test_auto(void) {
    place_model m = model5();
    placement p;
    int code = 0;
    st_err err = {{0}};
    /* equal nodes: vLLM's even split, remainder to the earlier stages (2,2,1) */
    place_node eq[3] = {{"a", 1ull << 30, 1}, {"b", 1ull << 30, 1}, {"c", 1ull << 30, 1}};
    CHECK(place_auto(&m, eq, 3, &p, &code, &err) == 0);
    CHECK_EQ_INT(p.n_stages, 3);
    CHECK_EQ_INT(p.st[0].first, 0);
    CHECK_EQ_INT(p.st[0].last, 1);
    CHECK_EQ_INT(p.st[1].last, 3);
    CHECK_EQ_INT(p.st[2].first, 4);
    CHECK_EQ_INT(p.st[2].last, 4);
    CHECK_EQ_STR(p.st[2].node, "c");
    /* proportional to memory: a has 3x b's room -> 4 and 1 (within what fits) */
    place_node pr[2] = {{"a", 6 * MIB, 1}, {"b", 2 * MIB, 2}};
    CHECK(place_auto(&m, pr, 2, &p, &code, &err) == 0);
    CHECK_EQ_INT(p.n_stages, 2);
    CHECK_EQ_INT(p.st[0].last, 3);
    CHECK_EQ_INT(p.st[1].first, 4);
    CHECK_EQ_INT(p.st[1].tp, 2);
    /* a node too small for one layer gets no stage */
    place_node sm[3] = {{"a", 1ull << 30, 1}, {"b", 1ull << 30, 1}, {"tiny", MIB / 2, 1}};
    CHECK(place_auto(&m, sm, 3, &p, &code, &err) == 0);
    CHECK_EQ_INT(p.n_stages, 2);
    /* does not fit: the message says by how much */
    place_node few[2] = {{"a", 2 * MIB, 1}, {"b", 2 * MIB, 1}};
    CHECK(place_auto(&m, few, 2, &p, &code, &err) != 0);
    CHECK_EQ_INT(code, RPC_RESOURCE_EXHAUSTED);
    CHECK_MSG(strstr(err.msg, "short by") != NULL, "%s", err.msg);
    CHECK(place_auto(&m, few, 0, &p, &code, &err) != 0);
    CHECK_EQ_INT(code, RPC_FAILED_PRECONDITION);
    /* more nodes than layers: 5 stages of one layer */
    place_node many[7];
    char names[7][16];
    for (int i = 0; i < 7; i++) {
        snprintf(names[i], sizeof names[i], "n%d", i);
        many[i] = (place_node){names[i], 1ull << 30, 1};
    }
    CHECK(place_auto(&m, many, 7, &p, &code, &err) == 0);
    CHECK_EQ_INT(p.n_stages, 5);
}

static void test_explicit(void) {
    place_model m = model5();
    place_node nodes[2] = {{"a", 1ull << 30, 1}, {"small", 3 * MIB, 1}};
    placement p;
    int code;
    st_err err = {{0}};
    place_stage ok[2] = {{"a", 0, 2, 0}, {"small", 3, 4, 0}};
    CHECK(place_check_explicit(&m, nodes, 2, ok, 2, &p, &code, &err) == 0);
    CHECK_EQ_INT(p.st[1].tp, 1);
    place_stage unknown[1] = {{"zz", 0, 4, 0}};
    CHECK(place_check_explicit(&m, nodes, 2, unknown, 1, &p, &code, &err) != 0);
    CHECK_EQ_INT(code, RPC_NOT_FOUND);
    CHECK(strstr(err.msg, "unknown node \"zz\"") != NULL);
    place_stage overlap[2] = {{"a", 0, 2, 0}, {"small", 2, 4, 0}};
    CHECK(place_check_explicit(&m, nodes, 2, overlap, 2, &p, &code, &err) != 0);
    CHECK_EQ_INT(code, RPC_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "layer 2 is covered twice") != NULL, "%s", err.msg);
    place_stage gap[2] = {{"a", 0, 1, 0}, {"small", 3, 4, 0}};
    CHECK(place_check_explicit(&m, nodes, 2, gap, 2, &p, &code, &err) != 0);
    CHECK_MSG(strstr(err.msg, "layers 2-2 are not covered") != NULL, "%s", err.msg);
    place_stage tail[1] = {{"a", 0, 3, 0}};
    CHECK(place_check_explicit(&m, nodes, 2, tail, 1, &p, &code, &err) != 0);
    CHECK_MSG(strstr(err.msg, "layers 4-4 are not covered") != NULL, "%s", err.msg);
    place_stage big[2] = {{"a", 0, 0, 0}, {"small", 1, 4, 0}};
    CHECK(place_check_explicit(&m, nodes, 2, big, 2, &p, &code, &err) != 0);
    CHECK_EQ_INT(code, RPC_RESOURCE_EXHAUSTED);
    CHECK_MSG(strstr(err.msg, "small") && strstr(err.msg, "short by"), "%s", err.msg);
    place_stage twice[2] = {{"a", 0, 1, 0}, {"a", 2, 4, 0}};
    CHECK(place_check_explicit(&m, nodes, 2, twice, 2, &p, &code, &err) != 0);
    /* stage memory: embedding on the first, head on the last */
    CHECK(place_stage_bytes(&m, 0, 4, 5) == 5 * (MIB + 100000) + 50000 + 60000);
    CHECK(place_stage_bytes(&m, 1, 2, 5) == 2 * (MIB + 100000));
}

static void test_registry(void) {
    registry r;
    registry_init(&r, 100, 3, 1000, 42);
    st_err err = {{0}};
    uint64_t lease = 0;
    reg_info in = {"n1", "cpu", 4, MIB, 4 * MIB, 1, "127.0.0.1:5000", 0, NULL, 0, NULL};
    CHECK(registry_register(&r, &in, 10.0, &lease, &err) == 0);
    CHECK(lease != 0);
    reg_node *n = registry_find(&r, "n1");
    CHECK_EQ_INT(n->state, REG_REGISTERED);
    CHECK_EQ_INT(registry_heartbeat(&r, "n1", lease, NULL, 10.1), 0);
    CHECK_EQ_INT(n->state, REG_READY);
    CHECK_EQ_INT(registry_heartbeat(&r, "n1", lease + 1, NULL, 10.1), 1); /* unknown lease */
    CHECK_EQ_INT(registry_heartbeat(&r, "nope", lease, NULL, 10.1), 1);
    registry_tick(&r, 10.35);
    CHECK_EQ_INT(n->state, REG_READY); /* 2.5 intervals missed */
    registry_tick(&r, 10.45);
    CHECK_EQ_INT(n->state, REG_SUSPECT); /* > 3 intervals */
    CHECK_EQ_INT((int)registry_missed(&r, n, 10.45), 3);
    registry_tick(&r, 11.05);
    CHECK_EQ_INT(n->state, REG_SUSPECT);
    registry_tick(&r, 11.11);
    CHECK_EQ_INT(n->state, REG_DEAD); /* > 1000 ms */
    CHECK_EQ_INT(registry_heartbeat(&r, "n1", lease, NULL, 11.2), 1); /* lease revoked: reregister */
    uint64_t lease2 = 0;
    CHECK(registry_register(&r, &in, 11.3, &lease2, &err) == 0);
    CHECK(lease2 != lease && lease2 != 0);
    CHECK_EQ_INT(registry_heartbeat(&r, "n1", lease2, NULL, 11.4), 0);
    CHECK_EQ_INT(n->state, REG_READY);
    reg_info bad = {"", "cpu", 1, 1, 1, 1, "x:1", 0, NULL, 0, NULL};
    CHECK(registry_register(&r, &bad, 12, &lease, &err) != 0);
    reg_info noaddr = {"n2", "cpu", 1, 1, 1, 1, "", 0, NULL, 0, NULL};
    CHECK(registry_register(&r, &noaddr, 12, &lease, &err) != 0);

    /* undrain: only a DRAINING node goes back to READY */
    CHECK(registry_undrain(&r, "n1", &err) == -1); /* ready */
    CHECK_EQ_STR(err.msg, "n1 is ready, not draining");
    CHECK(registry_undrain(&r, "nope", &err) == -1);
    CHECK_EQ_STR(err.msg, "unknown node \"nope\"");
    n->state = REG_DRAINING;
    CHECK(!registry_usable(n));
    CHECK(registry_heartbeat(&r, "n1", lease2, NULL, 11.5) == 0 && n->state == REG_DRAINING);
    CHECK(registry_undrain(&r, "n1", &err) == 0);
    CHECK_EQ_INT(n->state, REG_READY);
    CHECK(registry_usable(n));
    registry_tick(&r, 11.85); /* the timeouts apply again: 3 intervals missed since 11.5 */
    CHECK_EQ_INT(n->state, REG_SUSPECT);
    CHECK(registry_heartbeat(&r, "n1", lease2, NULL, 11.9) == 0 && n->state == REG_READY);

    /* state file round trip */
    char path[] = "/tmp/strata-state-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    placement p;
    memset(&p, 0, sizeof p);
    p.epoch = 7;
    p.n_layers = 5;
    p.n_stages = 2;
    p.st[0] = (place_stage){"n1", 0, 2, 1};
    p.st[1] = (place_stage){"n9", 3, 4, 2};
    CHECK(state_save(path, &p, 9, "abc", &r, &err) == 0);
    registry r2;
    registry_init(&r2, 100, 3, 1000, 1);
    placement q;
    uint64_t last = 0;
    CHECK(state_load(path, &q, &last, "abc", &r2, &err) == 0);
    CHECK(q.epoch == 7 && last == 9 && q.n_stages == 2 && q.st[1].last == 4 && q.st[1].tp == 2);
    CHECK_EQ_STR(q.st[1].node, "n9");
    CHECK(r2.n == 1 && !strcmp(r2.nodes[0].data_address, "127.0.0.1:5000") && r2.nodes[0].state == 0);
    registry_free(&r2);
    registry_init(&r2, 100, 3, 1000, 1);
    CHECK(state_load(path, &q, &last, "other", &r2, &err) == -1); /* another model */
    FILE *f = fopen(path, "w");
    fputs("{\"epoch\": 1", f);
    fclose(f);
    CHECK(state_load(path, &q, &last, "abc", &r2, &err) == -1);
    unlink(path);
    CHECK(state_load(path, &q, &last, "abc", &r2, &err) == 1);
    registry_free(&r2);
    registry_free(&r);
}

/* The hash index across growth and removal (backward-shift deletion). */
static void test_registry_many(void) {
    registry r;
    registry_init(&r, 1000, 3, 10000, 7);
    st_err err = {{0}};
    char name[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(name, sizeof name, "node-%05d", i);
        uint64_t lease;
        reg_info in = {name, "cpu", 1, MIB, MIB, 1, "127.0.0.1:1", 0, NULL, 0, NULL};
        if (registry_register(&r, &in, 1.0, &lease, &err) != 0) CHECK(0);
    }
    CHECK_EQ_INT(r.n, 5000);
    /* remove every third node */
    for (int i = 0; i < 5000; i += 3) {
        snprintf(name, sizeof name, "node-%05d", i);
        CHECK_EQ_INT(registry_remove(&r, name), 0);
    }
    CHECK_EQ_INT(registry_remove(&r, "node-00000"), 1); /* already gone */
    int found = 0, wrong = 0;
    for (int i = 0; i < 5000; i++) {
        snprintf(name, sizeof name, "node-%05d", i);
        reg_node *n = registry_find(&r, name);
        if (i % 3 == 0) wrong += n != NULL;
        else if (n && !strcmp(n->name, name)) found++;
        else wrong++;
    }
    CHECK_EQ_INT(found, 5000 - 1667);
    CHECK_EQ_INT(wrong, 0);
    CHECK_EQ_INT(r.n, 5000 - 1667);
    /* a removed node that registers again is new */
    uint64_t lease;
    reg_info again = {"node-00003", "cpu", 1, MIB, MIB, 1, "127.0.0.1:2", 0, NULL, 0, NULL};
    CHECK(registry_register(&r, &again, 2.0, &lease, &err) == 0);
    CHECK(registry_find(&r, "node-00003")->registrations == 1);
    registry_free(&r);
}

static int count_rec(const char *payload, size_t len, void *ud, st_err *err) {
    (void)err;
    int *n = ud;
    char want[32];
    snprintf(want, sizeof want, "record %d", *n);
    if (len == strlen(want) && !memcmp(payload, want, len)) (*n)++;
    return 0;
}

/* Journal: replay, a torn tail cut off (and appends continue after it), a
 * corrupt checksum. */
static void test_journal(void) {
    char path[] = "/tmp/strata-journal-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    st_err err = {{0}};
    int n = 0;
    journal *j = journal_open(path, count_rec, &n, &err);
    CHECK(j != NULL);
    for (int i = 0; i < 10; i++) {
        char rec[32];
        snprintf(rec, sizeof rec, "record %d", i);
        CHECK_EQ_INT(journal_append(j, rec, strlen(rec), &err), 0);
    }
    CHECK_EQ_INT(journal_sync(j, &err), 0);
    CHECK_EQ_INT(journal_append(j, "", 0, &err), -1);
    journal_close(j);
    struct stat st;
    CHECK_EQ_INT(stat(path, &st), 0);
    long whole = (long)st.st_size;
    /* torn: cut the last record in half */
    CHECK_EQ_INT(truncate(path, whole - 4), 0);
    n = 0;
    j = journal_open(path, count_rec, &n, &err);
    CHECK(j != NULL);
    CHECK_EQ_INT(n, 9);
    CHECK_EQ_INT((int)journal_records(j), 9);
    CHECK_EQ_INT(journal_append(j, "record 9", 8, &err), 0);
    journal_close(j);
    n = 0;
    j = journal_open(path, count_rec, &n, &err);
    CHECK_EQ_INT(n, 10);
    journal_close(j);
    /* a flipped payload byte in record 5: records 0..4 stay */
    fd = open(path, O_RDWR);
    long rec5 = 5 * (8 + 8) + 8 + 3;
    CHECK(pwrite(fd, "X", 1, rec5) == 1);
    close(fd);
    n = 0;
    j = journal_open(path, count_rec, &n, &err);
    CHECK_EQ_INT(n, 5);
    CHECK_EQ_INT(journal_reset(j, &err), 0);
    journal_close(j);
    CHECK_EQ_INT(stat(path, &st), 0);
    CHECK_EQ_INT((int)st.st_size, 0);
    unlink(path);
}

/* The seed's TP rule per node (place_node_tp) and the registry keeping what
 * a GPU worker reported (link summary, GPUs). */
static void test_node_tp(void) {
    CHECK_EQ_INT(place_node_tp("cpu", 16, 0), 1);
    CHECK_EQ_INT(place_node_tp("cuda", 8, 8), 8);  /* NVSwitch node */
    CHECK_EQ_INT(place_node_tp("cuda", 8, 2), 2);  /* PCIe-only 8-GPU box: not 8 */
    CHECK_EQ_INT(place_node_tp("cuda", 8, 0), 2);  /* links not reported: the PCIe bound */
    CHECK_EQ_INT(place_node_tp("cuda", 1, 0), 1);
    CHECK_EQ_INT(place_node_tp("cuda", 4, 8), 4);  /* never more than its GPUs */
    registry r;
    registry_init(&r, 1000, 3, 10000, 1);
    reg_gpu g[2] = {{"NVIDIA H100 80GB HBM3", 85899345920ull, "0000:17:00.0"},
                    {"NVIDIA H100 80GB HBM3", 85899345920ull, "0000:2a:00.0"}};
    reg_info in = {"gpu-a", "cuda", 2, 85899345920ull, 4 * MIB, 2, "127.0.0.1:7001", 2, "2 GPU, TP<=2 (2 of 2 GPUs NVLinked (NV18 or more)); no NIC", 2, g};
    uint64_t lease;
    st_err err;
    CHECK_EQ_INT(registry_register(&r, &in, 1.0, &lease, &err), 0);
    const reg_node *n = registry_find(&r, "gpu-a");
    REQUIRE(n);
    CHECK_EQ_INT((int)n->tp_limit, 2);
    CHECK_EQ_INT(n->n_gpus, 2);
    CHECK_EQ_STR(n->gpus[1].pci_bus_id, "0000:2a:00.0");
    CHECK(strstr(n->link_summary, "NVLinked") != NULL);
    CHECK_EQ_INT(place_node_tp(n->device_kind, n->device_count, n->tp_limit), 2);
    registry_free(&r);
}

int main(void) {
    test_node_tp();
    test_auto();
    test_explicit();
    test_registry();
    test_registry_many();
    test_journal();
    return test_summary();
}

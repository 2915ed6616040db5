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
    place_node eq[3] = {{"a", 1ull << 30, 1, 0}, {"b", 1ull << 30, 1, 0}, {"c", 1ull << 30, 1, 0}};
    CHECK(place_auto(&m, eq, 3, &p, &code, &err) == 0);
    CHECK_EQ_INT(p.n_stages, 3);
    CHECK_EQ_INT(p.st[0].first, 0);
    CHECK_EQ_INT(p.st[0].last, 1);
    CHECK_EQ_INT(p.st[1].last, 3);
    CHECK_EQ_INT(p.st[2].first, 4);
    CHECK_EQ_INT(p.st[2].last, 4);
    CHECK_EQ_STR(p.st[2].node, "c");
    /* proportional to memory: a has 3x b's room -> 4 and 1 (within what fits) */
    place_node pr[2] = {{"a", 6 * MIB, 1, 0}, {"b", 2 * MIB, 2, 0}};
    CHECK(place_auto(&m, pr, 2, &p, &code, &err) == 0);
    CHECK_EQ_INT(p.n_stages, 2);
    CHECK_EQ_INT(p.st[0].last, 3);
    CHECK_EQ_INT(p.st[1].first, 4);
    CHECK_EQ_INT(p.st[1].tp, 2);
    /* a node too small for one layer gets no stage */
    place_node sm[3] = {{"a", 1ull << 30, 1, 0}, {"b", 1ull << 30, 1, 0}, {"tiny", MIB / 2, 1, 0}};
    CHECK(place_auto(&m, sm, 3, &p, &code, &err) == 0);
    CHECK_EQ_INT(p.n_stages, 2);
    /* does not fit: the message says by how much */
    place_node few[2] = {{"a", 2 * MIB, 1, 0}, {"b", 2 * MIB, 1, 0}};
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
        many[i] = (place_node){names[i], 1ull << 30, 1, 0};
    }
    CHECK(place_auto(&m, many, 7, &p, &code, &err) == 0);
    CHECK_EQ_INT(p.n_stages, 5);
}

static void test_explicit(void) {
    place_model m = model5();
    place_node nodes[2] = {{"a", 1ull << 30, 1, 0}, {"small", 3 * MIB, 1, 0}};
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
    reg_info in = {"n1", "cpu", 4, MIB, 4 * MIB, 1, "127.0.0.1:5000", 0, NULL, 0, NULL, NULL};
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
    reg_info bad = {"", "cpu", 1, 1, 1, 1, "x:1", 0, NULL, 0, NULL, NULL};
    CHECK(registry_register(&r, &bad, 12, &lease, &err) != 0);
    reg_info noaddr = {"n2", "cpu", 1, 1, 1, 1, "", 0, NULL, 0, NULL, NULL};
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
        reg_info in = {name, "cpu", 1, MIB, MIB, 1, "127.0.0.1:1", 0, NULL, 0, NULL, NULL};
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
    reg_info again = {"node-00003", "cpu", 1, MIB, MIB, 1, "127.0.0.1:2", 0, NULL, 0, NULL, NULL};
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
    reg_gpu g[2] = {{"NVIDIA H100 80GB HBM3", 85899345920ull, "0000:17:00.0", 0},
                    {"NVIDIA H100 80GB HBM3", 85899345920ull, "0000:2a:00.0", 1}};
    reg_links *lk = calloc(1, sizeof *lk);
    REQUIRE(lk);
    lk->n_nic = 1;
    snprintf(lk->nic[0], sizeof lk->nic[0], "mlx5_0");
    snprintf(lk->gg[0][0], REG_LINK_CELL, "X");
    snprintf(lk->gg[0][1], REG_LINK_CELL, "NV18");
    snprintf(lk->gg[1][0], REG_LINK_CELL, "NV18");
    snprintf(lk->gg[1][1], REG_LINK_CELL, "X");
    snprintf(lk->gn[0][0], REG_LINK_CELL, "PIX");
    snprintf(lk->gn[1][0], REG_LINK_CELL, "SYS");
    reg_info in = {"gpu-a", "cuda", 2, 85899345920ull, 4 * MIB, 2, "127.0.0.1:7001", 2, "2 GPU, TP<=2 (2 of 2 GPUs NVLinked (NV18 or more)); no NIC", 2, g, lk};
    uint64_t lease;
    st_err err;
    CHECK_EQ_INT(registry_register(&r, &in, 1.0, &lease, &err), 0);
    free(lk); /* copied */
    const reg_node *n = registry_find(&r, "gpu-a");
    REQUIRE(n);
    REQUIRE(n->links);
    CHECK_EQ_STR(n->links->gg[1][0], "NV18");
    CHECK_EQ_STR(n->links->gn[1][0], "SYS");
    CHECK_EQ_STR(n->links->nic[0], "mlx5_0");
    CHECK_EQ_INT(n->gpus[1].numa, 1);
    /* the cell classes Register accepts */
    CHECK(reg_link_valid("X") && reg_link_valid("NV1") && reg_link_valid("NV18") && reg_link_valid("PIX") &&
          reg_link_valid("PXB") && reg_link_valid("PHB") && reg_link_valid("NODE") && reg_link_valid("SYS"));
    CHECK(!reg_link_valid("") && !reg_link_valid("NV") && !reg_link_valid("NV0") && !reg_link_valid("NV100") &&
          !reg_link_valid("pix") && !reg_link_valid("NVx") && !reg_link_valid("SYS "));
    CHECK_EQ_INT((int)n->tp_limit, 2);
    CHECK_EQ_INT(n->n_gpus, 2);
    CHECK_EQ_STR(n->gpus[1].pci_bus_id, "0000:2a:00.0");
    CHECK(strstr(n->link_summary, "NVLinked") != NULL);
    CHECK_EQ_INT(place_node_tp(n->device_kind, n->device_count, n->tp_limit), 2);
    /* registering again without a matrix drops it; removal frees it (ASan) */
    in.links = NULL;
    CHECK_EQ_INT(registry_register(&r, &in, 2.0, &lease, &err), 0);
    CHECK(registry_find(&r, "gpu-a")->links == NULL);
    in.links = calloc(1, sizeof(reg_links));
    REQUIRE(in.links);
    CHECK_EQ_INT(registry_register(&r, &in, 3.0, &lease, &err), 0);
    free((void *)in.links);
    CHECK(registry_find(&r, "gpu-a")->links != NULL);
    CHECK_EQ_INT(registry_remove(&r, "gpu-a"), 0);
    in.name = "gpu-b";
    in.links = NULL;
    CHECK_EQ_INT(registry_register(&r, &in, 3.0, &lease, &err), 0);
    registry_free(&r);
}

/* A llama-3-8b-shaped model as control/model_info.c sees it (bf16
 * weights, f32 norms; [cluster] defaults: 1024 KV blocks of 16 tokens,
 * max_batch_tokens 512, max_seqs 64). */
static place_model model_8b(void) {
    place_model m;
    memset(&m, 0, sizeof m);
    const uint64_t E = 4096, H = 32, KVH = 8, HD = 128, FF = 14336, V = 128256;
    m.n_layers = 32;
    for (int l = 0; l < 32; l++)
        m.layer_bytes[l] = (2 * E * H * HD + 2 * E * KVH * HD + 3 * FF * E) * 2 + 2 * E * 4;
    m.embd_bytes = V * E * 2;
    m.head_bytes = V * E * 2 + E * 4;
    m.kv_bytes_per_layer = 1024ull * 16 * 2 * KVH * HD * 4;
    m.act_tokens = 512;
    m.act_token_rank = 3 * E * 4;
    m.act_token_split = (2 * H * HD + 2 * KVH * HD + 2 * FF) * 4;
    m.logits_bytes = 64 * (V + E) * 4;
    return m;
}

/* The memory model (placement.h): weights + KV + activations per stage
 * against each node's GPU memory at the stage's TP. */
static void test_memory_model(void) {
    place_model m = model_8b();
    CHECK(m.layer_bytes[0] == 436240384ull);
    CHECK(m.kv_bytes_per_layer == 134217728ull); /* 128 MiB */
    /* the whole model on one stage: weights 16.06 GiB + KV 4 GiB + activations */
    CHECK(place_stage_bytes(&m, 0, 31, 32) == 20356022272ull);
    CHECK(place_stage_need(&m, 0, 31, 32, 1) == 20356022272ull + 104857600ull + 33882112ull);
    /* TP 2: x/xn/o on both ranks (+ 512 * 49152 bytes) */
    CHECK(place_stage_need(&m, 0, 31, 32, 2) == 20356022272ull + 130023424ull + 33882112ull);
    /* a middle stage has no embedding, head or logits */
    CHECK(place_stage_need(&m, 8, 15, 32, 1) == 8ull * (436240384ull + 134217728ull) + 104857600ull);
    /* tied head: the last stage holds token_embd too, unless it is the first */
    place_model t = m;
    t.head_tied = true;
    t.head_bytes = 4096 * 4;
    CHECK(place_stage_bytes(&t, 16, 31, 32) == 16ull * 570458112ull + 16384 + 1050673152ull);
    CHECK(place_stage_bytes(&t, 0, 31, 32) == 32ull * 570458112ull + 16384 + 1050673152ull);

    /* nodes from what they registered: one GPU's memory * 0.9, TP by the link rule */
    place_node h100 = place_node_make("h100", "cuda", 8, 85899345920ull, 1ull << 40, 8, 0.9);
    CHECK_EQ_INT(h100.tp, 8);
    CHECK_EQ_INT(h100.devices, 8);
    CHECK(h100.memory == 77309411328ull); /* 72 GiB */
    CHECK(place_node_capacity(&h100, 8) == 8 * 77309411328ull);
    CHECK(place_node_capacity(&h100, 9) == 0);
    place_node cpu = place_node_make("cpu", "cpu", 32, 0, 64ull << 30, 0, 0.9);
    CHECK_EQ_INT(cpu.tp, 1);
    CHECK_EQ_INT(cpu.devices, 0);
    CHECK(place_node_capacity(&cpu, 4) == 64ull << 30); /* ranks are threads of one process */
    place_node bad_util = place_node_make("x", "cuda", 1, 1000, 0, 0, 0);
    CHECK(bad_util.memory == 900); /* the default 0.90 */

    /* A PCIe-only box of 4 x 10 GiB: TP 2 by the rule, so a stage gets two
     * GPUs (18 GiB usable), not four: the 8B model does not fit on it alone. */
    place_node pcie = place_node_make("pcie", "cuda", 4, 10ull << 30, 1ull << 40, 0, 0.9);
    CHECK_EQ_INT(pcie.tp, 2);
    placement p;
    int code = 0;
    st_err err = {{0}};
    CHECK(place_auto(&m, &pcie, 1, &p, &code, &err) != 0);
    CHECK_EQ_INT(code, RPC_RESOURCE_EXHAUSTED);
    /* needs 20356022272 + 130023424 + 33882112 = 19.11 GiB; offers 18.00 GiB */
    CHECK_MSG(strstr(err.msg, "needs 19.11 GiB") && strstr(err.msg, "offer 18.00 GiB") &&
                  strstr(err.msg, "short by 1.11 GiB"),
              "%s", err.msg);
    /* Two such boxes: each stage at TP 2 within 18 GiB; the first has the
     * embedding, the last the head and logits: 16.0 and 15.9 layers of room
     * -> 16 + 15, the remaining layer to the earlier stage. */
    place_node two[2] = {place_node_make("pcie-a", "cuda", 4, 10ull << 30, 1ull << 40, 0, 0.9),
                         place_node_make("pcie-b", "cuda", 4, 10ull << 30, 1ull << 40, 0, 0.9)};
    CHECK(place_auto(&m, two, 2, &p, &code, &err) == 0);
    CHECK_EQ_INT(p.n_stages, 2);
    CHECK_EQ_INT(p.st[0].last, 16);
    CHECK_EQ_INT(p.st[1].first, 17);
    CHECK(place_stage_need(&m, 0, 16, 32, 2) <= place_node_capacity(&two[0], 2));
    CHECK_EQ_INT(p.st[0].tp, 2);
    CHECK_EQ_INT(p.st[1].tp, 2);
    /* By GPU memory: an 8 x 80 GiB node beside a 1 x 24 GiB node takes the
     * layers in proportion (the small node gets what fits: 38 GiB vs 576 GiB). */
    place_node mixed[2] = {h100, place_node_make("l4", "cuda", 1, 24ull << 30, 1ull << 40, 0, 0.9)};
    CHECK(place_auto(&m, mixed, 2, &p, &code, &err) == 0);
    CHECK_EQ_INT(p.n_stages, 2);
    CHECK_EQ_STR(p.st[0].node, "h100");
    CHECK_EQ_INT(p.st[0].tp, 8);
    CHECK_EQ_INT(p.st[1].tp, 1);
    CHECK(place_stage_need(&m, p.st[1].first, p.st[1].last, 32, 1) <= place_node_capacity(&mixed[1], 1));
    /* 574.8 GiB vs 20.5 GiB left for layers: 30.9 -> 30 and 1.1 -> 1, the
     * remaining layer to the earlier stage */
    CHECK_EQ_INT(p.st[0].last, 30);
    CHECK_EQ_INT(p.st[1].first, 31);
    /* A stage that fits nowhere: a 512 MiB GPU cannot hold one layer + activations. */
    place_node tiny = place_node_make("tiny", "cuda", 1, 512ull << 20, 1ull << 40, 0, 0.9);
    CHECK(place_auto(&m, &tiny, 1, &p, &code, &err) != 0);
    CHECK_EQ_INT(code, RPC_RESOURCE_EXHAUSTED);
    CHECK_MSG(strstr(err.msg, "no node can hold one layer") && strstr(err.msg, "544.03 MiB") &&
                  strstr(err.msg, "100.00 MiB of activations"),
              "%s", err.msg);

    /* Explicit placements: the stage's own TP decides the capacity. */
    place_node nodes[2] = {pcie, h100};
    place_stage tp4[2] = {{"pcie", 0, 15, 4}, {"h100", 16, 31, 0}}; /* above the rule: an override */
    CHECK(place_check_explicit(&m, nodes, 2, tp4, 2, &p, &code, &err) == 0);
    CHECK_EQ_INT(p.st[0].tp, 4);
    CHECK_EQ_INT(p.st[1].tp, 8);
    place_stage tp8[2] = {{"pcie", 0, 15, 8}, {"h100", 16, 31, 0}};
    CHECK(place_check_explicit(&m, nodes, 2, tp8, 2, &p, &code, &err) != 0);
    CHECK_EQ_INT(code, RPC_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "TP 8 on pcie, which has 4 GPU(s)") != NULL, "%s", err.msg);
    place_stage tp1[2] = {{"pcie", 0, 15, 1}, {"h100", 16, 31, 0}}; /* one 9 GiB GPU for 16 layers */
    CHECK(place_check_explicit(&m, nodes, 2, tp1, 2, &p, &code, &err) != 0);
    CHECK_EQ_INT(code, RPC_RESOURCE_EXHAUSTED);
    CHECK_MSG(strstr(err.msg, "stage 0: layers 0-15 at TP 1 need 9.58 GiB") && strstr(err.msg, "offers 9.00 GiB"),
              "%s", err.msg);
}

int main(void) {
    test_memory_model();
    test_node_tp();
    test_auto();
    test_explicit();
    test_registry();
    test_registry_many();
    test_journal();
    return test_summary();
}

/* test_cluster_key.c — the data plane's cluster key (ib/cluster_key.h), the
 * StageAssign token (ib/assign_token.h) and owner-only secret files
 * (common/secret_file.h): parsing rules, MACs under the current and the
 * previous key (rotation), a token that fails when any field changes, file
 * modes refused, and no key material in any message. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/secret_file.h"
#include "ib/assign_token.h"
#include "ib/cluster_key.h"
#include "tests/testutil.h"

#define K1 "1111111111111111111111111111111111111111111111111111111111111111"
#define K2 "2222222222222222222222222222222222222222222222222222222222222222"

static void write_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
    REQUIRE(chmod(path, mode) == 0);
}

static void test_parse(void)
{
    st_err err;
    cluster_key *k = cluster_key_parse("# comment\n\n  " K1 "  \n", "t", &err);
    REQUIRE_MSG(k, "%s", err.msg);
    CHECK_EQ_INT(cluster_key_count(k), 1);
    cluster_key_free(k);
    CHECK(!cluster_key_parse("", "t", &err) && strstr(err.msg, "no key"));
    CHECK(!cluster_key_parse("short\n", "t", &err) && strstr(err.msg, "fewer than 32") && !strstr(err.msg, "short\n"));
    CHECK(!cluster_key_parse(K1 "\n" K2 "\n" K1 "\n", "t", &err) && strstr(err.msg, "t:3: more than 2 keys"));
}

static void test_macs(void)
{
    st_err err;
    cluster_key *cur = cluster_key_parse(K2 "\n" K1 "\n", "cur", &err); /* rotated: K2 new, K1 old */
    cluster_key *old = cluster_key_parse(K1 "\n", "old", &err);
    cluster_key *other = cluster_key_parse(K2 "\n", "other", &err);
    REQUIRE(cur && old && other);
    const char msg[] = "nonce and roles";
    uint8_t m_old[CLUSTER_MAC_LEN], m_cur[CLUSTER_MAC_LEN], m_assign[CLUSTER_MAC_LEN];
    REQUIRE(cluster_key_mac(old, 0, CLUSTER_KEY_HANDSHAKE, msg, sizeof msg, m_old) == 0);
    REQUIRE(cluster_key_mac(cur, 0, CLUSTER_KEY_HANDSHAKE, msg, sizeof msg, m_cur) == 0);
    REQUIRE(cluster_key_mac(old, 0, CLUSTER_KEY_ASSIGN, msg, sizeof msg, m_assign) == 0);
    CHECK(memcmp(m_old, m_cur, CLUSTER_MAC_LEN) != 0);
    CHECK(memcmp(m_old, m_assign, CLUSTER_MAC_LEN) != 0); /* one derived key per use */
    CHECK_EQ_INT(cluster_key_verify(cur, CLUSTER_KEY_HANDSHAKE, msg, sizeof msg, m_old, CLUSTER_MAC_LEN), 1);
    CHECK_EQ_INT(cluster_key_verify(cur, CLUSTER_KEY_HANDSHAKE, msg, sizeof msg, m_cur, CLUSTER_MAC_LEN), 0);
    CHECK_EQ_INT(cluster_key_verify(other, CLUSTER_KEY_HANDSHAKE, msg, sizeof msg, m_old, CLUSTER_MAC_LEN), -1);
    CHECK_EQ_INT(cluster_key_verify(old, CLUSTER_KEY_ASSIGN, msg, sizeof msg, m_old, CLUSTER_MAC_LEN), -1);
    CHECK_EQ_INT(cluster_key_verify(old, CLUSTER_KEY_HANDSHAKE, msg, sizeof msg - 1, m_old, CLUSTER_MAC_LEN), -1);
    CHECK_EQ_INT(cluster_key_verify(old, CLUSTER_KEY_HANDSHAKE, msg, sizeof msg, m_old, 16), -1);
    uint8_t a[32] = {0}, b[32] = {0};
    CHECK(cluster_random(a, sizeof a) == 0 && cluster_random(b, sizeof b) == 0 && memcmp(a, b, 32) != 0);
    cluster_key_free(cur);
    cluster_key_free(old);
    cluster_key_free(other);
}

/* The handshake proofs: a reflected proof (the other direction), a replay
 * under a fresh nonce, swapped roles and another key all fail. */
static void test_handshake(void)
{
    st_err err;
    cluster_key *k = cluster_key_parse(K1 "\n", "k", &err);
    cluster_key *rot = cluster_key_parse(K2 "\n" K1 "\n", "rot", &err);
    cluster_key *other = cluster_key_parse(K2 "\n", "other", &err);
    REQUIRE(k && rot && other);
    uint8_t ns[CLUSTER_NONCE_LEN], nc[CLUSTER_NONCE_LEN], ns2[CLUSTER_NONCE_LEN];
    REQUIRE(cluster_random(ns, sizeof ns) == 0 && cluster_random(nc, sizeof nc) == 0 &&
            cluster_random(ns2, sizeof ns2) == 0);
    const uint8_t C = 1, S = 2; /* coordinator connects to a stage */
    uint8_t mc[CLUSTER_MAC_LEN], ms[CLUSTER_MAC_LEN];
    REQUIRE(cluster_handshake_proof(k, 0, 'C', C, S, ns, nc, mc) == 0);
    REQUIRE(cluster_handshake_proof(k, 0, 'S', C, S, ns, nc, ms) == 0);
    CHECK_EQ_INT(cluster_handshake_verify(k, 'C', C, S, ns, nc, mc), 0);
    CHECK_EQ_INT(cluster_handshake_verify(k, 'S', C, S, ns, nc, ms), 0);
    CHECK_EQ_INT(cluster_handshake_verify(k, 'S', C, S, ns, nc, mc), -1); /* reflected */
    CHECK_EQ_INT(cluster_handshake_verify(k, 'C', C, S, ns, nc, ms), -1);
    CHECK_EQ_INT(cluster_handshake_verify(k, 'C', C, S, ns2, nc, mc), -1); /* replayed to a new challenge */
    CHECK_EQ_INT(cluster_handshake_verify(k, 'C', S, C, ns, nc, mc), -1); /* roles swapped */
    CHECK_EQ_INT(cluster_handshake_verify(k, 'C', S, S, ns, nc, mc), -1); /* a stage claiming another role */
    CHECK_EQ_INT(cluster_handshake_verify(other, 'C', C, S, ns, nc, mc), -1);
    CHECK_EQ_INT(cluster_handshake_verify(rot, 'C', C, S, ns, nc, mc), 1); /* the previous key, rotating */
    cluster_key_free(k);
    cluster_key_free(rot);
    cluster_key_free(other);
}

static void test_token(void)
{
    st_err err;
    cluster_key *k = cluster_key_parse(K1 "\n", "k", &err);
    cluster_key *k2 = cluster_key_parse(K2 "\n", "k2", &err);
    REQUIRE(k && k2);
    Strata__V1__StageAssign a = STRATA__V1__STAGE_ASSIGN__INIT;
    a.epoch = 7;
    a.stage = 1;
    a.n_stages = 2;
    a.model_path = "stories260K.gguf";
    a.first_layer = 3;
    a.last_layer = 5;
    a.tp = 1;
    a.kv_blocks = 512;
    a.next_hop = "";
    uint8_t tok[CLUSTER_MAC_LEN];
    REQUIRE(assign_token_make(k, &a, tok) == 0);
    CHECK(!assign_token_ok(k, &a)); /* no token yet */
    a.token.data = tok;
    a.token.len = sizeof tok;
    CHECK(assign_token_ok(k, &a));
    CHECK(!assign_token_ok(k2, &a));
    Strata__V1__StageAssign b = a;
    b.epoch = 6;
    CHECK(!assign_token_ok(k, &b));
    b = a;
    b.model_path = "other.gguf";
    CHECK(!assign_token_ok(k, &b));
    b = a;
    b.next_hop = "10.0.0.9:7001";
    CHECK(!assign_token_ok(k, &b));
    b = a;
    b.keep_loaded = true;
    CHECK(!assign_token_ok(k, &b));
    b = a;
    b.adopt_epoch = 6;
    CHECK(!assign_token_ok(k, &b));
    b = a;
    b.last_layer = 4;
    CHECK(!assign_token_ok(k, &b));
    b = a;
    b.backend = "cuda"; /* the backend and the device list are signed too */
    CHECK(!assign_token_ok(k, &b));
    int32_t devs[2] = {0, 1};
    b = a;
    b.devices = devs;
    b.n_devices = 2;
    CHECK(!assign_token_ok(k, &b));
    b = a;
    b.token.len = 16;
    CHECK(!assign_token_ok(k, &b));
    cluster_key_free(k);
    cluster_key_free(k2);
}

static void test_files(void)
{
    char dir[] = "/tmp/strata-key-XXXXXX";
    REQUIRE(mkdtemp(dir));
    char good[256], loose[256], fifo[256];
    snprintf(good, sizeof good, "%s/good.key", dir);
    snprintf(loose, sizeof loose, "%s/loose.key", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo.key", dir);
    write_file(good, K1 "\n", 0600);
    write_file(loose, K1 "\n", 0640);
    REQUIRE(mkfifo(fifo, 0600) == 0);
    st_err err;
    cluster_key *k = cluster_key_load(good, &err);
    CHECK_MSG(k, "%s", err.msg);
    cluster_key_free(k);
    CHECK(!cluster_key_load(loose, &err) && strstr(err.msg, "mode 0640") && strstr(err.msg, "chmod 600") &&
          !strstr(err.msg, "1111"));
    CHECK(!cluster_key_load(fifo, &err) && strstr(err.msg, "not a regular file")); /* and it did not block */
    char missing[300];
    snprintf(missing, sizeof missing, "%s/missing.key", dir);
    CHECK(!cluster_key_load(missing, &err) && strstr(err.msg, "No such file"));
    char buf[8];
    size_t len = 0;
    CHECK(st_secret_file_read(good, "x", buf, sizeof buf, &len, &err) == -1 && strstr(err.msg, "more than 7"));
    unlink(good);
    unlink(loose);
    unlink(fifo);
    rmdir(dir);
}

int main(void)
{
    test_parse();
    test_macs();
    test_handshake();
    test_token();
    test_files();
    return test_summary();
}

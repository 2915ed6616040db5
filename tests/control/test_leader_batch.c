/* test_leader_batch.c — the leader's etcd write path, its pure steps
 * (coordinator/control/leader.h; issue 30, defect 1): queued changes are
 * coalesced per key before they go into one txn (etcd refuses a txn that
 * names a key twice: "duplicate key given in txn request"), the last change
 * of a key wins (a put then a delete is a delete, a delete then a put is the
 * put), a txn holds at most `cap` keys and the rest of the queue waits; and
 * which etcd errors are etcd refusing the txn (not worth the same txn again)
 * rather than no answer or a passing state. */
#include <stdio.h>
#include <string.h>

#include "coordinator/control/leader.h"
#include "tests/testutil.h"

static etcd_op put(const char *k, const char *v) { return (etcd_op){k, v, strlen(v), 0}; }
static etcd_op del(const char *k) { return (etcd_op){k, NULL, 0, 0}; }

static const etcd_op *find(const etcd_op *ops, size_t n, const char *key) {
    const etcd_op *hit = NULL;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(ops[i].key, key)) {
            CHECK_MSG(hit == NULL, "key %s twice in one txn", key);
            hit = &ops[i];
        }
    return hit;
}

/* The case: a placement change writes the state twice (its epoch
 * assigned, then serving) while a node registers, and a node record is put
 * then deleted, another deleted then put again. */
static void test_coalesce(void) {
    etcd_op q[] = {put("/p/state", "{\"epoch\":2,\"pending\":1}"), put("/p/nodes/w-a", "a1"),
                   put("/p/state", "{\"epoch\":2}"),               put("/p/nodes/w-c", "c1"),
                   del("/p/nodes/w-c"),                            del("/p/nodes/w-b"),
                   put("/p/nodes/w-b", "b2"),                      put("/p/state", "{\"epoch\":3}")};
    size_t n = sizeof q / sizeof *q, used = 0;
    etcd_op out[8];
    size_t k = leader_coalesce(q, n, out, 8, &used);
    CHECK_EQ_INT((int)used, (int)n);
    CHECK_EQ_INT((int)k, 4);
    const etcd_op *st = find(out, k, "/p/state"), *a = find(out, k, "/p/nodes/w-a"),
                  *b = find(out, k, "/p/nodes/w-b"), *c = find(out, k, "/p/nodes/w-c");
    REQUIRE(st && a && b && c);
    CHECK_EQ_STR(st->value, "{\"epoch\":3}"); /* the last write wins */
    CHECK_EQ_INT((int)st->value_len, (int)strlen("{\"epoch\":3}"));
    CHECK_EQ_STR(a->value, "a1");
    CHECK_EQ_STR(b->value, "b2");  /* delete then put: the put */
    CHECK(c->value == NULL);       /* put then delete: the delete */
    /* order of each key's first change */
    CHECK(out[0].key == q[0].key && out[1].key == q[1].key && out[2].key == q[3].key && out[3].key == q[5].key);
}

/* A txn holds at most cap keys: the prefix stops before the first new key
 * past it (later changes of keys already in stay in: they are in the prefix
 * only if before that point). The rest waits for the next txn, so the order of
 * a key's changes across txns is kept. */
static void test_cap(void) {
    etcd_op q[] = {put("k1", "1"), put("k2", "2"), put("k1", "1b"), put("k3", "3"), put("k2", "2b")};
    etcd_op out[4];
    size_t used = 0;
    size_t k = leader_coalesce(q, 5, out, 2, &used);
    CHECK_EQ_INT((int)k, 2);
    CHECK_EQ_INT((int)used, 3); /* k3 would be a third key: k3 and the later k2 wait */
    CHECK_EQ_STR(find(out, k, "k1")->value, "1b");
    CHECK_EQ_STR(find(out, k, "k2")->value, "2");
    k = leader_coalesce(q + used, 5 - used, out, 2, &used);
    CHECK_EQ_INT((int)k, 2);
    CHECK_EQ_INT((int)used, 2);
    CHECK_EQ_STR(find(out, k, "k2")->value, "2b");
    /* one key written 1,000 times is one op */
    static etcd_op many[1000];
    for (int i = 0; i < 1000; i++) many[i] = i % 2 ? put("s", "v") : del("s");
    k = leader_coalesce(many, 1000, out, 1, &used);
    CHECK_EQ_INT((int)k, 1);
    CHECK_EQ_INT((int)used, 1000);
    CHECK(out[0].value != NULL);
    CHECK_EQ_INT((int)leader_coalesce(many, 0, out, 1, &used), 0);
    CHECK_EQ_INT((int)used, 0);
}

/* etcd_client.c's messages: "URL/v3/kv/txn: HTTP 400: etcd: MESSAGE (code N)"
 * for etcd's answers; no answer is "etcd URL: no answer within the timeout". */
static void test_refusal(void) {
    CHECK(leader_refusal("http://127.0.0.1:2379/v3/kv/txn: HTTP 400: etcd: etcdserver: duplicate key given in txn "
                         "request (code 3)"));
    CHECK(leader_refusal("http://127.0.0.1:2379/v3/kv/txn: HTTP 400: etcd: etcdserver: too many operations in txn "
                         "request (code 3)"));
    CHECK(leader_refusal("http://127.0.0.1:2379/v3/kv/txn: HTTP 400: etcd: etcdserver: request is too large "
                         "(code 3)"));
    CHECK(leader_refusal("https://10.0.0.5:2379/v3/kv/txn: HTTP 403: etcd: etcdserver: permission denied (code 7)"));
    CHECK(!leader_refusal("etcd http://127.0.0.1:2379: no answer within the timeout"));
    CHECK(!leader_refusal("etcd http://127.0.0.1:2379: cannot connect"));
    CHECK(!leader_refusal("http://127.0.0.1:2379/v3/kv/txn: HTTP 503: etcd: etcdserver: not leader (code 14)"));
    CHECK(!leader_refusal("http://127.0.0.1:2379/v3/kv/txn: HTTP 400: etcd: etcdserver: no leader (code 14)"));
    CHECK(!leader_refusal("http://127.0.0.1:2379/v3/kv/txn: HTTP 429: etcd: etcdserver: too many requests "
                          "(code 8)"));
    CHECK(!leader_refusal("http://127.0.0.1:2379/v3/kv/txn: HTTP 504: etcd: etcdserver: request timed out "
                          "(code 14)"));
}

int main(void) {
    test_coalesce();
    test_cap();
    test_refusal();
    return test_summary();
}

/* test_act_transport.c — the per-boundary activation transport
 * (ib/act_transport.h): the documented table row by row (choice and reason),
 * then invariants over every combination of the inputs, and the names. */
#include "ib/act_transport.h"
#include "tests/testutil.h"

/* side flags: G = GPU stage, N = NCCL, U = UCX CUDA memory */
#define S(g, n, u) ((act_side){.gpu = (g), .nccl = (n), .ucx_cuda = (u)})

static const struct row {
    act_side send, recv;
    bool same_node;
    enum act_override ovr;
    enum act_xport want;
    bool refused;
    const char *reason; /* a substring of the reason */
    bool same_gpu;
} k_rows[] = {
    /* CPU on either side */
    {{0}, {0}, false, ACT_OVERRIDE_AUTO, ACT_XPORT_UCX, false, "both stages run on the CPU", false},
    {{0}, {0}, true, ACT_OVERRIDE_AUTO, ACT_XPORT_UCX, false, "both stages run on the CPU", false},
    {{.gpu = true, .nccl = true, .ucx_cuda = true}, {0}, false, ACT_OVERRIDE_AUTO, ACT_XPORT_UCX_PINNED, false,
     "the receiving stage runs on the CPU; the GPU side stages through pinned host buffers", false},
    {{0}, {.gpu = true, .nccl = true}, false, ACT_OVERRIDE_AUTO, ACT_XPORT_UCX_PINNED, false, "the sending stage runs on the CPU", false},
    {{0}, {0}, false, ACT_OVERRIDE_NCCL, ACT_XPORT_UCX, true,
     "--activation-transport nccl not honoured: the sending stage runs on the CPU; both stages run on the CPU", false},
    /* GPU both, different nodes */
    {{.gpu = true, .nccl = true}, {.gpu = true, .nccl = true}, false, ACT_OVERRIDE_AUTO, ACT_XPORT_NCCL, false,
     "GPU stages on different nodes; NCCL on both", false},
    {{.gpu = true, .nccl = true, .ucx_cuda = true}, {.gpu = true, .nccl = true, .ucx_cuda = true}, false,
     ACT_OVERRIDE_AUTO, ACT_XPORT_NCCL, false, "different nodes; NCCL on both", false},
    {{.gpu = true, .ucx_cuda = true}, {.gpu = true, .nccl = true, .ucx_cuda = true}, false, ACT_OVERRIDE_AUTO,
     ACT_XPORT_UCX_CUDA, false, "GPUDirect RDMA", false},
    {{.gpu = true, .nccl = true, .ucx_cuda = true}, {.gpu = true, .nccl = true, .ucx_cuda = true}, false,
     ACT_OVERRIDE_UCX, ACT_XPORT_UCX_CUDA, false, "(--activation-transport ucx)", false},
    {{.gpu = true, .nccl = true}, {.gpu = true, .nccl = true}, false, ACT_OVERRIDE_UCX, ACT_XPORT_UCX_PINNED, false,
     "no NCCL (--activation-transport ucx)", false},
    {{.gpu = true}, {.gpu = true, .nccl = true}, false, ACT_OVERRIDE_AUTO, ACT_XPORT_UCX_PINNED, false,
     "NCCL is not available on the sending side", false},
    {{.gpu = true, .nccl = true}, {.gpu = true}, false, ACT_OVERRIDE_NCCL, ACT_XPORT_UCX_PINNED, true,
     "--activation-transport nccl not honoured: NCCL is not available on the receiving side", false},
    /* GPU both, one node */
    {{.gpu = true, .nccl = true, .ucx_cuda = true}, {.gpu = true, .nccl = true, .ucx_cuda = true}, true,
     ACT_OVERRIDE_AUTO, ACT_XPORT_UCX_CUDA, false, "on one node; UCX takes CUDA memory on both sides (cuda_ipc)", false},
    {{.gpu = true, .nccl = true, .ucx_cuda = true}, {.gpu = true, .nccl = true, .ucx_cuda = true}, true,
     ACT_OVERRIDE_NCCL, ACT_XPORT_NCCL, false, "--activation-transport nccl; both GPU stages run NCCL", false},
    {{.gpu = true, .nccl = true}, {.gpu = true, .nccl = true}, true, ACT_OVERRIDE_AUTO, ACT_XPORT_NCCL, false,
     "one node; UCX without CUDA memory, NCCL on both", false},
    {{.gpu = true}, {.gpu = true}, true, ACT_OVERRIDE_AUTO, ACT_XPORT_UCX_PINNED, false,
     "UCX without CUDA memory on the sending side", false},
    /* both stages on one GPU (same_gpu, rows below): no NCCL */
    {{.gpu = true, .nccl = true}, {.gpu = true, .nccl = true}, true, ACT_OVERRIDE_AUTO, ACT_XPORT_UCX_PINNED, false,
     "no NCCL (both stages on one GPU (NCCL takes one rank per GPU))", true},
    {{.gpu = true, .nccl = true}, {.gpu = true, .nccl = true}, true, ACT_OVERRIDE_NCCL, ACT_XPORT_UCX_PINNED, true,
     "--activation-transport nccl not honoured: both stages on one GPU", true},
    {{.gpu = true, .nccl = true, .ucx_cuda = true}, {.gpu = true, .nccl = true, .ucx_cuda = true}, true,
     ACT_OVERRIDE_AUTO, ACT_XPORT_UCX_CUDA, false, "cuda_ipc", true},
    {{.gpu = true, .ucx_cuda = true}, {.gpu = true}, true, ACT_OVERRIDE_AUTO, ACT_XPORT_UCX_PINNED, false,
     "UCX without CUDA memory on the receiving side", false},
};

static void test_table(void)
{
    for (size_t i = 0; i < sizeof k_rows / sizeof k_rows[0]; i++) {
        const struct row *r = &k_rows[i];
        act_boundary b = {.send = r->send, .recv = r->recv, .same_node = r->same_node, .same_gpu = r->same_gpu,
                          .override = r->ovr};
        act_choice c = act_transport_choose(&b);
        CHECK_MSG(c.xport == r->want, "row %zu: %s, want %s (%s)", i, act_xport_name(c.xport),
                  act_xport_name(r->want), c.reason);
        CHECK_MSG(c.override_refused == r->refused, "row %zu: override_refused %d", i, c.override_refused);
        CHECK_MSG(strstr(c.reason, r->reason) != NULL, "row %zu: reason '%s' lacks '%s'", i, c.reason, r->reason);
    }
}

/* Every combination: the choice respects what each side can do. */
static void test_invariants(void)
{
    int n = 0, by[4] = {0};
    for (int m = 0; m < 64; m++)
        for (int same = 0; same < 3; same++) /* other node, one node, one GPU */
            for (int o = 0; o < 3; o++) {
                act_side s = S(m & 1, (m >> 1) & 1, (m >> 2) & 1), r = S((m >> 3) & 1, (m >> 4) & 1, (m >> 5) & 1);
                act_boundary b = {.send = s, .recv = r, .same_node = same > 0, .same_gpu = same == 2,
                                  .override = (enum act_override)o};
                act_choice c = act_transport_choose(&b), again = act_transport_choose(&b);
                n++;
                by[c.xport]++;
                CHECK(c.xport == again.xport && !strcmp(c.reason, again.reason));
                CHECK_MSG(c.reason[0] != 0, "combination %d/%d/%d: empty reason", m, same, o);
                const bool gpu2 = s.gpu && r.gpu, nccl2 = gpu2 && s.nccl && r.nccl && same != 2;
                if (c.xport == ACT_XPORT_NCCL) CHECK_MSG(nccl2 && o != ACT_OVERRIDE_UCX, "nccl at %d/%d/%d", m, same, o);
                if (c.xport == ACT_XPORT_UCX_CUDA) CHECK(gpu2 && s.ucx_cuda && r.ucx_cuda);
                CHECK_MSG((c.xport == ACT_XPORT_UCX) == (!s.gpu && !r.gpu), "ucx at %d/%d/%d", m, same, o);
                /* NCCL wins whenever it is asked for and possible, and across nodes in auto */
                if (nccl2 && o == ACT_OVERRIDE_NCCL) CHECK(c.xport == ACT_XPORT_NCCL);
                if (nccl2 && o == ACT_OVERRIDE_AUTO && !same) CHECK(c.xport == ACT_XPORT_NCCL);
                CHECK(c.override_refused == (o == ACT_OVERRIDE_NCCL && !nccl2));
                if (c.override_refused) CHECK(strstr(c.reason, "not honoured") != NULL);
            }
    CHECK_EQ_INT(n, 576);
    /* both sides on the CPU: 16 of the 64 side pairs, x 3 placements x 3 overrides */
    CHECK_EQ_INT(by[ACT_XPORT_UCX], 16 * 3 * 3);
    CHECK(by[ACT_XPORT_UCX_PINNED] > 0 && by[ACT_XPORT_UCX_CUDA] > 0 && by[ACT_XPORT_NCCL] > 0);
}

static void test_names(void)
{
    const char *names[] = {"ucx", "ucx-pinned", "ucx-cuda", "nccl"};
    for (int i = 0; i < 4; i++) {
        enum act_xport x;
        CHECK_EQ_INT(act_xport_parse(names[i], &x), 0);
        CHECK_EQ_INT(x, i);
        CHECK(!strcmp(act_xport_name(x), names[i]));
    }
    enum act_xport x;
    CHECK_EQ_INT(act_xport_parse("rdma", &x), -1);
    CHECK_EQ_INT(act_xport_parse(NULL, &x), -1);
    CHECK(!strcmp(act_xport_name((enum act_xport)7), "?"));
    enum act_override o;
    CHECK_EQ_INT(act_override_parse("auto", &o), 0);
    CHECK_EQ_INT(o, ACT_OVERRIDE_AUTO);
    CHECK_EQ_INT(act_override_parse("nccl", &o), 0);
    CHECK_EQ_INT(o, ACT_OVERRIDE_NCCL);
    CHECK_EQ_INT(act_override_parse("ucx", &o), 0);
    CHECK_EQ_INT(o, ACT_OVERRIDE_UCX);
    CHECK_EQ_INT(act_override_parse("NCCL", &o), -1);
    CHECK_EQ_INT(act_override_parse("", &o), -1);
}

int main(void)
{
    test_table();
    test_invariants();
    test_names();
    return test_summary();
}

/* act_transport.c — the per-boundary activation transport (act_transport.h). */
#include "ib/act_transport.h"

#include <stdio.h>
#include <string.h>

static const char *const k_xport[] = {"ucx", "ucx-pinned", "ucx-cuda", "nccl"};
static const char *const k_override[] = {"auto", "ucx", "nccl"};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The index of s in names, or -1 (also for NULL). */
static int name_index(const char *const *names, unsigned n, const char *s)
{
    for (unsigned i = 0; s && i < n; i++)
        if (!strcmp(s, names[i])) return (int)i;
    return -1;
}

const char *act_xport_name(enum act_xport x)
{
    return (unsigned)x < N_OF(k_xport) ? k_xport[x] : "?";
}

int act_xport_parse(const char *s, enum act_xport *out)
{
    int i = name_index(k_xport, N_OF(k_xport), s);
    if (i < 0) return -1;
    *out = (enum act_xport)i;
    return 0;
}

const char *act_override_name(enum act_override o)
{
    return (unsigned)o < N_OF(k_override) ? k_override[o] : "?";
}

int act_override_parse(const char *s, enum act_override *out)
{
    int i = name_index(k_override, N_OF(k_override), s);
    if (i < 0) return -1;
    *out = (enum act_override)i;
    return 0;
}

/* Why NCCL cannot run on this boundary ("" when it can). */
static void nccl_missing(const act_boundary *b, char *why, size_t cap)
{
    if (!b->send.gpu || !b->recv.gpu)
        snprintf(why, cap, "the %s stage runs on the CPU", !b->send.gpu ? "sending" : "receiving");
    else if (!b->send.nccl || !b->recv.nccl)
        snprintf(why, cap, "NCCL is not available on the %s side", !b->send.nccl ? "sending" : "receiving");
    else if (b->same_node && b->same_gpu)
        snprintf(why, cap, "both stages on one GPU (NCCL takes one rank per GPU)");
    else
        why[0] = 0;
}

act_choice act_transport_choose(const act_boundary *b)
{
    act_choice c = {.xport = ACT_XPORT_UCX};
    char no_nccl[96];
    nccl_missing(b, no_nccl, sizeof no_nccl);
    const bool nccl_ok = !no_nccl[0] && b->override != ACT_OVERRIDE_UCX;
    const char *pref = "";
    char refused[160] = "";
    if (b->override == ACT_OVERRIDE_NCCL) {
        if (nccl_ok) {
            c.xport = ACT_XPORT_NCCL;
            snprintf(c.reason, sizeof c.reason, "--activation-transport nccl; both GPU stages run NCCL");
            return c;
        }
        c.override_refused = true;
        snprintf(refused, sizeof refused, "--activation-transport nccl not honoured: %s; ", no_nccl);
        pref = refused;
    }
    const char *ovr = b->override == ACT_OVERRIDE_UCX ? " (--activation-transport ucx)" : "";
    if (!b->send.gpu || !b->recv.gpu) {
        if (!b->send.gpu && !b->recv.gpu) {
            c.xport = ACT_XPORT_UCX;
            snprintf(c.reason, sizeof c.reason, "%sboth stages run on the CPU", pref);
        } else {
            c.xport = ACT_XPORT_UCX_PINNED;
            snprintf(c.reason, sizeof c.reason, "%sthe %s stage runs on the CPU; the GPU side stages through pinned host buffers",
                     pref, !b->send.gpu ? "sending" : "receiving");
        }
        return c;
    }
    const bool ucx_cuda = b->send.ucx_cuda && b->recv.ucx_cuda;
    if (!b->same_node && nccl_ok) {
        c.xport = ACT_XPORT_NCCL;
        snprintf(c.reason, sizeof c.reason, "%sGPU stages on different nodes; NCCL on both", pref);
    } else if (ucx_cuda) {
        c.xport = ACT_XPORT_UCX_CUDA;
        snprintf(c.reason, sizeof c.reason, "%sGPU stages %s; UCX takes CUDA memory on both sides (%s)%s", pref,
                 b->same_node ? "on one node" : "on different nodes", b->same_node ? "cuda_ipc" : "GPUDirect RDMA",
                 ovr);
    } else if (nccl_ok) {
        c.xport = ACT_XPORT_NCCL;
        snprintf(c.reason, sizeof c.reason, "%sGPU stages on one node; UCX without CUDA memory, NCCL on both", pref);
    } else {
        c.xport = ACT_XPORT_UCX_PINNED;
        char nc[120];
        if (b->override == ACT_OVERRIDE_UCX) snprintf(nc, sizeof nc, "--activation-transport ucx");
        else snprintf(nc, sizeof nc, "%s", no_nccl);
        snprintf(c.reason, sizeof c.reason, "%sGPU stages; UCX without CUDA memory on the %s side, no NCCL (%s)", pref,
                 !b->send.ucx_cuda ? "sending" : "receiving", nc);
    }
    return c;
}

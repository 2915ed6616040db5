/* fake_gpu_module.c — a "cuda" backend module that computes on the CPU, so
 * the worker's GPU-stage data path runs on a machine without a GPU
 * (tests/cluster/act_transport_test.py "pinned"): one device ("fake GPU"),
 * device_memory true, ranks on the CPU backend and TP groups on the CPU
 * shared-memory group, and a pinned-host allocator that is page-aligned
 * memory, counted and logged to stderr one line a call:
 *   fake-gpu: host_alloc BYTES live N
 *   fake-gpu: host_free live N
 * and a "device" allocator (dev_alloc, for the ucx-cuda transport under
 * STRATA_TEST_ACT_TRANSPORT=ucx-cuda-host) logged the same way:
 *   fake-gpu: dev_alloc BYTES live N
 *   fake-gpu: dev_free live N
 * so a test sees which buffers the worker took from it and that it gave
 * every one back. Its GPU's PCI bus id is $STRATA_FAKE_GPU_BUS, else
 * "fake:PID" (one GPU per process). With STRATA_FAKE_GPU_P2P=1 it has a
 * point-to-point (backend_p2p_ops) in place of NCCL's: a stream socket in
 * the abstract Unix namespace named by the unique id (rank 0 listens, rank 1
 * connects), every transfer logged as "fake-gpu: p2p send|recv BYTES";
 * STRATA_FAKE_GPU_P2P_FAIL_AT=N makes the N-th send fail ("injected").
 * Loaded through STRATA_BACKEND_PATH. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "compute/registry.h"

static atomic_int live;

static int fake_count(void) { return 1; }

static int fake_info(int device, backend_device_info *out, st_err *err)
{
    if (device != 0) return st_errf(err, "fake gpu: no device %d", device);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "Fake GPU (CPU backend)");
    out->memory_bytes = 1ull << 30;
    const char *bus = getenv("STRATA_FAKE_GPU_BUS");
    if (bus && *bus) snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "%s", bus);
    else snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "fake:%d", (int)getpid());
    return 0;
}

static backend *fake_backend_new(int device, int n_threads, st_err *err)
{
    (void)device;
    return backend_cpu_new(n_threads, err);
}

static backend_group *fake_group_new(int n, const int *devices, st_err *err)
{
    (void)devices;
    return (backend_group *)comm_cpu_group_new(n, err);
}
static comm *fake_group_rank(backend_group *g, int r) { return comm_cpu_rank((comm_cpu_group *)g, r); }
static void fake_group_free(backend_group *g) { comm_cpu_group_free((comm_cpu_group *)g); }

static void *fake_host_alloc(size_t bytes, st_err *err)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1)) {
        st_errf(err, "fake gpu: pinned host buffer of %zu bytes: out of memory", bytes);
        return NULL;
    }
    fprintf(stderr, "fake-gpu: host_alloc %zu live %d\n", bytes, atomic_fetch_add(&live, 1) + 1);
    return p;
}

/* "Device" memory: host memory, counted apart from the pinned buffers. */
static atomic_int dev_live;

static void *fake_dev_alloc(int device, size_t bytes, st_err *err)
{
    void *p = NULL;
    if (device != 0) return st_errf(err, "fake gpu: no device %d", device), NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1)) {
        st_errf(err, "fake gpu: device buffer of %zu bytes: out of memory", bytes);
        return NULL;
    }
    fprintf(stderr, "fake-gpu: dev_alloc %zu live %d\n", bytes, atomic_fetch_add(&dev_live, 1) + 1);
    return p;
}

static void fake_dev_free(int device, void *p)
{
    (void)device;
    if (!p) return;
    free(p);
    fprintf(stderr, "fake-gpu: dev_free live %d\n", atomic_fetch_sub(&dev_live, 1) - 1);
}

static void fake_host_free(void *p)
{
    if (!p) return;
    free(p);
    fprintf(stderr, "fake-gpu: host_free live %d\n", atomic_fetch_sub(&live, 1) - 1);
}

/* ---- the point-to-point over a Unix socket ---- */

struct backend_p2p {
    int fd;
    int rank;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int p2p_id(uint8_t *out, st_err *err)
{
    uint32_t r;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) return st_errf(err, "fake p2p: no random bytes");
    memset(out, 0, 128);
    snprintf((char *)out, 128, "strata-fake-p2p-%d-%08x", (int)getpid(), r);
    return 0;
}

static socklen_t p2p_addr(const uint8_t *id, struct sockaddr_un *a)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t n = strnlen((const char *)id, 100);
    memcpy(a->sun_path + 1, id, n); /* abstract namespace: sun_path[0] = 0 */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* Waits for fd to be ready for ev until deadline: 0, or -1 + err. */
static int wait_fd(int fd, short ev, double deadline, const char *what, st_err *err)
{
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) return st_errf(err, "fake p2p %s: timed out", what);
        struct pollfd p = {.fd = fd, .events = ev};
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r > 0) return 0;
        if (r < 0 && errno != EINTR) return st_errf(err, "fake p2p %s: %s", what, strerror(errno));
    }
}

static void p2p_close(backend_p2p *p)
{
    if (!p) return;
    if (p->fd >= 0) close(p->fd);
    free(p);
}

static backend_p2p *p2p_open(const uint8_t *id, int rank, int device, double timeout_s, st_err *err)
{
    (void)device;
    struct sockaddr_un a;
    socklen_t al = p2p_addr(id, &a);
    double deadline = now_s() + timeout_s;
    backend_p2p *p = calloc(1, sizeof *p);
    if (!p) return st_errf(err, "fake p2p: out of memory"), NULL;
    p->rank = rank;
    p->fd = -1;
    if (rank == 0) {
        int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (l < 0 || bind(l, (struct sockaddr *)&a, al) || listen(l, 1)) {
            st_errf(err, "fake p2p open: %s", strerror(errno));
            if (l >= 0) close(l);
            p2p_close(p);
            return NULL;
        }
        if (wait_fd(l, POLLIN, deadline, "open", err) == 0) p->fd = accept4(l, NULL, NULL, SOCK_CLOEXEC);
        close(l);
    } else {
        while (p->fd < 0 && now_s() < deadline) {
            int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (s >= 0 && connect(s, (struct sockaddr *)&a, al) == 0) {
                p->fd = s;
                break;
            }
            if (s >= 0) close(s);
            usleep(10000);
        }
        if (p->fd < 0) st_errf(err, "fake p2p open: timed out");
    }
    if (p->fd < 0) {
        p2p_close(p);
        return NULL;
    }
    fprintf(stderr, "fake-gpu: p2p open rank %d\n", rank);
    return p;
}

static int p2p_xfer(backend_p2p *p, bool send, void *buf, size_t bytes, double timeout_s, st_err *err)
{
    const char *what = send ? "send" : "recv";
    double deadline = now_s() + timeout_s;
    size_t done = 0;
    while (done < bytes) {
        if (wait_fd(p->fd, send ? POLLOUT : POLLIN, deadline, what, err)) return -1;
        ssize_t n = send ? write(p->fd, (char *)buf + done, bytes - done) : read(p->fd, (char *)buf + done, bytes - done);
        if (n == 0) return st_errf(err, "fake p2p %s: the peer closed", what);
        if (n < 0 && errno != EINTR && errno != EAGAIN) return st_errf(err, "fake p2p %s: %s", what, strerror(errno));
        if (n > 0) done += (size_t)n;
    }
    fprintf(stderr, "fake-gpu: p2p %s %zu\n", what, bytes);
    return 0;
}

static int p2p_send(backend_p2p *p, const void *dev, size_t bytes, double timeout_s, st_err *err)
{
    static atomic_int sends;
    const char *fail = getenv("STRATA_FAKE_GPU_P2P_FAIL_AT");
    if (fail && atoi(fail) == atomic_fetch_add(&sends, 1) + 1) {
        fprintf(stderr, "fake-gpu: p2p send %zu failed (injected)\n", bytes);
        return st_errf(err, "fake p2p send: injected failure");
    }
    return p2p_xfer(p, true, (void *)dev, bytes, timeout_s, err);
}
static int p2p_recv(backend_p2p *p, void *dev, size_t bytes, double timeout_s, st_err *err)
{
    return p2p_xfer(p, false, dev, bytes, timeout_s, err);
}

static const backend_p2p_ops k_p2p = {
    .id_bytes = 128, .unique_id = p2p_id, .open = p2p_open, .send = p2p_send, .recv = p2p_recv, .close = p2p_close};

static backend_module k_fake = {
    .abi = BACKEND_MODULE_ABI,
    .name = "cuda",
    .device_memory = true,
    .device_count = fake_count,
    .device_info = fake_info,
    .backend_new = fake_backend_new,
    .group_new = fake_group_new,
    .group_rank = fake_group_rank,
    .group_free = fake_group_free,
    .host_alloc = fake_host_alloc,
    .host_free = fake_host_free,
    .dev_alloc = fake_dev_alloc,
    .dev_free = fake_dev_free,
};

__attribute__((visibility("default"))) const backend_module *strata_backend_module_init(int abi)
{
    const char *p2p = getenv("STRATA_FAKE_GPU_P2P");
    k_fake.p2p = p2p && !strcmp(p2p, "1") ? &k_p2p : NULL;
    return abi == BACKEND_MODULE_ABI ? &k_fake : NULL;
}

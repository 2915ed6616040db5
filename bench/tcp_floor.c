/* tcp_floor.c — this machine's floor for a pipeline hop: one-way latency of
 * a plain TCP loopback connection (no UCX, TCP_NODELAY) after an idle gap,
 * the case of strata-bench-xport's gap rounds (bench_xport.c).
 *
 * A forked sender waits for a 1-byte ping, sleeps gap_ms (a forward
 * elsewhere in the pipeline), stamps CLOCK_MONOTONIC into a `bytes` reply
 * and writes it; the receiver takes (arrival - stamp). Rounds alternate a
 * receiver blocked in poll(2) (as a stage's loop sleeps in epoll) and one
 * spinning on non-blocking recv(2) (what adaptive polling does). Neither
 * can be beaten by a transport that rides on the same kernel socket: after
 * a gap the wake-ups of idle CPUs, not the copies, dominate. On the 2-vCPU
 * test VM: 70-150 us blocked, 30-130 us spinning, against 8 us back to back. */
#include "bench/tcp_floor.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"

static int io_all(int fd, void *buf, size_t n, int writing) {
    for (size_t done = 0; done < n;) {
        ssize_t k = writing ? write(fd, (char *)buf + done, n - done) : read(fd, (char *)buf + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        done += (size_t)k;
    }
    return 0;
}

static void sender(int fd, int gap_ms, size_t bytes, int n) {
    char *buf = calloc(1, bytes);
    char ping;
    for (int i = 0; buf && i < n && io_all(fd, &ping, 1, 0) == 0; i++) {
        struct timespec ts = {gap_ms / 1000, (long)(gap_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) && errno == EINTR) {}
        uint64_t now = st_now_ns();
        memcpy(buf, &now, sizeof now);
        if (io_all(fd, buf, bytes, 1)) break;
    }
    _exit(0);
}

/* One reply, received blocked in poll() or spinning; its latency in us, < 0 on error. */
static double receive(int fd, char *buf, size_t bytes, int spin) {
    size_t got = 0;
    while (got < bytes) {
        if (!spin) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, 30000) <= 0) return -1;
        }
        ssize_t k = recv(fd, buf + got, bytes - got, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return -1;
        if (k > 0) got += (size_t)k;
    }
    uint64_t stamp, now = st_now_ns();
    memcpy(&stamp, buf, sizeof stamp);
    return (double)(now - stamp) / 1e3;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int tcp_floor(int gap_ms, size_t bytes, int rounds, double med_us[2]) {
    enum { WARM = 4 };
    if (bytes < 8 || rounds < 1) return -1;
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
        getsockname(ls, (struct sockaddr *)&a, &al)) {
        if (ls >= 0) close(ls);
        return -1;
    }
    const int n = 2 * (rounds + WARM);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        close(ls);
        return -1;
    }
    if (pid == 0) {
        close(ls);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) _exit(1);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        sender(fd, gap_ms, bytes, n);
    }
    int fd = accept(ls, NULL, NULL), rc = -1;
    close(ls);
    char *buf = malloc(bytes);
    double *lat = malloc(sizeof(double) * 2 * (size_t)rounds);
    int cnt[2] = {0, 0};
    if (fd >= 0 && buf && lat) {
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        rc = 0;
        for (int r = 0; r < n && rc == 0; r++) {
            const int spin = (r / 2) % 2; /* blocked, blocked, spinning, spinning, ... */
            char ping = 1;
            double us = io_all(fd, &ping, 1, 1) ? -1 : receive(fd, buf, bytes, spin);
            if (us < 0) rc = -1;
            else if (r / 2 >= WARM && cnt[spin] < rounds) lat[spin * rounds + cnt[spin]++] = us;
        }
    }
    if (fd >= 0) close(fd);
    int status;
    waitpid(pid, &status, 0);
    if (rc == 0) {
        double p90[2];
        for (int k = 0; k < 2; k++) {
            qsort(lat + k * rounds, (size_t)cnt[k], sizeof *lat, cmp_d);
            med_us[k] = lat[k * rounds + cnt[k] / 2];
            p90[k] = lat[k * rounds + cnt[k] * 9 / 10];
        }
        printf("# gap %d ms, %zu B, plain TCP loopback (no UCX; this machine's floor): receiver blocked in poll"
               " median %.1f us, p90 %.1f us; spinning median %.1f us, p90 %.1f us\n",
               gap_ms, bytes, med_us[0], p90[0], med_us[1], p90[1]);
    }
    free(buf);
    free(lat);
    return rc;
}

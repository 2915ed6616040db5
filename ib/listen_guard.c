/* listen_guard.c — this process's TCP sockets on a listener's port: block the
 * listening one, end the accepted ones (listen_guard.h says why). */
#include "ib/listen_guard.h"

#include <dirent.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>

/* Whether fd is a TCP socket whose local port is port; *listening says
 * whether it is a listening one. */
static bool tcp_on_port(int fd, int port, bool *listening)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
    int type = 0, acc = 0;
    socklen_t l = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) != 0 || type != SOCK_STREAM) return false;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) return false;
    int local;
    if (ss.ss_family == AF_INET)
        local = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    else if (ss.ss_family == AF_INET6)
        local = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    else
        return false;
    if (local != port) return false;
    l = sizeof acc;
    *listening = getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l) == 0 && acc;
    return true;
}

/* Calls fn on each of this process's TCP sockets on port; returns the sum. */
static int each_on_port(int port, int (*fn)(int fd, bool listening))
{
    if (port <= 0) return 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (*end || end == e->d_name || fd == dirfd(d)) continue;
        bool listening = false;
        if (tcp_on_port((int)fd, port, &listening)) n += fn((int)fd, listening);
    }
    closedir(d);
    return n;
}

static int block_listening(int fd, bool listening)
{
    if (!listening) return 0;
    static struct sock_filter drop_all[] = {BPF_STMT(BPF_RET | BPF_K, 0)};
    struct sock_fprog prog = {.len = 1, .filter = drop_all};
    return setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) == 0;
}

/* A connected socket: shut down (UCX's thread reads its end and drops it, or
 * first delivers a request that had fully come: rejected), counts one. A listening
 * one: the connections waiting in its accept queue (TCP_INFO's tcpi_unacked,
 * for a listener), which UCX's thread may still accept. */
static int end_accepted(int fd, bool listening)
{
    if (!listening) {
        shutdown(fd, SHUT_RDWR);
        return 1;
    }
    struct tcp_info ti;
    socklen_t l = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &l) != 0) return 0;
    return (int)ti.tcpi_unacked;
}

int listen_guard_block(int port) { return each_on_port(port, block_listening); }

int listen_guard_end_accepted(int port) { return each_on_port(port, end_accepted); }

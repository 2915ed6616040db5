/* secret_file.c — owner-only secret files (secret_file.h). */
#include "common/secret_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int st_secret_file_read(const char *path, const char *what, char *buf, size_t cap, size_t *len, st_err *err)
{
    if (!path || !*path) return st_errf(err, "%s: no file given", what);
    if (cap < 2) return st_errf(err, "%s: no room", what);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return st_errf(err, "%s: cannot open %s: %s", what, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return st_errf(err, "%s: cannot stat %s: %s", what, path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return st_errf(err, "%s: %s is not a regular file", what, path);
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        close(fd);
        return st_errf(err, "%s: %s has mode %04o: the group or others may access it; "
                       "make it readable by its owner only (chmod 600 %s)",
                       what, path, (unsigned)(st.st_mode & 07777), path);
    }
    if ((size_t)st.st_size >= cap) {
        close(fd);
        return st_errf(err, "%s: %s is %lld bytes, more than %zu", what, path, (long long)st.st_size, cap - 1);
    }
    size_t n = 0;
    while (n < cap - 1) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            memset(buf, 0, cap);
            return st_errf(err, "%s: reading %s: %s", what, path, strerror(e));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    if (len) *len = n;
    return 0;
}

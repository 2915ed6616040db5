/* model_path.c — model files confined to the worker's model directory
 * (model_path.h). */
#include "daemon/model_path.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int model_name_check(const char *name, st_err *err)
{
    if (!name || !*name) return st_errf(err, "model path is empty");
    size_t n = strlen(name);
    if (n > MODEL_NAME_MAX) return st_errf(err, "model path is %zu bytes, more than %d", n, MODEL_NAME_MAX);
    if (name[0] == '/')
        return st_errf(err, "model path '%s' is absolute: name a file under the worker's --model-dir", name);
    for (const char *c = name;;) {
        const char *slash = strchr(c, '/');
        size_t len = slash ? (size_t)(slash - c) : strlen(c);
        if (len == 0) return st_errf(err, "model path '%s' has an empty component", name);
        if (len == 1 && c[0] == '.') return st_errf(err, "model path '%s' has a '.' component", name);
        if (len == 2 && c[0] == '.' && c[1] == '.')
            return st_errf(err, "model path '%s' has a '..' component: it must stay under --model-dir", name);
        if (!slash) break;
        c = slash + 1;
    }
    return 0;
}

/* Why an openat of component `comp` of name failed, in words. */
static int open_error(const char *name, int e, st_err *err)
{
    if (e == ELOOP || e == EMLINK)
        return st_errf(err, "model path '%s': a symbolic link (refused under --model-dir)", name);
    if (e == ENOTDIR) return st_errf(err, "model path '%s': a component is not a directory (or is a symbolic link)", name);
    if (e == ENOENT) return st_errf(err, "model path '%s': no such file under --model-dir", name);
    return st_errf(err, "model path '%s': cannot open: %s", name, strerror(e));
}

int model_path_open(int dirfd, const char *name, st_err *err)
{
    if (model_name_check(name, err)) return -1;
    if (dirfd < 0) return st_errf(err, "model path '%s': this worker has no model directory (start it with --model-dir DIR)", name);
    char buf[MODEL_NAME_MAX + 1];
    memcpy(buf, name, strlen(name) + 1);
    int cur = dirfd;
    char *c = buf;
    for (;;) {
        char *slash = strchr(c, '/');
        if (!slash) break;
        *slash = '\0';
        int next = openat(cur, c, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        if (cur != dirfd) close(cur);
        if (next < 0) return open_error(name, e, err);
        cur = next;
        c = slash + 1;
    }
    int fd = openat(cur, c, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    int e = errno;
    if (cur != dirfd) close(cur);
    if (fd < 0) return open_error(name, e, err);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        e = errno;
        close(fd);
        return st_errf(err, "model path '%s': cannot stat: %s", name, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return st_errf(err, "model path '%s' is not a regular file (%s)", name,
                       S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : S_ISSOCK(st.st_mode) ? "a socket" : "not a file");
    }
    /* Back to blocking reads for the mapping (O_NONBLOCK only guarded the open). */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

int model_files_open(const model_files *mf, const char *name, st_err *err)
{
    if (model_name_check(name, err)) return -1;
    if (!strchr(name, '/'))
        for (int i = 0; i < mf->n_models; i++) {
            const char *slash = strrchr(mf->models[i], '/');
            const char *base = slash ? slash + 1 : mf->models[i];
            if (strcmp(base, name)) continue;
            char dir[4096];
            if (slash)
                snprintf(dir, sizeof dir, "%.*s", (int)(slash - mf->models[i]) ? (int)(slash - mf->models[i]) : 1,
                         mf->models[i]);
            else
                snprintf(dir, sizeof dir, ".");
            int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dfd < 0)
                return st_errf(err, "model path '%s': cannot open the directory of --model %s", name, mf->models[i]);
            int fd = model_path_open(dfd, name, err);
            close(dfd);
            return fd;
        }
    return model_path_open(mf->dirfd, name, err);
}

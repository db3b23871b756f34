/* fuzz_util: what the libFuzzer harnesses share — the input as a file (a memfd with a /proc path,
 * for the APIs that take a path), ../shared located at run time, a whole file read into memory. */
#ifndef KV_FUZZ_UTIL_H
#define KV_FUZZ_UTIL_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* One memfd per process, rewritten with each input: *path becomes "/proc/self/fd/N".
 * Returns 0, or -1 (the harness then skips the input). */
static inline int fuzz_as_file(const uint8_t *data, size_t size, char *path, size_t cap)
{
    static int fd = -1;
    if (fd < 0) fd = memfd_create("kvchat-fuzz", 0);
    if (fd < 0 || ftruncate(fd, 0) != 0) return -1;
    size_t off = 0;
    while (off < size) {
        ssize_t w = pwrite(fd, data + off, size - off, (off_t)off);
        if (w <= 0) return -1;
        off += (size_t)w;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return 0;
}

/* KVCHAT_SHARED, else ../shared (the worktree's view of the shared models and templates). */
static inline const char *fuzz_shared(void)
{
    const char *s = getenv("KVCHAT_SHARED");
    return s && *s ? s : "../shared";
}

/* Read path whole (NUL-terminated, *len bytes); NULL when it cannot. */
static inline char *fuzz_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = 0;
        if (len) *len = (size_t)n;
    }
    return b;
}

/* A copy of data[0..size) with a NUL after it. */
static inline char *fuzz_strndup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) return NULL;
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

#endif

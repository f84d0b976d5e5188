/*
 * cross_copy: how fast one CPU moves 1 MiB messages out of another process's heap, the work
 * softib:// does at a receiver for each server-based RDMA transfer. A child process on CPU 0
 * holds a 1 MiB malloc()ed source, pre-faulted; the parent on CPU 1 copies it ROUNDS times into
 * DESTS rotating 1 MiB malloc()ed destinations, pre-faulted, and prints GB/s (10^9 B/s) for:
 *
 *   process_vm_readv  two 512 KiB calls per message, as the engine reads it: the kernel pins
 *                     the child's pages on every call (one copy);
 *   unix write+read   the same bytes from the parent's own copy through an AF_UNIX socket pair
 *                     in 256 KiB writes (two copies, no pins);
 *   pipe write+read   the same through a 1 MiB pipe (two copies, a page allocated per 4 KiB);
 *   memcpy            the same, in user space (one copy).
 *
 *   cc -O2 -o cross_copy benchmarks/tools/cross_copy.c
 *   ./cross_copy [ROUNDS [DESTS]]            defaults: 5000 rounds, 16 destinations
 *
 * Environment: HUGE=1 puts the child's source on a transparent huge page (2 MiB-aligned,
 * madvise), as a registered pool buffer is; the kernel then pins it 512 pages at a time.
 * Linux, x86-64 only (sched_setaffinity, process_vm_readv); needs two CPUs.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MSG (1 << 20)
#define PIECE (256 << 10)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s) != 0) {
        perror("sched_setaffinity");
        exit(1);
    }
}

static char *source(void) {
    char *p;
    if (getenv("HUGE") && atoi(getenv("HUGE"))) {
        if (posix_memalign((void **)&p, 2 << 20, 2 << 20) != 0) exit(1);
        madvise(p, 2 << 20, MADV_HUGEPAGE);
    } else {
        p = malloc(MSG);
    }
    memset(p, 1, MSG);
    return p;
}

/* Writes `len` bytes from `src` into fd `w` in PIECE-sized calls, reading each piece back from
 * fd `r` into `dst` before the next (both ends on this thread). */
static int through(int w, int r, const char *src, char *dst, size_t len) {
    for (size_t off = 0; off < len;) {
        size_t n = len - off < PIECE ? len - off : PIECE;
        ssize_t wr = write(w, src + off, n);
        if (wr <= 0) return -1;
        for (ssize_t got = 0; got < wr;) {
            ssize_t rd = read(r, dst + off + got, wr - got);
            if (rd <= 0) return -1;
            got += rd;
        }
        off += wr;
    }
    return 0;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5000;
    int dests = argc > 2 ? atoi(argv[2]) : 16;
    int ch[2];
    if (pipe(ch) != 0) return 1;
    pid_t child = fork();
    if (child == 0) {
        pin(0);
        char *src = source();
        unsigned long addr = (unsigned long)src;
        if (write(ch[1], &addr, sizeof addr) != sizeof addr) return 1;
        pause();
        return 0;
    }
    pin(1);
    unsigned long remote;
    if (read(ch[0], &remote, sizeof remote) != sizeof remote) return 1;
    char **dst = malloc(dests * sizeof *dst);
    for (int i = 0; i < dests; i++) {
        dst[i] = malloc(MSG);
        memset(dst[i], 0, MSG);
    }
    char *local = malloc(MSG);
    memset(local, 1, MSG);
    double gb = (double)MSG * rounds / 1e9, t0;

    t0 = now();
    for (int i = 0; i < rounds; i++)
        for (int h = 0; h < 2; h++) {
            struct iovec l = {dst[i % dests] + h * MSG / 2, MSG / 2};
            struct iovec r = {(void *)(remote + h * MSG / 2), MSG / 2};
            if (process_vm_readv(child, &l, 1, &r, 1, 0) != MSG / 2) {
                perror("process_vm_readv");
                return 1;
            }
        }
    printf("process_vm_readv  %6.2f GB/s\n", gb / (now() - t0));

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
    int sz = 4 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    t0 = now();
    for (int i = 0; i < rounds; i++)
        if (through(sv[0], sv[1], local, dst[i % dests], MSG) != 0) return 1;
    printf("unix write+read   %6.2f GB/s\n", gb / (now() - t0));

    int p[2];
    if (pipe(p) != 0) return 1;
    fcntl(p[1], F_SETPIPE_SZ, MSG);
    t0 = now();
    for (int i = 0; i < rounds; i++)
        if (through(p[1], p[0], local, dst[i % dests], MSG) != 0) return 1;
    printf("pipe write+read   %6.2f GB/s\n", gb / (now() - t0));

    t0 = now();
    for (int i = 0; i < rounds; i++) memcpy(dst[i % dests], local, MSG);
    printf("memcpy            %6.2f GB/s\n", gb / (now() - t0));

    kill(child, SIGKILL);
    return 0;
}

/*
 * sync_rounds: raw loopback TCP in synchronous rounds, the pattern of one stripefs client
 * writing to one io server. Each round the client sends SIZE MiB and waits for a 1-byte
 * reply; the receiver (a child process on CPU 1) busy-polls non-blocking recv() until it has
 * the round's bytes. The client runs on CPU 0. Prints MB/s over the last 90 % of the rounds
 * and the client's CPU seconds per GB.
 *
 *   cc -O2 -o sync_rounds benchmarks/tools/sync_rounds.c
 *   ./sync_rounds SIZE_MIB ROUNDS MODE     MODE 0: send(); 1: vmsplice() + splice() (zero-copy)
 *
 * Environment: HUGE=1 puts the sender's buffer on a transparent huge page (madvise);
 * HDR=n sends n header bytes before each round's payload (one sendmsg); RPAUSE=n makes the
 * receiver execute n PAUSE instructions after every empty recv(); WS=n makes both sides cycle
 * their rounds through n MiB of memory (at least one round's worth), as the clients and io
 * servers of a stripefs cell cycle through their regions and files.
 * Linux, x86-64 only (sched_setaffinity, vmsplice, __builtin_ia32_pause).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double cpu_self(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}

static size_t env(const char *name) { return getenv(name) ? (size_t)atol(getenv(name)) : 0; }

static void die(const char *what) {
    perror(what);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s SIZE_MIB ROUNDS MODE(0 send, 1 vmsplice+splice)\n", argv[0]);
        return 2;
    }
    size_t size = (size_t)atol(argv[1]) << 20, hdr = env("HDR"), pause_n = env("RPAUSE");
    size_t slots = (env("WS") << 20) / size;
    if (slots < 1) slots = 1;
    int rounds = atoi(argv[2]), mode = atoi(argv[3]), one = 1;
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(ls, (void *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (void *)&a, &al)) die("listen");
    if (fork() == 0) {
        pin(1);
        int s = accept(ls, 0, 0);
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        size_t want = size + hdr;
        char *b0 = aligned_alloc(4096, slots * want + 4096);
        memset(b0, 1, slots * want + 4096);
        fcntl(s, F_SETFL, O_NONBLOCK);
        for (int i = 0; i < rounds; i++) {
            size_t got = 0;
            char *b = b0 + (i % slots) * want;
            while (got < want) {
                ssize_t n = recv(s, b + got, want - got, 0);
                if (n > 0) got += n;
                else if (n == 0) exit(1);
                else for (size_t k = 0; k < pause_n; k++) __builtin_ia32_pause();
            }
            char r = 'r';
            if (send(s, &r, 1, 0) != 1) die("reply");
        }
        exit(0);
    }
    pin(0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&a, sizeof a)) die("connect");
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char *b0 = aligned_alloc(2 << 20, slots * size), hb[8192] = {0};
    if (env("HUGE")) madvise(b0, slots * size, MADV_HUGEPAGE);
    memset(b0, 2, slots * size);
    int p[2];
    if (pipe(p)) die("pipe");
    fcntl(p[0], F_SETPIPE_SZ, 1 << 20);
    double t0 = 0, c0 = 0;
    for (int i = 0; i < rounds; i++) {
        if (i == rounds / 10) t0 = now(), c0 = cpu_self();
        char *b = b0 + (i % slots) * size;
        if (hdr && send(c, hb, hdr, MSG_MORE) != (ssize_t)hdr) die("header");
        for (size_t off = 0; off < size;) {
            if (mode == 0) {
                ssize_t n = send(c, b + off, size - off, 0);
                if (n <= 0) die("send");
                off += n;
            } else {
                struct iovec v = {b + off, size - off > (1 << 20) ? (1 << 20) : size - off};
                ssize_t n = vmsplice(p[1], &v, 1, 0);
                if (n <= 0) die("vmsplice");
                for (ssize_t left = n; left > 0;) {
                    ssize_t m = splice(p[0], 0, c, 0, left, SPLICE_F_MOVE);
                    if (m <= 0) die("splice");
                    left -= m;
                }
                off += n;
            }
        }
        char r;
        if (recv(c, &r, 1, 0) != 1) die("reply");
    }
    double secs = now() - t0, gb = (double)size * (rounds - rounds / 10) / 1e9;
    double cpu = cpu_self() - c0;
    wait(0);
    printf("mode %d size %zu MiB ws %zu MiB: %.0f MB/s, client CPU %.3f s/GB\n", mode, size >> 20, (slots * size) >> 20, gb * 1e3 / secs, cpu / gb);
    return 0;
}

/*
 * fan_in: raw loopback TCP from several senders into one receiver, the data flow of a stripefs
 * read from N io servers. SENDERS child processes on CPU 1 each stream MSG_MIB-MiB send()s
 * (blocking) over their own connection; the receiver on CPU 0 drains all of them through one
 * epoll set into a 4 MiB ring, 1 MiB per recv(). Prints the receiver's GB/s (10^9 B/s) over
 * SECONDS after a 0.3 s warm-up.
 *
 *   cc -O2 -o fan_in benchmarks/tools/fan_in.c
 *   ./fan_in SENDERS SECONDS [MSG_MIB]
 *
 * Environment: SPIN=1 makes the receiver poll (epoll_wait with a zero timeout) instead of
 * sleeping in epoll_wait; CC=name sets the senders' TCP congestion control; REQ=n makes the
 * flow request-driven, as a read's: a sender sends a message only for a 1-byte request, the
 * receiver keeps n requests outstanding at each sender and sends the next as a message
 * completes. Three more shape a sender's flow like an ionet server's read: HDR=n sends an
 * n-byte header in the same sendmsg() as each message, REPLY=n sends an n-byte reply after it
 * (a second call), NB=1 makes the sender non-blocking, spinning on EAGAIN for its requests and
 * its sends (n at most 4096; the header and reply bytes count in GB/s). REQSZ=n makes each
 * request n bytes (REQ × REQSZ at most 256); RX=1 (with REQ) reads as ionet's engine does:
 * a message's header alone, its body straight into a buffer of that sender's, its reply alone.
 * YIELD=1 (with NB and REQ) makes a sender waiting for a request yield its CPU after each empty
 * read, as ionet's busy-polling driver does: the senders sharing CPU 1 then take turns push by
 * push instead of each keeping the CPU for a scheduler slice (several ms of its own pushes).
 * Linux only (sched_setaffinity, epoll).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_SENDERS 64
#define RING (4u << 20)
#define READ_MAX (1u << 20)
#define EXTRA_MAX 4096

/* The sender's shape (HDR, REPLY, NB), set before the fork. */
static size_t hdr_len, reply_len, req_len = 1;
static int nonblocking, yielding;

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s)) die("sched_setaffinity");
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* A sender: streams forever (until killed or the receiver closes); with `req`, one message
 * per 1-byte request read from the socket. */
static void sender(const struct sockaddr_in *to, size_t msg, const char *cc, int req) {
    pin(1);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) die("socket");
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (cc && setsockopt(s, IPPROTO_TCP, TCP_CONGESTION, cc, strlen(cc))) die("TCP_CONGESTION");
    if (connect(s, (const struct sockaddr *)to, sizeof *to)) die("connect");
    char *b = malloc(msg);
    if (!b) die("malloc");
    memset(b, 1, msg); /* pre-faulted */
    static char extra[EXTRA_MAX]; /* header and reply bytes */
    int flags = MSG_NOSIGNAL | (nonblocking ? MSG_DONTWAIT : 0);
    for (;;) {
        char r1[256];
        for (size_t have = 0; req && have < req_len;) {
            ssize_t q = recv(s, r1 + have, req_len - have, nonblocking ? MSG_DONTWAIT : MSG_WAITALL);
            if (q > 0) {
                have += (size_t)q;
                continue;
            }
            if (q < 0 && (errno == EAGAIN || errno == EINTR)) {
                if (yielding) sched_yield();
                continue;
            }
            _exit(0);
        }
        /* Header and message in one call, as a frame goes out. */
        size_t off = 0, total = hdr_len + msg;
        while (off < total) {
            struct iovec iov[2];
            int k = 0;
            if (off < hdr_len) iov[k++] = (struct iovec){extra + off, hdr_len - off};
            size_t at = off < hdr_len ? 0 : off - hdr_len;
            iov[k++] = (struct iovec){b + at, msg - at};
            struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
            ssize_t r = sendmsg(s, &m, flags);
            if (r < 0) {
                if (errno == EINTR || errno == EAGAIN) continue;
                _exit(0);
            }
            off += (size_t)r;
        }
        for (off = 0; off < reply_len;) {
            ssize_t r = send(s, extra + off, reply_len - off, flags);
            if (r < 0) {
                if (errno == EINTR || errno == EAGAIN) continue;
                _exit(0);
            }
            off += (size_t)r;
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s SENDERS SECONDS [MSG_MIB]\n", argv[0]);
        return 2;
    }
    int n = atoi(argv[1]);
    double secs = atof(argv[2]);
    size_t msg = (size_t)(argc > 3 ? atoi(argv[3]) : 1) << 20;
    int spin = getenv("SPIN") && atoi(getenv("SPIN"));
    const char *cc = getenv("CC");
    int req = getenv("REQ") ? atoi(getenv("REQ")) : 0;
    int h = getenv("HDR") ? atoi(getenv("HDR")) : 0, rp = getenv("REPLY") ? atoi(getenv("REPLY")) : 0;
    nonblocking = getenv("NB") && atoi(getenv("NB"));
    yielding = getenv("YIELD") && atoi(getenv("YIELD"));
    if (yielding && !(nonblocking && req)) {
        fprintf(stderr, "YIELD=1 yields while a sender spins for a request, so it needs NB and REQ\n");
        return 2;
    }
    if (h < 0 || h > EXTRA_MAX || rp < 0 || rp > EXTRA_MAX) {
        fprintf(stderr, "HDR and REPLY 0..%d\n", EXTRA_MAX);
        return 2;
    }
    int rq = getenv("REQSZ") ? atoi(getenv("REQSZ")) : 1;
    int rx = getenv("RX") && atoi(getenv("RX"));
    /* Checked before the senders fork: the first requests are sent from one 256-byte buffer. */
    if (req < 0 || rq < 1 || (long)req * rq > 256) {
        fprintf(stderr, "REQ 0.., REQSZ 1.., REQ × REQSZ 256 at most\n");
        return 2;
    }
    if (rx && !req) {
        fprintf(stderr, "RX=1 reads messages one by one, so it needs REQ\n");
        return 2;
    }
    req_len = (size_t)rq;
    hdr_len = (size_t)h;
    reply_len = (size_t)rp;
    if (n < 1 || n > MAX_SENDERS || secs <= 0 || msg == 0) {
        fprintf(stderr, "SENDERS 1..%d, SECONDS > 0, MSG_MIB > 0\n", MAX_SENDERS);
        return 2;
    }
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0) die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, MAX_SENDERS) ||
        getsockname(ls, (struct sockaddr *)&a, &al))
        die("listen");
    pid_t kids[MAX_SENDERS];
    for (int i = 0; i < n; i++) {
        kids[i] = fork();
        if (kids[i] < 0) die("fork");
        if (kids[i] == 0) sender(&a, msg, cc, req);
    }
    pin(0);
    int ep = epoll_create1(0);
    if (ep < 0) die("epoll_create1");
    int fds[MAX_SENDERS];
    size_t into[MAX_SENDERS] = {0}; /* bytes of the current message per sender */
    char reqs[256];
    memset(reqs, 'r', sizeof reqs);
    for (int i = 0; i < n; i++) {
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) die("accept");
        fds[i] = fd;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (req && send(fd, reqs, (size_t)req * req_len, 0) != (ssize_t)((size_t)req * req_len))
            die("send requests");
        fcntl(fd, F_SETFL, O_NONBLOCK);
        struct epoll_event e = {.events = EPOLLIN, .data.u32 = (unsigned)i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e)) die("epoll_ctl");
    }
    char *ring = malloc(RING);
    if (!ring) die("malloc");
    memset(ring, 0, RING);
    size_t at = 0;
    char scratch[EXTRA_MAX];
    char *bufs[MAX_SENDERS];
    for (int i = 0; rx && i < n; i++) {
        bufs[i] = malloc(msg);
        if (!bufs[i]) die("malloc");
        memset(bufs[i], 0, msg);
    }
    unsigned long long got = 0;
    double start = now() + 0.3, end = start + secs;
    int counting = 0;
    for (;;) {
        struct epoll_event ev[MAX_SENDERS];
        int k = epoll_wait(ep, ev, MAX_SENDERS, spin ? 0 : 100);
        for (int j = 0; j < k; j++) {
            unsigned i = ev[j].data.u32;
            for (;;) {
                size_t want = RING - at < READ_MAX ? RING - at : READ_MAX;
                char *dst = ring + at;
                if (rx) {
                    size_t pos = into[i];
                    if (pos < hdr_len) {
                        dst = scratch;
                        want = hdr_len - pos;
                    } else if (pos < hdr_len + msg) {
                        dst = bufs[i] + (pos - hdr_len);
                        want = hdr_len + msg - pos;
                    } else {
                        dst = scratch;
                        want = hdr_len + msg + reply_len - pos;
                    }
                }
                ssize_t r = recv(fds[i], dst, want, 0);
                if (r <= 0) break;
                if (!rx) at = (at + (size_t)r) % RING;
                if (counting) got += (unsigned long long)r;
                if (req) {
                    /* A request for each message (with its header and reply) completed. */
                    size_t each = hdr_len + msg + reply_len;
                    into[i] += (size_t)r;
                    while (into[i] >= each) {
                        into[i] -= each;
                        if (send(fds[i], reqs, req_len, 0) != (ssize_t)req_len) die("send request");
                    }
                }
            }
        }
        double t = now();
        if (!counting && t >= start) {
            counting = 1;
            start = t;
            end = t + secs;
        } else if (counting && t >= end) {
            printf("%.3f\n", got / (t - start) / 1e9);
            break;
        }
    }
    for (int i = 0; i < n; i++) kill(kids[i], SIGKILL);
    while (wait(NULL) > 0) {
    }
    return 0;
}

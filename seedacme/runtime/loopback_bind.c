/* Keeps a process's servers on loopback and to its own uid: an LD_PRELOAD interposer for
 * bind(), listen(), accept() and accept4().
 *
 * Where no private network namespace can be made (issue 64: Ubuntu 24.04's default,
 * containers, HPC nodes without user namespaces), a run's replicas are started with this
 * library in LD_PRELOAD (seedacme/runtime/isolation.py). Courier 0.5 and Reverb 0.7 ask
 * for [::]:port in their C++ with no way to pass an address; every such bind() goes
 * through libc, so it arrives here:
 *
 *  - AF_INET 0.0.0.0 becomes 127.0.0.1 (or SEEDACME_LOOPBACK_ADDRESS, another 127/8
 *    address: the Vertex emulation gives each emulated container a loopback of its own,
 *    as each real container has; launchers/vertex.py).
 *  - AF_INET6 :: (and ::ffff:0.0.0.0) becomes the IPv4-mapped ::ffff:127.0.0.1 with
 *    IPV6_V6ONLY turned off, not ::1: /etc/hosts often maps `localhost` to 127.0.0.1
 *    only, and a client dialling localhost:port must reach it. A socket the caller has
 *    made IPv6-only keeps that: it gets ::1 (it could not take an IPv4 client anyway).
 *  - listen() on a socket never bound (which the kernel would bind to the wildcard)
 *    binds it to loopback, port 0, first.
 *  - An explicit loopback address, and any family but AF_INET/AF_INET6 (Unix sockets),
 *    passes through unchanged.
 *  - An explicit non-loopback address is refused with EADDRNOTAVAIL (a line on stderr,
 *    once per process): a library choosing the host's address would defeat the point.
 *
 * Loopback is shared by every user of the host, so accept() and accept4() (gRPC calls
 * accept4 through libc's PLT from its epoll loop, on non-blocking listeners) keep only
 * connections made by this process's own uid:
 *
 *  - An accepted AF_INET/AF_INET6 connection is kept only if its peer is a loopback
 *    address and the connecting socket belongs to geteuid(): its row in
 *    /proc/self/net/tcp or tcp6 (local end = our peer, remote end = our end, state
 *    ESTABLISHED; an IPv4 client of a dual-stack listener is in tcp, an IPv6 one in
 *    tcp6, both compared as IPv4-mapped) has that uid. The kernel stamps a socket with
 *    its creator's effective (fs) uid, hence geteuid(), not getuid().
 *  - Anything else is refused: another uid, a peer that is not loopback (binds are
 *    loopback, so none should come), no such row (the peer closed before the lookup, or
 *    not TCP). The connection is reset (SO_LINGER 0, so no TIME_WAIT piles up) and
 *    accept is called again: a blocking listener waits for the next connection, a
 *    non-blocking one gets EAGAIN unless another is pending (returning EAGAIN while one
 *    is pending would strand it under gRPC's edge-triggered epoll). The caller never
 *    sees the refused one; gRPC closes a listener on any error but EINTR/EAGAIN, so none
 *    is invented here.
 *  - Each refusal is counted; stderr gets a line with the count at most once a second.
 *  - Unix-domain connections pass unchanged (the same-host socket checks SO_PEERCRED).
 *  - Cost: one read of the tcp tables per accepted connection; gRPC's are long-lived.
 *  - Processes of the same uid can connect, as they could enter a namespace of that uid.
 *    Within a user namespace, uids it does not map read as the overflow uid (65534), so
 *    a run whose own uid there is 65534 cannot tell them apart.
 *
 * Only the replicas (and what they start: children inherit LD_PRELOAD) carry it. The
 * launcher process does not: the cluster launcher's mutual-TLS endpoint deliberately
 * binds the host's address there. What this does not cover, checked instead at start-up
 * by reading what actually listens (isolation.non_loopback_listeners): binaries linked
 * statically or issuing the bind syscall directly, and setuid programs (ld.so drops
 * LD_PRELOAD for them). Such a binary's accept() is not filtered either.
 *
 * SEEDACME_LOOPBACK_BIND_VERBOSE=1 logs every rewrite to stderr. The exported symbol
 * seedacme_loopback_bind_active lets a process see that the library is loaded, and
 * seedacme_loopback_refusals how many connections it refused.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int seedacme_loopback_bind_active = 1;

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*listen_fn)(int, int);
typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);
typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);
static bind_fn real_bind;
static listen_fn real_listen;
static accept_fn real_accept;
static accept4_fn real_accept4;
static int refused_once, verbose;
static uint32_t loopback = INADDR_LOOPBACK;  /* host order: where wildcard binds go */
unsigned long seedacme_loopback_refusals;  /* connections refused so far, exported */
static long long said_at_ms = -1000000;

__attribute__((constructor)) static void resolve(void) {
  real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
  real_listen = (listen_fn)dlsym(RTLD_NEXT, "listen");
  real_accept = (accept_fn)dlsym(RTLD_NEXT, "accept");
  real_accept4 = (accept4_fn)dlsym(RTLD_NEXT, "accept4");
  const char *v = getenv("SEEDACME_LOOPBACK_BIND_VERBOSE");
  verbose = v && *v && strcmp(v, "0") != 0;
  struct in_addr a;
  const char *to = getenv("SEEDACME_LOOPBACK_ADDRESS");
  if (to && *to && inet_pton(AF_INET, to, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127)
    loopback = ntohl(a.s_addr);
}

static void say(const char *what, const struct sockaddr *sa) {
  char text[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    port = ntohs(in->sin_port);
  } else {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    port = ntohs(in6->sin6_port);
  }
  fprintf(stderr, "seedacme loopback_bind: %s %s port %d\n", what, text, port);
}

int bind(int fd, const struct sockaddr *sa, socklen_t len) {
  if (!real_bind) resolve();
  if (!real_bind) { errno = ENOSYS; return -1; }
  if (sa && sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in in = *(const struct sockaddr_in *)sa;
    uint32_t host = ntohl(in.sin_addr.s_addr);
    if (host == INADDR_ANY) {
      in.sin_addr.s_addr = htonl(loopback);
      if (verbose) say("moved to loopback: bind to", sa);
      return real_bind(fd, (const struct sockaddr *)&in, sizeof in);
    }
    if ((host >> 24) != 127) goto refuse;
  } else if (sa && sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 in6 = *(const struct sockaddr_in6 *)sa;
    const struct in6_addr *a = &in6.sin6_addr;
    int mapped = IN6_IS_ADDR_V4MAPPED(a);
    if (IN6_IS_ADDR_UNSPECIFIED(a) || (mapped && a->s6_addr32[3] == 0)) {
      int v6only = 0;
      socklen_t size = sizeof v6only;
      if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &size) == 0 && v6only && !mapped) {
        in6.sin6_addr = in6addr_loopback;
      } else {
        int off = 0;
        if (setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off) != 0) return -1;
        memset(&in6.sin6_addr, 0, sizeof in6.sin6_addr);
        in6.sin6_addr.s6_addr[10] = in6.sin6_addr.s6_addr[11] = 0xff;
        in6.sin6_addr.s6_addr32[3] = htonl(loopback);
      }
      if (verbose) say("moved to loopback: bind to", sa);
      return real_bind(fd, (const struct sockaddr *)&in6, sizeof in6);
    }
    if (!IN6_IS_ADDR_LOOPBACK(a) && !(mapped && (ntohl(a->s6_addr32[3]) >> 24) == 127))
      goto refuse;
  }
  return real_bind(fd, sa, len);
refuse:
  if (!__atomic_exchange_n(&refused_once, 1, __ATOMIC_RELAXED))
    say("refused (this run's servers listen on loopback only): bind to", sa);
  errno = EADDRNOTAVAIL;
  return -1;
}

int listen(int fd, int backlog) {
  if (!real_listen) resolve();
  if (!real_listen) { errno = ENOSYS; return -1; }
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  int type = 0;
  socklen_t type_len = sizeof type;
  /* Port 0 after getsockname: never bound (bind always assigns a port). */
  if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0 &&
      getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) == 0 && type == SOCK_STREAM &&
      ((ss.ss_family == AF_INET && ((struct sockaddr_in *)&ss)->sin_port == 0) ||
       (ss.ss_family == AF_INET6 && ((struct sockaddr_in6 *)&ss)->sin6_port == 0))) {
    if (bind(fd, (struct sockaddr *)&ss, len) != 0) return -1;  /* the wildcard, moved */
  }
  return real_listen(fd, backlog);
}

/* One end of a TCP connection, IPv4 held IPv4-mapped, as tcp6 shows a dual-stack peer. */
struct end {
  unsigned char addr[16];
  unsigned port;
};

static int end_of(const struct sockaddr_storage *ss, struct end *e) {
  memset(e, 0, sizeof *e);
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
    e->addr[10] = e->addr[11] = 0xff;
    memcpy(e->addr + 12, &in->sin_addr, 4);
    e->port = ntohs(in->sin_port);
    return 1;
  }
  if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
    memcpy(e->addr, &in6->sin6_addr, 16);
    e->port = ntohs(in6->sin6_port);
    return 1;
  }
  return 0;
}

static int end_is_loopback(const struct end *e) {
  static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return (memcmp(e->addr, mapped, 12) == 0 && e->addr[12] == 127) ||
         IN6_IS_ADDR_LOOPBACK((const struct in6_addr *)e->addr);
}

/* An end as /proc/net/tcp{,6} prints it: each 32-bit word of the address in host order
 * (8 hex digits for IPv4, 32 for IPv6), the port in hex. */
static int end_of_text(const char *hex, unsigned port, struct end *e) {
  size_t words = strlen(hex) / 8;
  if ((words != 1 && words != 4) || strlen(hex) % 8) return 0;
  memset(e, 0, sizeof *e);
  unsigned char *to = words == 1 ? e->addr + 12 : e->addr;
  if (words == 1) e->addr[10] = e->addr[11] = 0xff;
  for (size_t i = 0; i < words; i++) {
    char word[9];
    memcpy(word, hex + 8 * i, 8);
    word[8] = 0;
    uint32_t w = (uint32_t)strtoul(word, NULL, 16);
    memcpy(to + 4 * i, &w, 4);
  }
  e->port = port;
  return 1;
}

/* The uid of the ESTABLISHED socket whose local end is `from` and remote end `to`, in
 * this process's network namespace: 1 and *uid when found, 0 when not, -1 when neither
 * table can be read. */
static int owner(const struct end *from, const struct end *to, unsigned *uid) {
  static const char *const tables[] = {"/proc/self/net/tcp", "/proc/self/net/tcp6"};
  int read_any = 0;
  for (int t = 0; t < 2; t++) {
    FILE *f = fopen(tables[t], "re");
    if (!f) continue;
    read_any = 1;
    char line[512], local[33], remote[33];
    unsigned lport, rport, state, row_uid;
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
      struct end l, r;
      if (sscanf(line, " %*u: %32[0-9A-Fa-f]:%x %32[0-9A-Fa-f]:%x %x %*s %*s %*s %u",
                 local, &lport, remote, &rport, &state, &row_uid) != 6 ||
          state != 1 /* TCP_ESTABLISHED */ || !end_of_text(local, lport, &l) ||
          !end_of_text(remote, rport, &r))
        continue;
      if (memcmp(&l, from, sizeof l) == 0 && memcmp(&r, to, sizeof r) == 0) {
        *uid = row_uid;
        found = 1;
      }
    }
    fclose(f);
    if (found) return 1;
  }
  return read_any ? 0 : -1;
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* Counts a refusal; says so on stderr, with the count, at most once a second. */
static void refused(const struct end *here, const struct end *peer, const char *why) {
  unsigned long n = __atomic_add_fetch(&seedacme_loopback_refusals, 1, __ATOMIC_RELAXED);
  long long now = now_ms(), last = __atomic_load_n(&said_at_ms, __ATOMIC_RELAXED);
  if (now - last < 1000 ||
      !__atomic_compare_exchange_n(&said_at_ms, &last, now, 0, __ATOMIC_RELAXED,
                                   __ATOMIC_RELAXED))
    return;
  char text[INET6_ADDRSTRLEN] = "?";
  if (peer) inet_ntop(AF_INET6, peer->addr, text, sizeof text);
  fprintf(stderr,
          "seedacme loopback_bind: refused a connection to port %u from %s port %u (%s); "
          "%lu refused so far: this run's servers accept only uid %u\n",
          here ? here->port : 0, text, peer ? peer->port : 0, why, n, (unsigned)geteuid());
}

/* Whether to keep accepted connection `fd` (see the top of this file). */
static int keep(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  struct end here, peer;
  if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
    refused(NULL, NULL, "its address is gone");
    return 0;
  }
  if (!end_of(&ss, &here)) return 1;  /* Unix-domain and the like: unchanged */
  len = sizeof ss;
  if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0 || !end_of(&ss, &peer)) {
    refused(&here, NULL, "the peer is gone");
    return 0;
  }
  if (!end_is_loopback(&peer)) {
    refused(&here, &peer, "not loopback");
    return 0;
  }
  unsigned uid;
  int found = owner(&peer, &here, &uid);
  if (found != 1) {
    refused(&here, &peer, found ? "cannot read /proc/self/net/tcp{,6}"
                                : "its socket is not in /proc/self/net/tcp{,6}: closed?");
    return 0;
  }
  if (uid != (unsigned)geteuid()) {
    char why[48];
    snprintf(why, sizeof why, "owner uid %u", uid);
    refused(&here, &peer, why);
    return 0;
  }
  return 1;
}

/* Accepts until a connection is kept or the real call fails (EAGAIN included). */
static int accept_kept(int fd, struct sockaddr *sa, socklen_t *len, int flags, int four) {
  socklen_t room = len ? *len : 0;
  for (;;) {
    if (len) *len = room;
    int got = four ? real_accept4(fd, sa, len, flags) : real_accept(fd, sa, len);
    if (got < 0) return got;
    int saved = errno;
    if (keep(got)) {
      errno = saved;
      return got;
    }
    struct linger reset = {1, 0};  /* an RST, not a FIN: no TIME_WAIT on our side */
    setsockopt(got, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    close(got);
    errno = saved;
  }
}

int accept(int fd, struct sockaddr *sa, socklen_t *len) {
  if (!real_accept) resolve();
  if (!real_accept) { errno = ENOSYS; return -1; }
  return accept_kept(fd, sa, len, 0, 0);
}

int accept4(int fd, struct sockaddr *sa, socklen_t *len, int flags) {
  if (!real_accept4) resolve();
  if (!real_accept4) { errno = ENOSYS; return -1; }
  return accept_kept(fd, sa, len, flags, 1);
}

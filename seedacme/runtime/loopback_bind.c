/* Keeps a process's servers on loopback: an LD_PRELOAD interposer for bind() and listen().
 *
 * Where no private network namespace can be made (issue 64: Ubuntu 24.04's default,
 * containers, HPC nodes without user namespaces), a run's replicas are started with this
 * library in LD_PRELOAD (seedacme/runtime/isolation.py). Courier 0.5 and Reverb 0.7 ask
 * for [::]:port in their C++ with no way to pass an address; every such bind() goes
 * through libc, so it arrives here:
 *
 *  - AF_INET 0.0.0.0 becomes 127.0.0.1.
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
 * Only the replicas (and what they start: children inherit LD_PRELOAD) carry it. The
 * launcher process does not: the cluster launcher's mutual-TLS endpoint deliberately
 * binds the host's address there. What this does not cover, checked instead at start-up
 * by reading what actually listens (isolation.non_loopback_listeners): binaries linked
 * statically or issuing the bind syscall directly, and setuid programs (ld.so drops
 * LD_PRELOAD for them).
 *
 * SEEDACME_LOOPBACK_BIND_VERBOSE=1 logs every rewrite to stderr. The exported symbol
 * seedacme_loopback_bind_active lets a process see that the library is loaded.
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

int seedacme_loopback_bind_active = 1;

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*listen_fn)(int, int);
static bind_fn real_bind;
static listen_fn real_listen;
static int refused_once, verbose;

__attribute__((constructor)) static void resolve(void) {
  real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
  real_listen = (listen_fn)dlsym(RTLD_NEXT, "listen");
  const char *v = getenv("SEEDACME_LOOPBACK_BIND_VERBOSE");
  verbose = v && *v && strcmp(v, "0") != 0;
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
      in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (verbose) say("moved to 127.0.0.1: bind to", sa);
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
        in6.sin6_addr.s6_addr32[3] = htonl(INADDR_LOOPBACK);
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

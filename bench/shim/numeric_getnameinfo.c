/* Makes every getnameinfo(3) of the process it is preloaded into numeric
 * (NI_NUMERICHOST | NI_NUMERICSERV): no reverse DNS lookup, whatever the
 * caller asked for.
 *
 * torch's libuv TCPStore server looks up the name of every connection it
 * accepts, on its only event-loop thread. Where the resolver drops queries
 * (this project's build machines: 7 of 400 single lookups timed out at
 * 5 s) the server then stalls for 5 s at a time, and a benchmark times the
 * resolver instead of the server. coordstore-bench preloads this into
 * torch's server so every peer resolves numerically (coordstore does no
 * lookup at all); see bench/results/README.md, "PyTorch".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <sys/socket.h>

typedef int (*getnameinfo_fn)(const struct sockaddr *, socklen_t, char *, socklen_t, char *,
                              socklen_t, int);

int getnameinfo(const struct sockaddr *sa, socklen_t salen, char *host, socklen_t hostlen,
                char *serv, socklen_t servlen, int flags) {
    static getnameinfo_fn real;
    if (!real) {
        real = (getnameinfo_fn)dlsym(RTLD_NEXT, "getnameinfo");
        if (!real) {
            return EAI_FAIL;
        }
    }
    return real(sa, salen, host, hostlen, serv, servlen, flags | NI_NUMERICHOST | NI_NUMERICSERV);
}

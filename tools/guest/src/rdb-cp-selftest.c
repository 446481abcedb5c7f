/*
 * rdb-cp-selftest: the remusdb_cp module's selftests, run inside the
 * guest as root (kselftest style: TAP on stdout, exit 0 only if every
 * test passed).  Each test says what it proves:
 *
 *   - the options round-trip on a connected TCP socket (IPv4 and IPv6);
 *   - the mark is on the wire: a packet socket on lo sees our segments
 *     with the module's DSCP while protected and DSCP 0 after;
 *   - an unprivileged owner may protect its own socket;
 *   - what must be refused is (UDP; a socket with a DSCP of its own);
 *   - the module unloads with a protected socket open, the socket keeps
 *     working, and the module loads again.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/ip6.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "remusdb_cp.h"

static int tests_run, tests_failed;

static void report(bool ok, const char *name, const char *detail)
{
	tests_run++;
	if (!ok)
		tests_failed++;
	printf("%sok %d - %s%s%s\n", ok ? "" : "not ", tests_run, name,
	       detail && *detail ? " # " : "", detail ? detail : "");
	fflush(stdout);
}

static long read_sysfs(const char *name)
{
	char path[128];
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/kernel/remusdb_cp/%s", name);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%ld", &v) != 1)
		v = -1;
	fclose(f);
	return v;
}

/* A connected TCP pair over loopback; *server is the accepted end. */
static bool tcp_pair(int family, int *client, int *server)
{
	struct sockaddr_storage ss = { 0 };
	socklen_t len;
	int l = socket(family, SOCK_STREAM, 0), one = 1;

	if (l < 0)
		return false;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (family == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;
		a->sin_family = AF_INET;
		a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		len = sizeof(*a);
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		a->sin6_family = AF_INET6;
		a->sin6_addr = in6addr_loopback;
		len = sizeof(*a);
	}
	if (bind(l, (struct sockaddr *)&ss, len) < 0 || listen(l, 1) < 0 ||
	    getsockname(l, (struct sockaddr *)&ss, &len) < 0) {
		close(l);
		return false;
	}
	*client = socket(family, SOCK_STREAM, 0);
	if (*client < 0 || connect(*client, (struct sockaddr *)&ss, len) < 0) {
		close(l);
		return false;
	}
	*server = accept(l, NULL, NULL);
	close(l);
	return *server >= 0;
}

static int tos_of(int fd, int family)
{
	int v = -1;
	socklen_t len = sizeof(v);

	if (family == AF_INET)
		getsockopt(fd, IPPROTO_IP, IP_TOS, &v, &len);
	else
		getsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &v, &len);
	return v;
}

static void test_round_trip(int family, long dscp)
{
	int c, s;
	char detail[160];
	const char *name = family == AF_INET ? "IPv4 TCP: protect, state, deprotect round-trip"
					     : "IPv6 TCP: protect, state, deprotect round-trip";

	if (!tcp_pair(family, &c, &s)) {
		report(false, name, "no loopback TCP pair");
		return;
	}
	long before = read_sysfs("protects");
	int s0 = remusdb_cp_is_protected(s);
	int p = remusdb_cp_protect(s);
	int s1 = remusdb_cp_is_protected(s);
	int tos1 = tos_of(s, family);
	int d = remusdb_cp_deprotect(s);
	int s2 = remusdb_cp_is_protected(s);
	int tos2 = tos_of(s, family);
	long after = read_sysfs("protects");

	snprintf(detail, sizeof(detail), "state %d/%d/%d, protect %d, deprotect %d, tos %#x/%#x, "
		 "protects %ld->%ld", s0, s1, s2, p, d, tos1, tos2, before, after);
	report(s0 == 0 && p == 0 && s1 == 1 && d == 0 && s2 == 0 && tos1 == dscp << 2 &&
	       (tos2 & ~3) == 0 && after == before + 1, name, detail);
	close(c);
	close(s);
}

/*
 * Sends `n` bytes on `fd` and returns the DSCP of the first IPv4 TCP
 * segment with data from `port` that the packet socket sees on lo, or -1.
 */
static int dscp_on_the_wire(int capture, int fd, unsigned short port, size_t n)
{
	char buf[2048] = { 0 };
	uint8_t frame[4096];

	if (send(fd, buf, n, 0) != (ssize_t)n)
		return -1;
	for (int tries = 0; tries < 64; tries++) {
		struct pollfd p = { .fd = capture, .events = POLLIN };
		if (poll(&p, 1, 500) <= 0)
			return -1;
		ssize_t got = recv(capture, frame, sizeof(frame), 0);
		if (got < (ssize_t)(sizeof(struct iphdr) + sizeof(struct tcphdr)))
			continue;
		struct iphdr *ip = (struct iphdr *)frame;
		if (ip->version != 4 || ip->protocol != IPPROTO_TCP)
			continue;
		struct tcphdr *tcp = (struct tcphdr *)(frame + ip->ihl * 4);
		size_t payload = ntohs(ip->tot_len) - ip->ihl * 4 - tcp->doff * 4;
		if (ntohs(tcp->source) == port && payload > 0)
			return ip->tos >> 2;
	}
	return -1;
}

static void test_mark_on_the_wire(long dscp)
{
	int c, s;
	struct sockaddr_in me;
	socklen_t len = sizeof(me);
	char detail[160];
	const char *name = "the mark is on the wire (packet socket on lo)";
	/* Cooked IP frames of lo only, both directions. */
	int capture = socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_IP));
	struct sockaddr_ll ll = { .sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_IP),
				  .sll_ifindex = (int)if_nametoindex("lo") };

	if (capture < 0 || bind(capture, (struct sockaddr *)&ll, sizeof(ll)) < 0 ||
	    !tcp_pair(AF_INET, &c, &s) || getsockname(s, (struct sockaddr *)&me, &len) < 0) {
		report(false, name, "no capture socket or TCP pair");
		return;
	}
	int plain = dscp_on_the_wire(capture, s, ntohs(me.sin_port), 100);
	remusdb_cp_protect(s);
	int marked = dscp_on_the_wire(capture, s, ntohs(me.sin_port), 200);
	remusdb_cp_deprotect(s);
	int after = dscp_on_the_wire(capture, s, ntohs(me.sin_port), 300);

	snprintf(detail, sizeof(detail), "DSCP before %d, protected %d, after %d", plain, marked,
		 after);
	report(plain == 0 && marked == dscp && after == 0, name, detail);
	close(capture);
	close(c);
	close(s);
}

static void test_unprivileged_owner(void)
{
	pid_t pid = fork();
	int status = -1;

	if (pid == 0) {
		int c, s;
		if (setgid(65534) < 0 || setuid(65534) < 0)
			_exit(2);
		if (!tcp_pair(AF_INET, &c, &s))
			_exit(3);
		_exit(remusdb_cp_protect(s) == 0 && remusdb_cp_is_protected(s) == 1 &&
		      remusdb_cp_deprotect(s) == 0 ? 0 : 1);
	}
	waitpid(pid, &status, 0);
	char detail[64];
	snprintf(detail, sizeof(detail), "child exit %d", WIFEXITED(status) ?
		 WEXITSTATUS(status) : -1);
	report(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	       "an unprivileged owner (uid 65534) protects its own socket", detail);
}

static void test_refusals(void)
{
	int udp = socket(AF_INET, SOCK_DGRAM, 0), c, s;
	int u = remusdb_cp_protect(udp), uerr = errno;
	char detail[128];

	report(u == -1 && uerr == EOPNOTSUPP, "a UDP socket is refused (EOPNOTSUPP)",
	       strerror(uerr));
	close(udp);
	if (!tcp_pair(AF_INET, &c, &s)) {
		report(false, "a socket with its own DSCP is refused (EBUSY)", "no TCP pair");
		return;
	}
	int tos = 0x20; /* CS1, chosen by the socket's owner */
	setsockopt(s, IPPROTO_IP, IP_TOS, &tos, sizeof(tos));
	long refused = read_sysfs("refused");
	int r = remusdb_cp_protect(s), rerr = errno;
	snprintf(detail, sizeof(detail), "%s, tos %#x, refused %ld->%ld", strerror(rerr),
		 tos_of(s, AF_INET), refused, read_sysfs("refused"));
	report(r == -1 && rerr == EBUSY && tos_of(s, AF_INET) == 0x20 &&
	       read_sysfs("refused") == refused + 1,
	       "a socket with its own DSCP is refused (EBUSY) and keeps it", detail);
	close(c);
	close(s);
}

static void test_unload_with_protected_socket(long dscp)
{
	int c, s;
	char detail[160], byte = 'x';

	if (!tcp_pair(AF_INET, &c, &s) || remusdb_cp_protect(s) != 0) {
		report(false, "unload with a protected socket open", "cannot protect");
		return;
	}
	int rm = (int)syscall(SYS_delete_module, "remusdb_cp", O_NONBLOCK);
	int rmerr = errno;
	bool gone = read_sysfs("dscp") == -1;
	/* Without the module the socket works, still marked (held: the safe side). */
	bool works = send(s, &byte, 1, 0) == 1 && recv(c, &byte, 1, 0) == 1;
	int tos = tos_of(s, AF_INET);
	int absent = remusdb_cp_protect(s); /* 1: no module */
	close(c);
	close(s);
	int back = system("modprobe remusdb_cp");
	snprintf(detail, sizeof(detail), "delete_module %d (%s), gone %d, works %d, tos %#x, "
		 "protect without module %d, modprobe %d, dscp after %ld", rm,
		 rm ? strerror(rmerr) : "ok", gone, works, tos, absent, back, read_sysfs("dscp"));
	report(rm == 0 && gone && works && tos == dscp << 2 && absent == 1 && back == 0 &&
	       read_sysfs("dscp") == dscp,
	       "the module unloads with a protected socket open and loads again", detail);
}

int main(void)
{
	long dscp = read_sysfs("dscp");

	printf("TAP version 13\n1..8\n");
	report(dscp >= 1 && dscp <= 63, "the module is loaded (/sys/kernel/remusdb_cp/dscp)",
	       dscp < 0 ? "absent" : NULL);
	if (dscp < 0) {
		printf("Bail out! remusdb_cp is not loaded\n");
		return 1;
	}
	test_round_trip(AF_INET, dscp);
	test_round_trip(AF_INET6, dscp);
	test_mark_on_the_wire(dscp);
	test_unprivileged_owner();
	test_refusals();
	test_unload_with_protected_socket(dscp);
	printf("# %d of %d passed\n", tests_run - tests_failed, tests_run);
	return tests_failed ? 1 : 0;
}

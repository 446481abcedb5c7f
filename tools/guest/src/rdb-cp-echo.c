/*
 * rdb-cp-echo: a line server in the guest that shows the host relay both
 * kinds of output commit protection knows, on one connection.
 *
 *   rdb-cp-echo [PORT]      (default 7007; one client at a time)
 *
 * Each line the client sends comes back.  A line that starts with 'P' is
 * answered the way a patched DBMS answers a COMMIT: the socket is
 * protected (remusdb_cp.h) before the reply is written and deprotected
 * after, so the reply's segments carry the module's mark.  Any other
 * line is answered unprotected.  "QUIT" ends the connection.  A reply
 * starts with "P " or "U " and says which it was, and with "N " when the
 * module is absent (nothing could be protected).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "remusdb_cp.h"

static int serve(int fd)
{
	FILE *in = fdopen(dup(fd), "r");
	char line[512], reply[600];
	int one = 1;

	if (!in)
		return -1;
	/* One segment per reply, so each reply's mark is its own. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	while (fgets(line, sizeof(line), in)) {
		if (strncmp(line, "QUIT", 4) == 0)
			break;
		int n;
		if (line[0] == 'P') {
			int rc = remusdb_cp_protect(fd);
			n = snprintf(reply, sizeof(reply), "%s %s", rc == 0 ? "P" : rc == 1 ? "N" : "E",
				     line);
			if (write(fd, reply, (size_t)n) != n)
				break;
			if (rc == 0)
				remusdb_cp_deprotect(fd);
		} else {
			n = snprintf(reply, sizeof(reply), "U %s", line);
			if (write(fd, reply, (size_t)n) != n)
				break;
		}
	}
	fclose(in);
	return 0;
}

int main(int argc, char **argv)
{
	int port = argc > 1 ? atoi(argv[1]) : 7007, one = 1;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int l = socket(AF_INET, SOCK_STREAM, 0);

	if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 4) < 0) {
		perror("rdb-cp-echo: listen");
		return 1;
	}
	for (;;) {
		int c = accept(l, NULL, NULL);
		if (c < 0)
			continue;
		serve(c);
		close(c);
	}
}

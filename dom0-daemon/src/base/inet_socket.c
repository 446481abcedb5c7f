/* IPv4 TCP helpers (inet_socket.h). */
#include "base/inet_socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int inet_parse_address(const char *text, bool any_port, struct sockaddr_in *out,
		       char *err, size_t errlen)
{
	char host[64];
	const char *colon = strrchr(text, ':');
	char *end;

	memset(out, 0, sizeof(*out));
	if (!colon || colon == text || (size_t)(colon - text) >= sizeof(host)) {
		snprintf(err, errlen, "'%.80s' is not ADDR:PORT", text);
		return -1;
	}
	memcpy(host, text, (size_t)(colon - text));
	host[colon - text] = '\0';
	errno = 0;
	unsigned long port = strtoul(colon + 1, &end, 10);
	if (errno || end == colon + 1 || *end || (port == 0 && !any_port) ||
	    port > 65535) {
		snprintf(err, errlen, "'%.80s': the port must be %s..65535", text,
			 any_port ? "0" : "1");
		return -1;
	}
	if (inet_pton(AF_INET, host, &out->sin_addr) != 1) {
		snprintf(err, errlen, "'%.80s': '%s' is not an IPv4 address", text, host);
		return -1;
	}
	out->sin_family = AF_INET;
	out->sin_port = htons((uint16_t)port);
	return 0;
}

int inet_listen(const char *text, char *err, size_t errlen)
{
	struct sockaddr_in addr;
	int one = 1;

	if (inet_parse_address(text, true, &addr, err, errlen) < 0)
		return -1;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
	    listen(fd, 16) < 0) {
		snprintf(err, errlen, "cannot listen on %s: %s", text, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

uint16_t inet_local_port(int fd)
{
	struct sockaddr_in addr;
	socklen_t len = sizeof(addr);

	if (getsockname(fd, (struct sockaddr *)&addr, &len) < 0 ||
	    addr.sin_family != AF_INET)
		return 0;
	return ntohs(addr.sin_port);
}

/*
 * IPv4 TCP helpers shared by the replication link and the NBD server's
 * TCP listeners: "ADDR:PORT" parsing and a non-blocking listener.  Only
 * IPv4, because the lab's hosts talk over one IPv4 bridge and every
 * address in the configuration is written that way.
 */
#ifndef REMUSDB_INET_SOCKET_H
#define REMUSDB_INET_SOCKET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sockaddr_in;

/*
 * "ADDR:PORT" (IPv4) to a sockaddr; -1 with a message in err when it is
 * not one.  A missing port is an error; port 0 ("any free port", for a
 * listener) is accepted only with any_port.
 */
int inet_parse_address(const char *text, bool any_port, struct sockaddr_in *out,
		       char *err, size_t errlen);
/*
 * A non-blocking, close-on-exec listener on text ("ADDR:PORT", port 0
 * picks a free port: see inet_local_port).  Returns the fd, or -1 with
 * a message in err.
 */
int inet_listen(const char *text, char *err, size_t errlen);
/* The local port fd is bound to, 0 if unknown. */
uint16_t inet_local_port(int fd);

#endif

/*
 * Telling the primary why its session ends (ERROR) before the connection
 * closes.  A leaf of the backup: the frame handlers refuse through it
 * without depending on the listener and session lifetime
 * (replication_server.c), which decide what the end means.
 */
#include <stdarg.h>
#include <stdio.h>

#include "base/log.h"
#include "backup/replication_internal.h"

void session_send_error(struct session *ss, uint16_t code, const char *reason)
{
	ss->refused = true;
	log_warn("replication: refusing %s: %s", ss->peer, reason);
	if (repl_put_error(repl_conn_out(ss->conn), code, reason) < 0)
		log_error("replication: cannot queue the ERROR to %s (out of memory): it "
			  "sees the connection close without a reason", ss->peer);
	repl_conn_flush(ss->conn);
}

int session_protocol_error(struct session *ss, const char *fmt, ...)
{
	char why[300];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (ss->replica) {
		snprintf(ss->replica->error, sizeof(ss->replica->error), "%s", why);
		log_error("vm %s: %s", ss->replica->name, why);
	}
	session_send_error(ss, REPL_ERR_PROTOCOL, why);
	return -1;
}

/*
 * Asynchronous QMP client on the event loop, built on jansson.
 *
 * QEMU exposes one QMP socket for remusdbd (a second one serves the CLI
 * tools), so the daemon owns its monitor connection for its whole life.
 * The client connects (retrying while the socket is absent), reads the
 * greeting, negotiates qmp_capabilities, then sends queued commands in
 * order, matching replies by "id".
 */
#ifndef REMUSDB_QMP_H
#define REMUSDB_QMP_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/event_loop.h"

struct qmp_client;

/*
 * reply is the whole reply object ({"return":..} or {"error":..}), or NULL
 * when the connection was lost before the reply arrived.  Borrowed.
 */
typedef void (*qmp_reply_cb)(struct qmp_client *qmp, json_t *reply, void *data);
/*
 * event name and its "data" member (may be NULL); borrowed.  qemu_time_us
 * is the event's "timestamp", microseconds since the epoch on QEMU's
 * clock (g_get_real_time: CLOCK_REALTIME), 0 when it has none: when QEMU
 * did it, which the event's arrival here follows by however long QEMU's
 * monitor and our loop took.
 */
typedef void (*qmp_event_cb)(struct qmp_client *qmp, const char *event,
			     json_t *data, int64_t qemu_time_us, void *user);

struct qmp_client *qmp_client_create(event_loop *loop, const char *socket_path,
				     qmp_event_cb on_event, void *user);
/*
 * Drops outstanding commands without calling their callbacks (data given
 * to qmp_execute_owning() is freed).  May be called from inside a reply or
 * event callback.
 */
void qmp_client_destroy(struct qmp_client *qmp);

/*
 * arguments may be NULL; its reference is stolen. Returns 0 or -1.
 * Commands issued while disconnected wait for the next connection; a
 * disconnect fails every outstanding command (reply NULL).
 */
int qmp_execute(struct qmp_client *qmp, const char *command, json_t *arguments,
		qmp_reply_cb cb, void *data);
/*
 * As qmp_execute(), for data the command owns: the callback frees it when
 * called, and drop_data frees it when the command is dropped unanswered
 * (the client destroyed before QEMU replied, or before it ever connected).
 * On failure (-1) data stays the caller's.
 */
int qmp_execute_owning(struct qmp_client *qmp, const char *command, json_t *arguments,
		       qmp_reply_cb cb, void *data, void (*drop_data)(void *data));

int qmp_client_ready(const struct qmp_client *qmp); /* capabilities done */
/*
 * True when the last attempt to connect failed: no QEMU listens on the
 * socket (never started, or gone: a killed QEMU leaves its socket file,
 * which refuses connections).  remusdbd's monitor socket is its own, so
 * nothing else can be holding it.
 */
bool qmp_client_nobody_listens(const struct qmp_client *qmp);
/*
 * The caller knows QEMU listens now (e.g. its -incoming socket answered,
 * which QEMU opens after its monitors): connect at once instead of at the
 * next reconnect poll, up to RECONNECT_DELAY_MS later.  Nothing happens
 * while connected; a failed attempt polls on as before.
 */
void qmp_client_connect_now(struct qmp_client *qmp);
/*
 * QEMU's pid, from the connected socket's peer credentials; 0 while
 * disconnected.  For killing a QEMU that no longer obeys `quit`.
 */
pid_t qmp_client_peer_pid(const struct qmp_client *qmp);
/* "major.minor.micro" from the greeting, or "" before it. */
const char *qmp_client_qemu_version(const struct qmp_client *qmp);

/*
 * Splits complete QMP messages off the front of a byte stream.  Returns a
 * new json_t for the next complete object and sets *consumed, returns NULL
 * with *consumed = 0 when more bytes are needed, and returns NULL with
 * *consumed > 0 when the line is not a JSON object (skip it, log it).
 * Exposed for unit tests and fuzzing.
 */
json_t *qmp_parse_message(const char *data, size_t len, size_t *consumed);

#endif

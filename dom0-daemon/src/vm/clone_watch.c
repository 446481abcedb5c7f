/* A clone's postcopy watchdog; see clone_watch.h. */
#include "vm/clone_watch.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "qemu/qmp.h"

struct clone_watch {
	event_loop *loop;
	struct qmp_client *qmp;
	char vm[64];
	long long timer;
	int64_t started_ms, deadline_ms;
	int64_t postcopy_ms, complete_ms;
	bool pending;
	pid_t qemu_pid;        /* taken when failing: QEMU may not obey quit */
	int64_t quit_sent_ms;
	char state[32];
	char error[256];
};

static void fail(struct clone_watch *w, const char *why)
{
	snprintf(w->error, sizeof(w->error), "%s", why);
	snprintf(w->state, sizeof(w->state), "failed");
	log_error("vm %s: CLONE FAILED: %s; stopping its QEMU (the parent is not "
		  "affected)", w->vm, why);
	w->qemu_pid = qmp_client_peer_pid(w->qmp);
	w->quit_sent_ms = monotonic_ms();
	qmp_execute(w->qmp, "quit", NULL, NULL, NULL);
}

/*
 * A postcopy destination whose source is gone does not finish `quit`
 * (its migration threads wait on the lost pages); it is killed once this
 * grace period is over.
 */
#define QUIT_GRACE_MS 1000

static long kill_if_still_there(struct clone_watch *w)
{
	if (!w->qemu_pid || kill(w->qemu_pid, 0) < 0)
		return TIMER_DONE;
	if (monotonic_ms() - w->quit_sent_ms < QUIT_GRACE_MS)
		return CLONE_WATCH_POLL_MS;
	log_warn("vm %s: QEMU (pid %d) did not quit within %d ms; killing it", w->vm,
		 (int)w->qemu_pid, QUIT_GRACE_MS);
	kill(w->qemu_pid, SIGKILL);
	return TIMER_DONE;
}

static void on_reply(struct qmp_client *qmp, json_t *reply, void *data)
{
	struct clone_watch *w = data;
	const char *status = json_string_value(
		json_object_get(json_object_get(reply, "return"), "status"));

	w->pending = false;
	if (!strcmp(w->state, "failed") || !strcmp(w->state, "complete"))
		return;
	if (!status)
		status = "none";
	if (!strcmp(status, "completed")) {
		w->complete_ms = monotonic_ms();
		snprintf(w->state, sizeof(w->state), "complete");
		log_info("vm %s: clone has every page (%lld ms after the watch began)",
			 w->vm, (long long)(w->complete_ms - w->started_ms));
		return;
	}
	if (!strcmp(status, "postcopy-active") && !w->postcopy_ms) {
		w->postcopy_ms = monotonic_ms();
		snprintf(w->state, sizeof(w->state), "postcopy-active");
	}
	if (!strcmp(status, "postcopy-paused"))
		fail(w, "its page source went away (postcopy-paused): pages it "
		     "has not received can never arrive");
	else if (!strcmp(status, "failed") || !strcmp(status, "cancelled"))
		fail(w, "its incoming migration failed");
}

static long on_timer(event_loop *loop, long long id, void *data)
{
	struct clone_watch *w = data;
	char why[160];

	if (!strcmp(w->state, "failed")) {
		long next = kill_if_still_there(w);

		if (next == TIMER_DONE)
			w->timer = 0;
		return next;
	}
	if (!strcmp(w->state, "complete")) {
		w->timer = 0;
		return TIMER_DONE;
	}
	if (monotonic_ms() - w->started_ms > w->deadline_ms) {
		snprintf(why, sizeof(why), "it did not get every page within %ld s "
			 "(a page source that went silent)", (long)(w->deadline_ms / 1000));
		fail(w, why);
		return CLONE_WATCH_POLL_MS;
	}
	if (!w->pending && qmp_client_ready(w->qmp) &&
	    qmp_execute(w->qmp, "query-migrate", NULL, on_reply, w) == 0)
		w->pending = true;
	return CLONE_WATCH_POLL_MS;
}

struct clone_watch *clone_watch_start(event_loop *loop, struct qmp_client *qmp,
				      const char *vm_name, long deadline_ms)
{
	struct clone_watch *w = calloc(1, sizeof(*w));

	if (!w)
		return NULL;
	w->loop = loop;
	w->qmp = qmp;
	snprintf(w->vm, sizeof(w->vm), "%s", vm_name);
	snprintf(w->state, sizeof(w->state), "waiting");
	w->started_ms = monotonic_ms();
	w->deadline_ms = deadline_ms > 0 ? deadline_ms : CLONE_WATCH_DEFAULT_DEADLINE_MS;
	w->timer = event_loop_add_timer(loop, CLONE_WATCH_POLL_MS, on_timer, w);
	if (w->timer < 0) {
		free(w);
		return NULL;
	}
	return w;
}

void clone_watch_destroy(struct clone_watch *w)
{
	if (!w)
		return;
	if (w->timer)
		event_loop_del_timer(w->loop, w->timer);
	free(w);
}

json_t *clone_watch_status_json(const struct clone_watch *w)
{
	return json_pack("{s:s, s:s, s:o, s:o}", "state", w->state, "error", w->error,
			 "postcopy_after_ms", w->postcopy_ms ?
			 json_integer(w->postcopy_ms - w->started_ms) : json_null(),
			 "complete_after_ms", w->complete_ms ?
			 json_integer(w->complete_ms - w->started_ms) : json_null());
}

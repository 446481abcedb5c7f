/*
 * Automatic re-protection: a primary that lost its backup and runs on
 * unprotected (etcd left the VM with it) keeps the settings `protect`
 * was given and tries the backup again, after 1 s, 2 s, 4 s ... up to
 * 30 s apart (--reprotect-first-ms, --reprotect-max-ms), until it
 * answers.  Then the same protection starts again as `protect` would
 * start it, and it resyncs the disk by changed extents when the backup's
 * copy is still the one it last protected to (protection_disk_base.c and
 * backup/replica_disk_base.c decide that, as for a failback).
 *
 * A try is a non-blocking connect to the backup's replication port,
 * watched by the loop with a timeout, like the protection's own connect:
 * a backup that is down costs a refused or unanswered connect, not a
 * whole protection started and failed (an etcd call, an encoder, a read
 * index).  Only when the port answers does a new protection start; it
 * takes this one's place as the VM's attachment and inherits the gap, so
 * that status shows how long the VM ran unprotected, how many tries it
 * took, and the last one's error.  If that protection fails before the
 * backup took it (the backup went again, etcd did not answer), it goes
 * on trying the same way; a refusal or a fence ends the tries
 * (reprotect_policy.h says why), and so does `unprotect`.
 *
 * A restart of this daemon does not end the tries: `protect` wrote its
 * settings to the state dir (protect_settings.h), the restarted daemon
 * reads them back (protection_recover, protection_restore) and the gap
 * it opens is tried like any other; every ending that is never retried
 * removes them, so that a restart cannot undo a fence or an unprotect.
 *
 * etcd: the primary kept the VM's ownership when it went unprotected
 * (the compare-and-swap that let it run on), and the new protection's
 * claim finds this host the owner and changes nothing.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "primary/protect_settings.h"
#include "primary/protection_internal.h"

/* As long as the protection's own connect waits for the backup's answer. */
#define PROBE_TIMEOUT_MS 5000

static void stop_probe(struct protection *p)
{
	struct protection_reprotect *r = &p->reprotect;

	if (r->probe_timer)
		event_loop_del_timer(p->loop, r->probe_timer);
	r->probe_timer = 0;
	if (r->probing) {
		event_loop_unwatch(p->loop, r->probe_fd);
		close(r->probe_fd);
	}
	r->probing = false;
}

static void stop_trying(struct protection *p)
{
	struct protection_reprotect *r = &p->reprotect;

	if (r->timer)
		event_loop_del_timer(p->loop, r->timer);
	r->timer = 0;
	stop_probe(p);
}

int protection_reprotect_keep(struct protection *p, const struct protect_request *req)
{
	struct protection_reprotect *r = &p->reprotect;

	r->req = *req;
	/*
	 * A re-protection copies only what changed when it can: --full-copy
	 * asked for the first copy, and a page trace is one benchmark's.
	 */
	r->req.full_copy = false;
	r->req.trace_pages[0] = '\0';
	r->req.qemu_argv = req->qemu_argv ? json_deep_copy(req->qemu_argv) : NULL;
	if (req->qemu_argv && !r->req.qemu_argv)
		return -1;
	r->have_req = true;
	return 0;
}

void protection_reprotect_end(struct protection *p)
{
	stop_trying(p);
	json_decref(p->reprotect.req.qemu_argv);
	p->reprotect.req.qemu_argv = NULL;
	p->reprotect.have_req = false;
}

static double wall_clock_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void open_gap(struct protection *p)
{
	struct reprotect_gap *g = &p->reprotect.gap;

	g->open = true;
	g->since_us = monotonic_us();
	g->since_unix = wall_clock_s();
	g->attempts = 0;
	g->last_error[0] = '\0';
}

void protection_reprotect_restored(struct protection *p)
{
	p->reprotect.restored = true;
	open_gap(p);
}

void protection_reprotect_protected(struct protection *p)
{
	struct protection_reprotect *r = &p->reprotect;
	struct reprotect_gap *g = &r->gap;

	r->reached_protected = true;
	if (!g->open)
		return;
	g->open = false;
	g->reprotections++;
	g->last_gap_s = (double)(monotonic_us() - g->since_us) / 1e6;
	log_warn("vm %s: RE-PROTECTED by %s after %.1f s unprotected (%u tries)%s", p->name,
		 p->backup, g->last_gap_s, g->attempts,
		 r->restored ? ", counted from this daemon's restart" : "");
}

void protection_reprotect_note_unreachable(struct protection *p)
{
	p->reprotect.notes.unreachable = true;
}

void protection_reprotect_note_refused(struct protection *p, uint16_t code)
{
	p->reprotect.notes.refused = true;
	p->reprotect.notes.refused_code = code;
}

static void schedule(struct protection *p);

static void tried_and_failed(struct protection *p, const char *why)
{
	struct reprotect_gap *g = &p->reprotect.gap;

	g->attempts++;
	snprintf(g->last_error, sizeof(g->last_error), "%s", why);
	schedule(p);
}

#define QEMU_GONE "no QEMU runs the VM here (start it with tools/remusdb-vm start)"

/* The backup's port answered: the protection starts again, in this one's place. */
static void launch(struct protection *p)
{
	struct protection_reprotect *r = &p->reprotect;
	char err[512];

	/*
	 * A restarted daemon can find the VM's QEMU gone (the host died with
	 * it): protecting nothing would copy the whole disk to the backup for
	 * a VM that does not run.  Tries go on at the backoff's pace, and the
	 * VM's restart (tools/remusdb-vm start) replaces this protection.
	 */
	if (vm_qemu_gone(p->vm)) {
		if (strcmp(r->gap.last_error, QEMU_GONE) != 0)
			log_warn("vm %s: not protecting again: %s", p->name, QEMU_GONE);
		tried_and_failed(p, QEMU_GONE);
		return;
	}
	r->gap.attempts++;
	log_warn("vm %s: the backup %s answers after %.1f s unprotected: protecting again "
		 "(try %u)", p->name, p->backup,
		 (double)(monotonic_us() - r->gap.since_us) / 1e6, r->gap.attempts);
	struct protection *next = protection_start(p->loop, p->settings, p->vm, &r->req, err,
						   sizeof(err));
	if (!next) {
		log_error("vm %s: re-protection refused here: %s", p->name, err);
		snprintf(r->gap.last_error, sizeof(r->gap.last_error), "%s", err);
		schedule(p);
		return;
	}
	next->reprotect.gap = r->gap;
	next->reprotect.is_attempt = true;
	next->reprotect.restored = r->restored;
	protection_attach(p->vm, next); /* p is destroyed here */
}

static long on_launch(event_loop *loop, long long id, void *data)
{
	struct protection *p = data;

	p->reprotect.timer = 0;
	launch(p);
	return TIMER_DONE;
}

static void on_probe_timeout_or_ready(struct protection *p, int fd_error, bool timed_out)
{
	struct protection_reprotect *r = &p->reprotect;
	char why[400];

	stop_probe(p);
	if (!timed_out && !fd_error) {
		/*
		 * From a timer, not from this descriptor's handler: the launch
		 * frees p and opens descriptors, and the loop's batch of ready
		 * descriptors may still name this one's number.
		 */
		r->timer = event_loop_add_timer(p->loop, 0, on_launch, p);
		r->next_at_us = monotonic_us();
		if (r->timer < 0) {
			r->timer = 0;
			tried_and_failed(p, "cannot schedule the re-protection (out of memory)");
		}
		return;
	}
	if (timed_out)
		snprintf(why, sizeof(why), "no answer from the backup at %s within %d ms", p->backup,
			 PROBE_TIMEOUT_MS);
	else
		snprintf(why, sizeof(why), "cannot connect to the backup at %s: %s", p->backup,
			 strerror(fd_error));
	tried_and_failed(p, why);
}

static void on_probe_writable(event_loop *loop, int fd, void *data, int ready)
{
	struct protection *p = data;
	int e = 0;
	socklen_t len = sizeof(e);

	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0)
		e = errno;
	on_probe_timeout_or_ready(p, e, false);
}

static long on_probe_timeout(event_loop *loop, long long id, void *data)
{
	struct protection *p = data;

	p->reprotect.probe_timer = 0;
	on_probe_timeout_or_ready(p, 0, true);
	return TIMER_DONE;
}

/* One try: a non-blocking connect, answered on the loop (never waited for here). */
static void probe(struct protection *p)
{
	struct protection_reprotect *r = &p->reprotect;
	struct sockaddr_in addr;
	char err[256], why[400];

	if (repl_parse_address(p->backup, &addr, err, sizeof(err)) < 0) {
		tried_and_failed(p, err);
		return;
	}
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(why, sizeof(why), "socket: %s", strerror(errno));
		tried_and_failed(p, why);
		return;
	}
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 && errno != EINPROGRESS) {
		int e = errno;
		close(fd);
		on_probe_timeout_or_ready(p, e, false);
		return;
	}
	r->probe_fd = fd;
	r->probing = true;
	r->probe_timer = event_loop_add_timer(p->loop, PROBE_TIMEOUT_MS, on_probe_timeout, p);
	if (r->probe_timer < 0 ||
	    event_loop_watch(p->loop, fd, EV_WRITABLE, on_probe_writable, p) < 0) {
		r->probe_timer = r->probe_timer < 0 ? 0 : r->probe_timer;
		stop_probe(p);
		tried_and_failed(p, "cannot watch the connection to the backup (out of memory)");
	}
}

static long on_try(event_loop *loop, long long id, void *data)
{
	struct protection *p = data;

	p->reprotect.timer = 0;
	probe(p);
	return TIMER_DONE;
}

static void schedule(struct protection *p)
{
	struct protection_reprotect *r = &p->reprotect;
	struct reprotect_backoff b = {
		.first_ms = p->settings->reprotect_first_ms,
		.max_ms = p->settings->reprotect_max_ms,
	};
	unsigned ms = reprotect_delay_ms(&b, r->gap.attempts);

	r->timer = event_loop_add_timer(p->loop, (long)ms, on_try, p);
	if (r->timer < 0) {
		r->timer = 0;
		snprintf(r->verdict, sizeof(r->verdict), "cannot schedule the next try (out of "
			 "memory): protect it again by hand");
		log_error("vm %s: %s", p->name, r->verdict);
		return;
	}
	r->next_at_us = monotonic_us() + (int64_t)ms * 1000;
	log_info("vm %s: trying the backup %s again in %u ms (%u tries so far)", p->name,
		 p->backup, ms, r->gap.attempts);
}

void protection_reprotect_ended(struct protection *p, enum protection_end end)
{
	struct protection_reprotect *r = &p->reprotect;
	struct reprotect_gap *g = &r->gap;
	bool trying = g->open;   /* this protection was a try, or was lost before */

	/* The operator's stop with no gap open changes nothing here (a fence keeps its word). */
	if (end == END_OPERATOR && !trying && !r->timer && !r->probing)
		return;
	stop_trying(p);
	end = reprotect_classify(end, &r->notes);
	memset(&r->notes, 0, sizeof(r->notes));
	struct reprotect_facts facts = {
		.enabled = p->settings->reprotect,
		.end = end,
		.was_protected = r->reached_protected || r->is_attempt || r->restored,
		.settings_known = r->have_req,
	};
	enum reprotect_verdict v = reprotect_decide(&facts);

	if (trying && end != END_OPERATOR && p->error[0])
		snprintf(g->last_error, sizeof(g->last_error), "%s", p->error);
	/* The VM runs on unprotected after a loss; the operator's stop or a fence ends that. */
	if (end == END_BACKUP_LOST && facts.was_protected && !g->open)
		open_gap(p);
	if (end == END_OPERATOR || end == END_FENCED)
		g->open = false;
	if (v != REPROTECT_RETRY) {
		/* Nothing tries any more: a restart must not start trying again. */
		protect_settings_delete(p->settings->state_dir, p->name);
		snprintf(r->verdict, sizeof(r->verdict), "%s", reprotect_verdict_why(v));
		if (trying || end == END_BACKUP_LOST)
			log_warn("vm %s: %s", p->name, r->verdict);
		return;
	}
	r->verdict[0] = '\0';
	if (!g->open)
		open_gap(p);
	/*
	 * A try that failed before the backup took it leaves the VM as it
	 * found it, running unprotected: "failed" would read as broken to
	 * the operator and to /primary, which a load balancer follows.
	 */
	if (p->state == ST_FAILED)
		protection_set_state(p, ST_UNPROTECTED);
	schedule(p);
}

static const char *reprotect_state(const struct protection *p)
{
	const struct protection_reprotect *r = &p->reprotect;

	if (r->probing)
		return "probing";
	if (r->timer)
		return "waiting";
	if (!r->gap.open)
		return "idle";
	return protection_finished(p) ? "stopped" : "reprotecting";
}

json_t *protection_reprotect_json(const struct protection *p)
{
	const struct protection_reprotect *r = &p->reprotect;
	const struct reprotect_gap *g = &r->gap;
	int64_t now = monotonic_us();
	json_t *o = json_pack("{s:b, s:s, s:I, s:I}",
			      "enabled", p->settings->reprotect,
			      "state", reprotect_state(p),
			      "attempts", (json_int_t)g->attempts,
			      "reprotections", (json_int_t)g->reprotections);

	if (!o)
		return json_null();
	json_object_set_new(o, "unprotected_since", g->open ? json_real(g->since_unix)
							     : json_null());
	json_object_set_new(o, "unprotected_seconds",
			    json_real(g->open ? (double)(now - g->since_us) / 1e6 : 0.0));
	json_object_set_new(o, "next_attempt_in_ms", r->timer ?
			    json_integer(r->next_at_us > now ? (r->next_at_us - now) / 1000 : 0)
			    : json_null());
	json_object_set_new(o, "last_error", g->last_error[0] ? json_string(g->last_error)
							      : json_null());
	json_object_set_new(o, "verdict", r->verdict[0] ? json_string(r->verdict) : json_null());
	json_object_set_new(o, "last_gap_seconds", g->reprotections ? json_real(g->last_gap_s)
								    : json_null());
	json_object_set_new(o, "is_reprotection", json_boolean(r->is_attempt));
	json_object_set_new(o, "after_restart", json_boolean(r->restored));
	return o;
}

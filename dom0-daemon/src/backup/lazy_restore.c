/*
 * A takeover's lazy restore (--restore lazy).  Why: the eager restore
 * writes every page of the image into QEMU before the VM may run, so
 * takeover grows with guest RAM.  Lazy, the backup's QEMU gets the device
 * state and runs at once; the image is served by the fork's postcopy
 * source (postcopy_source.h): pages the guest touches first, the rest
 * pushed behind.  The image must live until every page is out; then it
 * goes.
 */
#include "backup/lazy_restore.h"

#include <signal.h>
#include <unistd.h>

#include "base/log.h"
#include "nbd/nbd_server.h"
#include "relay/net_relay.h"
#include "backup/replica.h"

static long end_lazy_restore(event_loop *loop, long long id, void *data)
{
	struct replica *r = data;

	r->lazy.end_timer = 0;
	postcopy_session_destroy(r->lazy.session);
	r->lazy.session = NULL;
	postcopy_fork_destroy(r->lazy.fork);
	r->lazy.fork = NULL;
	if (r->state == REPLICA_ACTIVE) {
		ram_image_destroy(r->image);
		r->image = NULL;
	}
	return TIMER_DONE;
}

void lazy_restore_stop(struct replica *r)
{
	if (r->lazy.end_timer)
		event_loop_del_timer(r->loop, r->lazy.end_timer);
	r->lazy.end_timer = 0;
	postcopy_session_destroy(r->lazy.session);
	r->lazy.session = NULL;
	postcopy_fork_destroy(r->lazy.fork);
	r->lazy.fork = NULL;
}

/*
 * The backup's QEMU can die while loading the device state of a lazy
 * restore (seen once in CI: a segfault in object_get_class 70 ms after
 * it started, before the guest ran).  The committed image is still
 * whole then, so the takeover goes on with a new QEMU and the eager
 * restore, if and only if nothing of the failed attempt can have
 * escaped: no write reached the disk replica and no frame left the
 * guest's NIC.  Otherwise the restart would resume the guest from the
 * checkpoint behind output clients already saw, and the takeover fails.
 */
static bool fall_back_to_eager(struct replica *r, const char *reason)
{
	struct vm *vm = vm_find(r->vms, r->name);
	struct nbd_export_stats disk = { 0 };
	struct net_relay_stats nic = { 0 };
	char err[256];

	if (r->lazy.fell_back || !vm || failover_resumed(r))
		return false;
	if (vm_export(vm))
		nbd_export_get_stats(vm_export(vm), &disk);
	if (vm_nic(vm))
		net_relay_get_stats(vm_nic(vm), &nic);
	if (disk.writes || disk.write_zeroes || disk.trims || nic.frames_from_guest) {
		log_error("vm %s: the failed lazy restore's guest already wrote %llu times to "
			  "its disk and sent %llu frames: no second attempt", r->name,
			  (unsigned long long)(disk.writes + disk.write_zeroes + disk.trims),
			  (unsigned long long)nic.frames_from_guest);
		return false;
	}
	r->lazy.fell_back = true;
	if (failover_qemu_pid(r) > 0)
		kill(failover_qemu_pid(r), SIGKILL); /* the daemon's reaper collects it */
	log_error("vm %s: LAZY RESTORE FAILED before the guest wrote or sent anything (%s): "
		  "taking over again with a new QEMU and the eager restore", r->name, reason);
	if (failover_restart_qemu(r, err, sizeof(err)) < 0)
		failover_failed(r, "after the failed lazy restore: %s", err);
	return true;
}

static void on_lazy_done(void *opaque, struct postcopy_session *s, bool ok,
			 const char *reason)
{
	struct replica *r = opaque;
	struct replica_lazy_restore *l = &r->lazy;

	postcopy_session_get_stats(s, &l->stats);
	l->done_us = monotonic_us();
	l->ok = ok;
	if (ok)
		log_info("vm %s: lazy restore complete: %llu pages, %llu asked for by the guest "
			 "(fault p50/p99 %u/%u us), %.1f ms after QEMU started", r->name,
			 (unsigned long long)l->stats.pages_total,
			 (unsigned long long)l->stats.pages_requested,
			 l->stats.latency_p50_us, l->stats.latency_p99_us,
			 (l->done_us - failover_qemu_spawned_us(r)) / 1000.0);
	else
		log_error("vm %s: LAZY RESTORE FAILED: %s; the guest cannot get the pages it "
			  "has not touched yet", r->name, reason);
	/* Not from inside the session's own callback. */
	l->end_timer = event_loop_add_timer(r->loop, 0, end_lazy_restore, r);
	if (l->end_timer < 0)
		l->end_timer = 0;
	if (!ok && r->state == REPLICA_FAILING_OVER && !fall_back_to_eager(r, reason))
		failover_failed(r, "lazy restore: %s", reason);
}

bool lazy_restore_wanted(const struct replica *r)
{
	return r->settings->restore_lazy && !r->lazy.fell_back;
}

void lazy_restore_start(struct replica *r, int fd)
{
	char err[256];

	r->lazy.fork = postcopy_fork_create(r->image, NULL, 0);
	if (!r->lazy.fork) {
		close(fd);
		failover_failed(r, "out of memory starting the lazy restore");
		return;
	}
	r->lazy.session = postcopy_session_start(r->loop, r->lazy.fork, fd, on_lazy_done, r, err,
						 sizeof(err));
	if (!r->lazy.session) {
		close(fd);
		failover_failed(r, "cannot restore the image lazily: %s", err);
		return;
	}
	/* The device state goes first; the guest runs as soon as QEMU has it. */
	failover_wait_for_resume(r, monotonic_us());
}

bool lazy_restore_serving(const struct replica *r)
{
	return r->lazy.session != NULL;
}

void lazy_restore_status(const struct replica *r, json_t *failover, int64_t qemu_spawned_us)
{
	const struct replica_lazy_restore *l = &r->lazy;

	const char *how = r->settings->restore_lazy ?
		(l->fell_back ? "lazy, then eager" : "lazy") :
		r->failover.ram_shared ? "shared" : "eager";

	json_object_set_new(failover, "restore", json_string(how));
	if (r->failover.ram_not_shared[0])
		json_object_set_new(failover, "not_shared",
				    json_string(r->failover.ram_not_shared));
	if (r->settings->restore_lazy && l->done_us)
		json_object_set_new(failover, "lazy", json_pack(
			"{s:b, s:f, s:I, s:I, s:i, s:i}", "complete", l->ok,
			"all_pages_ms", (l->done_us - qemu_spawned_us) / 1000.0,
			"pages_requested", (json_int_t)l->stats.pages_requested,
			"bytes_sent", (json_int_t)l->stats.bytes_sent,
			"fault_p50_us", (int)l->stats.latency_p50_us,
			"fault_p99_us", (int)l->stats.latency_p99_us));
}

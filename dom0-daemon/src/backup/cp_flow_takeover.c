/*
 * A takeover's flow resets (cp_flow_reset.h), wired to the VM's relay on
 * this host: which flows (cp_flow_positions.h), the relay hooks, the retries
 * and the status.  The engine runs for RESET_LIFETIME_MS after the
 * takeover began, then the relay goes back to pass-through: by then
 * every reset flow's two ends have been answered, and a later flow on
 * the same 4-tuple must not be touched.
 */
#include "backup/cp_flow_takeover.h"

#include <jansson.h>

#include "base/log.h"
#include "relay/net_relay.h"
#include "backup/replica.h"

#define RESET_TICK_MS 250
#define RESET_RETRY_TICKS 3 /* a probe answer can be rate-limited for 500 ms */
#define RESET_LIFETIME_MS 10000

static struct net_relay *relay_of(struct replica *r)
{
	struct vm *vm = vm_find(r->vms, r->name);

	return vm ? vm_nic(vm) : NULL;
}

static int to_lan(void *opaque, const uint8_t *frame, size_t len)
{
	struct net_relay *relay = relay_of(opaque);

	return relay ? net_relay_send_to_lan(relay, frame, len) : -1;
}

static int to_guest(void *opaque, const uint8_t *frame, size_t len)
{
	struct net_relay *relay = relay_of(opaque);

	return relay ? net_relay_send_to_guest(relay, frame, len) : -1;
}

static int add_target(void *opaque, const struct cp_flow_reset_target *t)
{
	return cp_flow_reset_add(opaque, t);
}

static long reset_tick(event_loop *loop, long long id, void *data)
{
	struct replica *r = data;

	r->resets.ticks++;
	if (r->resets.ticks * RESET_TICK_MS >= RESET_LIFETIME_MS) {
		r->resets.timer = 0;
		cp_flow_takeover_end(r);
		return TIMER_DONE;
	}
	if (r->resets.ticks % RESET_RETRY_TICKS == 0 && r->resets.ticks <= 4 * RESET_RETRY_TICKS)
		cp_flow_reset_retry(r->resets.engine);
	return RESET_TICK_MS;
}

void cp_flow_takeover_begin(struct replica *r)
{
	struct cp_flow_reset_io io = { .opaque = r, .to_lan = to_lan, .to_guest = to_guest };
	struct net_relay *relay = relay_of(r);

	if (!r->flows || !relay)
		return;
	if (r->settings->unsafe_no_flow_reset) {
		log_warn("vm %s: FLOW RESET DISABLED (debug negative control): connections whose "
			 "clients saw output after epoch %llu will stall", r->name,
			 (unsigned long long)r->committed_epoch);
		return;
	}
	long verify = 0;
	r->resets.engine = cp_flow_reset_create(&io);
	long n = r->resets.engine ?
		 cp_flow_positions_to_reset(r->flows, r->committed_epoch, add_target,
					    r->resets.engine, &verify) : -1;
	if (n < 0) {
		log_error("vm %s: OUT OF MEMORY listing the flows to reset: connections that saw "
			  "output after epoch %llu may stall instead of failing", r->name,
			  (unsigned long long)r->committed_epoch);
		cp_flow_reset_destroy(r->resets.engine);
		r->resets.engine = NULL;
		return;
	}
	r->resets.started_us = monotonic_us();
	struct cp_flow_positions_stats st;
	cp_flow_positions_get_stats(r->flows, &st);
	log_warn("vm %s: resetting %ld connection(s) whose clients saw output after epoch %llu "
		 "(%llu notices, the newest of cut %llu), verifying %ld more with their clients",
		 r->name, n, (unsigned long long)r->committed_epoch,
		 (unsigned long long)st.ahead_notices, (unsigned long long)st.newest_ahead_epoch,
		 verify);
	if (n + verify == 0)
		return;
	net_relay_set_output_hook(relay, cp_flow_reset_from_guest, r->resets.engine);
	net_relay_set_input_hook(relay, cp_flow_reset_from_lan, r->resets.engine);
	cp_flow_reset_clients(r->resets.engine);
	r->resets.ticks = 0;
	r->resets.timer = event_loop_add_timer(r->loop, RESET_TICK_MS, reset_tick, r);
	if (r->resets.timer < 0) {
		r->resets.timer = 0;
		log_warn("vm %s: no timer for the flow resets' retries; each gets one try", r->name);
	}
}

void cp_flow_takeover_guest_running(struct replica *r)
{
	if (r->resets.engine)
		cp_flow_reset_guest(r->resets.engine);
}

void cp_flow_takeover_end(struct replica *r)
{
	struct net_relay *relay = relay_of(r);

	if (r->resets.timer)
		event_loop_del_timer(r->loop, r->resets.timer);
	r->resets.timer = 0;
	if (!r->resets.engine)
		return;
	if (relay && net_relay_output_hook_is(relay, cp_flow_reset_from_guest, r->resets.engine))
		net_relay_set_output_hook(relay, NULL, NULL);
	if (relay && net_relay_input_hook_is(relay, cp_flow_reset_from_lan, r->resets.engine))
		net_relay_set_input_hook(relay, NULL, NULL);
	cp_flow_reset_get_stats(r->resets.engine, &r->resets.stats);
	r->resets.done = true;
	cp_flow_reset_destroy(r->resets.engine);
	r->resets.engine = NULL;
}

json_t *cp_flow_takeover_json(const struct replica *r)
{
	struct cp_flow_positions_stats f = { 0 };
	struct cp_flow_reset_stats s = r->resets.stats;

	if (r->flows)
		cp_flow_positions_get_stats(r->flows, &f);
	if (r->resets.engine)
		cp_flow_reset_get_stats(r->resets.engine, &s);
	json_t *o = json_pack("{s:I, s:I, s:I, s:I}",
			      "committed_flows", (json_int_t)f.committed_flows,
			      "records", (json_int_t)f.records,
			      "ahead_notices", (json_int_t)f.ahead_notices,
			      "newest_ahead_epoch", (json_int_t)f.newest_ahead_epoch);
	if (!o || (!r->resets.engine && !r->resets.done))
		return o;
	json_object_set_new(o, "reset", json_pack(
		"{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b}",
		"flows", (json_int_t)s.flows, "client_rsts", (json_int_t)s.client_rsts,
		"guest_rsts", (json_int_t)s.guest_rsts, "probes", (json_int_t)s.probes,
		"exact_client", (json_int_t)s.exact_client,
		"exact_guest", (json_int_t)s.exact_guest,
		"frames_dropped", (json_int_t)s.frames_dropped,
		"flows_released", (json_int_t)s.flows_released,
		"running", r->resets.engine != NULL));
	json_object_set_new(json_object_get(o, "reset"), "verified_ahead",
			    json_integer((json_int_t)s.verified_ahead));
	json_object_set_new(json_object_get(o, "reset"), "verified_consistent",
			    json_integer((json_int_t)s.verified_consistent));
	return o;
}

/* Prometheus exposition and health verdicts from the status JSON (metrics.h). */
#include "base/metrics.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

const double metrics_pause_bounds_ms[METRICS_PAUSE_BUCKETS] = {
	1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000,
};

void metrics_bucket_observe(const double *bounds, uint64_t *per_bucket, unsigned n, double value)
{
	for (unsigned i = 0; i < n; i++)
		if (value <= bounds[i]) {
			per_bucket[i]++;
			return;
		}
}

void metrics_bucket_arrays(const double *bounds, const uint64_t *per_bucket, unsigned n,
			   json_t **bounds_json, json_t **cumulative_json)
{
	uint64_t running = 0;

	*bounds_json = json_array();
	*cumulative_json = json_array();
	for (unsigned i = 0; i < n; i++) {
		running += per_bucket[i];
		json_array_append_new(*bounds_json, json_real(bounds[i]));
		json_array_append_new(*cumulative_json, json_integer((json_int_t)running));
	}
}

void pause_histogram_observe(struct pause_histogram *h, double ms)
{
	h->count++;
	h->sum_ms += ms;
	metrics_bucket_observe(metrics_pause_bounds_ms, h->le, METRICS_PAUSE_BUCKETS, ms);
}

json_t *pause_histogram_json(const struct pause_histogram *h)
{
	json_t *bounds, *cum;

	metrics_bucket_arrays(metrics_pause_bounds_ms, h->le, METRICS_PAUSE_BUCKETS, &bounds, &cum);
	return json_pack("{s:o, s:o, s:I, s:f}", "bounds_ms", bounds, "cumulative", cum,
			 "count", (json_int_t)h->count, "sum_ms", h->sum_ms);
}

/* ---- exposition --------------------------------------------------------- */

enum source { SRC_VM, SRC_PRIMARY, SRC_BACKUP };

/* One family taken from a JSON number at path (up to 3 keys), times scale. */
struct family {
	const char *name, *type, *help;
	enum source src;
	const char *path[3];
	double scale;
};

static const struct family plain_families[] = {
	{ "remusdb_checkpoints_total", "counter",
	  "Checkpoints taken and shipped as epochs to the backup.",
	  SRC_PRIMARY, { "epochs" }, 1 },
	{ "remusdb_acked_epoch", "gauge",
	  "The last epoch the backup acknowledged (committed).",
	  SRC_PRIMARY, { "acked_epoch" }, 1 },
	{ "remusdb_epochs_in_flight", "gauge",
	  "Epochs checkpointed but not yet acknowledged by the backup.",
	  SRC_PRIMARY, { "in_flight" }, 1 },
	{ "remusdb_ack_age_seconds", "gauge",
	  "Time since the backup's last acknowledgement (ack lag).",
	  SRC_PRIMARY, { "last_ack_age_ms" }, 0.001 },
	{ "remusdb_replication_sent_bytes_total", "counter",
	  "Bytes written to the replication connection (starts again from 0 on a reconnect).",
	  SRC_PRIMARY, { "bytes_sent" }, 1 },
	{ "remusdb_checkpoint_raw_dirty_bytes_total", "counter",
	  "Dirty page bytes plain Remus would have sent (reset by reset-stats).",
	  SRC_PRIMARY, { "pipeline", "raw_dirty_bytes_total" }, 1 },
	{ "remusdb_checkpoint_page_sent_bytes_total", "counter",
	  "Page bytes sent after checkpoint compression (reset by reset-stats).",
	  SRC_PRIMARY, { "pipeline", "page_bytes_sent_total" }, 1 },
	{ "remusdb_backpressure_events_total", "counter",
	  "Checkpoints that waited because max-inflight epochs were unacknowledged (reset by reset-stats).",
	  SRC_PRIMARY, { "backpressure_events" }, 1 },
	{ "remusdb_output_held_frames", "gauge",
	  "Guest frames held by output commit until their epoch is acknowledged.",
	  SRC_PRIMARY, { "held_frames" }, 1 },
	{ "remusdb_output_held_bytes", "gauge",
	  "Bytes of guest frames held by output commit.",
	  SRC_PRIMARY, { "held_bytes" }, 1 },
	{ "remusdb_checkpoint_interval_seconds", "gauge",
	  "The configured checkpoint interval.",
	  SRC_PRIMARY, { "interval_ms" }, 0.001 },
	{ "remusdb_vm_unprotected_seconds", "gauge",
	  "How long the VM has run unprotected since its backup was lost (0 while protected or when no loss is open).",
	  SRC_PRIMARY, { "reprotect", "unprotected_seconds" }, 1 },
	{ "remusdb_reprotect_attempts", "gauge",
	  "Tries to reach the lost backup again in the current (or last) unprotected gap.",
	  SRC_PRIMARY, { "reprotect", "attempts" }, 1 },
	{ "remusdb_reprotections_total", "counter",
	  "Automatic re-protections that brought the VM back to protected after its backup was lost.",
	  SRC_PRIMARY, { "reprotect", "reprotections" }, 1 },
	{ "remusdb_epochs_committed_total", "counter",
	  "Epochs the backup committed to its replica image.",
	  SRC_BACKUP, { "epochs_committed" }, 1 },
	{ "remusdb_committed_epoch", "gauge",
	  "The replica's last committed epoch.",
	  SRC_BACKUP, { "committed_epoch" }, 1 },
	{ "remusdb_replica_last_heard_seconds", "gauge",
	  "Time since the primary was last heard from.",
	  SRC_BACKUP, { "last_heard_ms" }, 0.001 },
	{ "remusdb_failover_detection_seconds", "gauge",
	  "Primary loss detected this long after it was last heard from.",
	  SRC_BACKUP, { "failover", "detected_ms_after_last_heard" }, 0.001 },
	{ "remusdb_failover_arbitration_seconds", "gauge",
	  "From the primary's loss to the witness's verdict.",
	  SRC_BACKUP, { "failover", "arbitration_ms" }, 0.001 },
	{ "remusdb_protection_memory_bytes", "gauge",
	  "What the primary holds for this protection: the pipeline's unacknowledged epochs, the compression cache, held output, the link's backlog.",
	  SRC_PRIMARY, { "memory", "held_bytes" }, 1 },
	{ "remusdb_checkpoint_pipeline_peak_bytes", "gauge",
	  "The most the primary's checkpoint pipeline held at once for this protection (raw and coded epochs, pooled jobs).",
	  SRC_PRIMARY, { "memory", "pipeline_peak_bytes" }, 1 },
	{ "remusdb_replica_memory_admitted_bytes", "gauge",
	  "What the backup's admission counted this replica at: image, epoch staging, deferred frames, takeover copy.",
	  SRC_BACKUP, { "memory", "admitted_bytes" }, 1 },
	{ "remusdb_failover_downtime_seconds", "gauge",
	  "From the primary's loss to the VM resumed here.",
	  SRC_BACKUP, { "failover", "total_ms" }, 0.001 },
};

static const char *const protection_states[] = {
	"connecting", "syncing", "protected", "arbitrating", "unprotected", "fenced", "failed",
};
static const char *const replica_states[] = {
	"receiving", "ready", "arbitrating", "failing-over", "active", "passive", "failed",
};

/* Label values escape \, " and newline (the exposition format's rule). */
static void put_label_value(FILE *out, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\')
			fputs("\\\\", out);
		else if (*v == '"')
			fputs("\\\"", out);
		else if (*v == '\n')
			fputs("\\n", out);
		else
			fputc(*v, out);
	}
}

static void put_number(FILE *out, double v)
{
	if (isnan(v))
		fputs("NaN", out);
	else if (isinf(v))
		fputs(v > 0 ? "+Inf" : "-Inf", out);
	else if (v == (double)(int64_t)v && fabs(v) < 9e15)
		fprintf(out, "%" PRId64, (int64_t)v);
	else
		fprintf(out, "%.9g", v);
}

/* name{vm="..",role=".."[,extra="value"]} value */
static void put_sample(FILE *out, const char *name, const char *suffix, const char *vm,
		       const char *role, const char *extra_key, const char *extra_val,
		       double v)
{
	fprintf(out, "%s%s{vm=\"", name, suffix);
	put_label_value(out, vm);
	fputs("\",role=\"", out);
	put_label_value(out, role);
	if (extra_key) {
		fprintf(out, "\",%s=\"", extra_key);
		put_label_value(out, extra_val);
	}
	fputs("\"} ", out);
	put_number(out, v);
	fputc('\n', out);
}

static void put_header(FILE *out, const char *name, const char *type, const char *help)
{
	fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* What each source iterates over, with the vm name and role of an item. */
struct item {
	const json_t *obj; /* the protection, the replica or the VM */
	const char *vm, *role;
};

static size_t items(const json_t *vms, const json_t *replicas, enum source src,
		    size_t i, struct item *it)
{
	const json_t *arr = src == SRC_BACKUP ? replicas : vms;
	size_t n = json_is_array(arr) ? json_array_size(arr) : 0;

	if (i >= n)
		return 0;
	const json_t *o = json_array_get(arr, i);
	it->obj = o;
	if (src == SRC_BACKUP) {
		it->vm = json_string_value(json_object_get(o, "vm"));
		it->role = "backup";
	} else {
		it->vm = json_string_value(json_object_get(o, "name"));
		it->role = json_object_get(o, "clone") ? "clone" : "primary";
		if (src == SRC_PRIMARY)
			it->obj = json_object_get(o, "protection");
	}
	if (!it->vm || !json_is_object(it->obj))
		it->obj = NULL; /* skipped, but the walk goes on */
	return 1;
}

static void put_plain(FILE *out, const struct family *f, const json_t *vms,
		      const json_t *replicas)
{
	struct item it;

	put_header(out, f->name, f->type, f->help);
	for (size_t i = 0; items(vms, replicas, f->src, i, &it); i++) {
		const json_t *v = it.obj;
		for (unsigned k = 0; k < 3 && f->path[k] && v; k++)
			v = json_object_get(v, f->path[k]);
		if (json_is_number(v)) /* null (not yet known) gives no sample */
			put_sample(out, f->name, "", it.vm, it.role, NULL, NULL,
				   json_number_value(v) * f->scale);
	}
}

/* An enumeration as one 0/1 series per state, the usual Prometheus idiom. */
static void put_states(FILE *out, const char *name, const char *help, enum source src,
		       const char *const *states, size_t nstates, const json_t *vms,
		       const json_t *replicas)
{
	struct item it;

	put_header(out, name, "gauge", help);
	for (size_t i = 0; items(vms, replicas, src, i, &it); i++) {
		const char *st = it.obj ? json_string_value(json_object_get(it.obj, "state")) : NULL;
		if (!st)
			continue;
		for (size_t s = 0; s < nstates; s++)
			put_sample(out, name, "", it.vm, it.role, "state", states[s],
				   !strcmp(st, states[s]));
	}
}

/* A primary's histogram (pause_histogram_json) at key of its status. */
static void put_pause_histogram(FILE *out, const json_t *vms, const char *name,
				const char *key, const char *help)
{
	struct item it;
	char le[32];

	put_header(out, name, "histogram", help);
	for (size_t i = 0; items(vms, NULL, SRC_PRIMARY, i, &it); i++) {
		const json_t *h = it.obj ? json_object_get(it.obj, key) : NULL;
		const json_t *bounds = json_object_get(h, "bounds_ms");
		const json_t *cum = json_object_get(h, "cumulative");
		if (!json_is_array(bounds) || !json_is_array(cum) ||
		    json_array_size(bounds) != json_array_size(cum))
			continue;
		for (size_t b = 0; b < json_array_size(bounds); b++) {
			snprintf(le, sizeof(le), "%.9g",
				 json_number_value(json_array_get(bounds, b)) / 1000.0);
			put_sample(out, name, "_bucket", it.vm, it.role, "le", le,
				   json_number_value(json_array_get(cum, b)));
		}
		double count = json_number_value(json_object_get(h, "count"));
		put_sample(out, name, "_bucket", it.vm, it.role, "le", "+Inf", count);
		put_sample(out, name, "_sum", it.vm, it.role, NULL, NULL,
			   json_number_value(json_object_get(h, "sum_ms")) / 1000.0);
		put_sample(out, name, "_count", it.vm, it.role, NULL, NULL, count);
	}
}

/* Per VM defined here: whether its QEMU runs (what /primary looks at first). */
static void put_vms(FILE *out, const json_t *vms)
{
	struct item it;

	put_header(out, "remusdb_vm_qemu_running", "gauge",
		   "1 when the VM's QEMU reports running (or a checkpoint's colo pause) on this host.");
	for (size_t i = 0; items(vms, NULL, SRC_VM, i, &it); i++) {
		const char *rs = it.obj ? json_string_value(json_object_get(it.obj, "run_state")) : NULL;
		if (rs)
			put_sample(out, "remusdb_vm_qemu_running", "", it.vm, it.role, NULL, NULL,
				   !strcmp(rs, "running") || !strcmp(rs, "colo"));
	}
	put_header(out, "remusdb_vm_info", "gauge",
		   "A VM defined on this host, with QEMU's run state as a label (unknown: no QMP).");
	for (size_t i = 0; items(vms, NULL, SRC_VM, i, &it); i++) {
		const char *rs = it.obj ? json_string_value(json_object_get(it.obj, "run_state")) : NULL;
		if (rs)
			put_sample(out, "remusdb_vm_info", "", it.vm, it.role, "run_state", rs, 1);
	}
}

/* Failovers this host's replicas went through (a replica fails over once). */
static void put_failovers(FILE *out, const json_t *replicas)
{
	struct item it;

	put_header(out, "remusdb_failovers_total", "counter",
		   "Primary losses this replica detected and acted on.");
	for (size_t i = 0; items(NULL, replicas, SRC_BACKUP, i, &it); i++)
		if (it.obj)
			put_sample(out, "remusdb_failovers_total", "", it.vm, it.role, NULL, NULL,
				   json_is_object(json_object_get(it.obj, "failover")));
}

/* Host-wide gauges: no vm label, so that a sum over VMs counts nothing twice. */
static void put_host_memory(FILE *out, const json_t *memory)
{
	static const struct {
		const char *name, *key, *help;
	} gauges[] = {
		{ "remusdb_backup_memory_limit_bytes", "limit_bytes",
		  "The memory this host's replicas may take together (--memory-limit)." },
		{ "remusdb_backup_memory_admitted_bytes", "admitted_bytes",
		  "The sum of what admission counted the replicas holding an image at." },
		{ "remusdb_backup_protected_ram_bytes", "protected_ram_bytes",
		  "Guest RAM the replicas here hold a copy of." },
		{ "remusdb_daemon_resident_bytes", "daemon_rss_bytes",
		  "remusdbd's resident set." },
	};

	if (!json_is_object(memory))
		return;
	for (size_t i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++) {
		const json_t *v = json_object_get(memory, gauges[i].key);
		if (!json_is_number(v))
			continue;
		put_header(out, gauges[i].name, "gauge", gauges[i].help);
		fprintf(out, "%s ", gauges[i].name);
		put_number(out, json_number_value(v));
		fputc('\n', out);
	}
}

/*
 * The event loop's turns as a histogram in seconds, and the time it was
 * busy as a counter: rate(remusdb_loop_busy_seconds_total) is the share
 * of the one thread that every VM's I/O and checkpoints wait for.
 */
static void put_loop_turns(FILE *out, const json_t *loop)
{
	const json_t *bounds = json_object_get(loop, "bounds_ms");
	const json_t *cum = json_object_get(loop, "cumulative");
	const json_t *count = json_object_get(loop, "count");
	const json_t *busy = json_object_get(loop, "busy_ms");

	if (!json_is_array(bounds) || !json_is_array(cum) || !json_is_integer(count) ||
	    !json_is_number(busy) || json_array_size(bounds) != json_array_size(cum))
		return;
	put_header(out, "remusdb_loop_turn_seconds", "histogram",
		   "How long each turn of remusdbd's event loop took (every VM's events wait for it).");
	for (size_t i = 0; i < json_array_size(bounds); i++) {
		fprintf(out, "remusdb_loop_turn_seconds_bucket{le=\"");
		put_number(out, json_number_value(json_array_get(bounds, i)) / 1000.0);
		fprintf(out, "\"} %" PRId64 "\n", (int64_t)json_integer_value(json_array_get(cum, i)));
	}
	fprintf(out, "remusdb_loop_turn_seconds_bucket{le=\"+Inf\"} %" PRId64 "\n",
		(int64_t)json_integer_value(count));
	fprintf(out, "remusdb_loop_turn_seconds_sum ");
	put_number(out, json_number_value(busy) / 1000.0);
	fprintf(out, "\nremusdb_loop_turn_seconds_count %" PRId64 "\n",
		(int64_t)json_integer_value(count));
	put_header(out, "remusdb_loop_busy_seconds_total", "counter",
		   "Time remusdbd's event loop spent in its turns.");
	fprintf(out, "remusdb_loop_busy_seconds_total ");
	put_number(out, json_number_value(busy) / 1000.0);
	fputc('\n', out);
}

int metrics_write(FILE *out, const json_t *vms, const json_t *replicas, const json_t *memory,
		  const json_t *loop)
{
	put_vms(out, vms);
	put_states(out, "remusdb_protection_state", "The primary's protection state (1 for the current one).",
		   SRC_PRIMARY, protection_states,
		   sizeof(protection_states) / sizeof(protection_states[0]), vms, replicas);
	put_pause_histogram(out, vms, "remusdb_checkpoint_pause_seconds", "pause_histogram",
			    "How long each checkpoint kept the VM paused, our REPLY to our LOADED "
			    "(since the protection started).");
	put_pause_histogram(out, vms, "remusdb_checkpoint_guest_pause_seconds",
			    "guest_pause_histogram",
			    "Each checkpoint's pause as the guest has it, our REPLY to QEMU's RESUME "
			    "(since the protection started).");
	for (size_t f = 0; f < sizeof(plain_families) / sizeof(plain_families[0]); f++)
		put_plain(out, &plain_families[f], vms, replicas);
	put_states(out, "remusdb_replica_state", "The backup's replica state (1 for the current one).",
		   SRC_BACKUP, replica_states, sizeof(replica_states) / sizeof(replica_states[0]),
		   vms, replicas);
	put_failovers(out, replicas);
	put_host_memory(out, memory);
	put_loop_turns(out, loop);
	return ferror(out) ? -1 : 0;
}

/* ---- health ------------------------------------------------------------- */

static const json_t *find(const json_t *arr, const char *key, const char *name)
{
	size_t i;
	const json_t *o;

	if (!json_is_array(arr))
		return NULL;
	json_array_foreach(arr, i, o) {
		const char *n = json_string_value(json_object_get(o, key));
		if (n && !strcmp(n, name))
			return o;
	}
	return NULL;
}

bool metrics_health_primary(const json_t *vms, const char *name, char *why, size_t whylen)
{
	const json_t *vm = find(vms, "name", name);

	if (!vm) {
		snprintf(why, whylen, "no VM named %s on this host", name);
		return false;
	}
	const char *rs = json_string_value(json_object_get(vm, "run_state"));
	const json_t *p = json_object_get(vm, "protection");
	const char *st = json_string_value(json_object_get(p, "state"));
	/* colo: QEMU paused for a checkpoint, still this host's VM. */
	bool running = rs && (!strcmp(rs, "running") || (st && !strcmp(rs, "colo")));

	if (!running) {
		snprintf(why, whylen, "VM %s: QEMU is %s here", name, rs ? rs : "unknown");
		return false;
	}
	if (st && (!strcmp(st, "fenced") || !strcmp(st, "failed") || !strcmp(st, "arbitrating"))) {
		snprintf(why, whylen, "VM %s: protection %s", name, st);
		return false;
	}
	snprintf(why, whylen, "VM %s: primary here (%s)", name, st ? st : "not protected");
	return true;
}

bool metrics_health_replica(const json_t *replicas, const char *name, char *why, size_t whylen)
{
	const json_t *r = find(replicas, "vm", name);
	const char *st = json_string_value(json_object_get(r, "state"));

	if (!st) {
		snprintf(why, whylen, "no replica of %s on this host", name);
		return false;
	}
	snprintf(why, whylen, "replica of %s: %s", name, st);
	return !strcmp(st, "ready");
}

/*
 * Prometheus text exposition (format 0.0.4) of what `status` shows, and
 * the health verdicts of the HTTP endpoint (http_endpoint.h).
 *
 * Why from the status JSON and not from the structs: `status` is already
 * the daemon's one account of its VMs, protections and replicas, built on
 * the loop where that state lives; formatting that same document keeps
 * the exposition pure (unit-tested on hand-made JSON) and means a scrape
 * can never show something `remusdb status` would not.
 *
 * The checkpoint pause histogram is the exception: the sample ring behind
 * status's p50/p99 forgets and is cleared by reset-stats, so a protection
 * also counts every pause into the fixed buckets below, cumulatively and
 * never reset (a Prometheus histogram must only grow).
 */
#ifndef REMUSDB_METRICS_H
#define REMUSDB_METRICS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Upper bounds in ms: the lab's pauses run from ~5 ms to a few 100 ms. */
#define METRICS_PAUSE_BUCKETS 12
extern const double metrics_pause_bounds_ms[METRICS_PAUSE_BUCKETS];

struct pause_histogram {
	uint64_t le[METRICS_PAUSE_BUCKETS]; /* per bucket, not cumulative */
	uint64_t count;                     /* all observations (+Inf) */
	double sum_ms;
};

/*
 * Any histogram of fixed bounds (the pause's here, the loop's turns in
 * loop_turns.h): counts `value` into the first of the n buckets whose
 * bound it does not pass (none past the last: +Inf is the total count),
 * and gives the bounds and the cumulative counts as two JSON arrays.
 */
void metrics_bucket_observe(const double *bounds, uint64_t *per_bucket, unsigned n, double value);
void metrics_bucket_arrays(const double *bounds, const uint64_t *per_bucket, unsigned n,
			   json_t **bounds_json, json_t **cumulative_json);

void pause_histogram_observe(struct pause_histogram *h, double ms);
/* {"bounds_ms": [...], "cumulative": [...], "count": n, "sum_ms": x} */
json_t *pause_histogram_json(const struct pause_histogram *h);

/*
 * Writes the exposition of `vms` (vm_registry_status_json's array) and
 * `replicas` (replication_server_status_json's array; NULL = none) and
 * the host's `memory` (replication_server_memory_json; NULL = none) and
 * its event loop's `loop` turns (loop_turns_json; NULL = none) to out.
 * Returns 0, or -1 if writing failed.
 */
int metrics_write(FILE *out, const json_t *vms, const json_t *replicas, const json_t *memory,
		  const json_t *loop);

/*
 * The health checks, on the same JSON.  primary: the VM's QEMU runs here
 * and this host is its primary (unprotected, or a protection that is not
 * fenced, failed or arbitrating).  replica: this host holds a READY
 * replica of it, able to take over.  why gets one line for the body.
 */
bool metrics_health_primary(const json_t *vms, const char *name, char *why, size_t whylen);
bool metrics_health_replica(const json_t *replicas, const char *name, char *why, size_t whylen);

#endif

/*
 * Split-brain arbitration through etcd: a synchronous client for the one
 * ownership key each protected VM has, /remusdb/vms/<vm>/owner, whose
 * value is the JSON text {"owner":"<host>","generation":N}.
 *
 * When primary and backup lose each other, each side compare-and-swaps
 * the key from the exact value it last saw (generation G) to itself at
 * G+1.  etcd applies transactions one after the other, so exactly one
 * side wins; a side that cannot reach etcd changes nothing.  No leases and
 * no clocks: etcd's linearizable transaction is the whole arbiter
 * (docs/witness.md).
 *
 * Why etcd's v3 JSON gateway through libcurl: it is HTTP/1.1 + JSON, which
 * we already link (libcurl, jansson), while the native gRPC API would pull
 * in gRPC and protobuf for three calls.  Why not etcdctl: forking a CLI
 * from the daemon is slow, hard to time out and parses text meant for
 * humans.
 *
 * Every call blocks for at most config.timeout_ms in total, trying the
 * endpoints in order.  It is meant for a worker thread (witness_async.h);
 * the daemon's loop never calls it directly.  One thread may use a handle
 * at a time; only witness_cancel() may be called from another thread.
 *
 * The pure pieces (keys, values, requests, replies) are in witness_proto.h.
 */
#ifndef REMUSDB_WITNESS_H
#define REMUSDB_WITNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WITNESS_DEFAULT_TIMEOUT_MS 1000
#define WITNESS_MAX_ENDPOINTS 8
#define WITNESS_OWNER_MAX 64 /* bytes of a host name in the value */
#define WITNESS_RAW_MAX 255  /* bytes of the stored value */

struct witness_config {
	char endpoints[512]; /* "http://192.0.2.5:2379,http://..." tried in order */
	long timeout_ms;     /* per whole operation; <= 0 means the default */
};

struct witness_ownership {
	char owner[WITNESS_OWNER_MAX + 1];
	uint64_t generation;
	bool exists;                /* false: the key is absent (owner "", raw "") */
	char raw[WITNESS_RAW_MAX + 1]; /* the exact stored value, for the next CAS */
};

enum witness_result {
	WITNESS_OK = 0,
	WITNESS_LOST = 1,        /* compare failed: someone else moved it */
	WITNESS_UNREACHABLE = 2, /* no endpoint answered, or all answered errors */
	WITNESS_ERROR = 3,       /* bad argument, bad reply, bad stored value */
};

const char *witness_result_name(enum witness_result r);

struct witness;

/*
 * Checks the endpoint list (1..WITNESS_MAX_ENDPOINTS http:// or https://
 * URLs, comma-separated) and prepares the HTTP client; no I/O.  Returns
 * NULL with a reason in err.
 */
struct witness *witness_create(const struct witness_config *cfg, char *err,
			       size_t errlen);

/*
 * The same check of an endpoint list alone, for startup: a typo in --etcd
 * on a backup would otherwise surface only at its first takeover, the
 * moment it must not fail.  Returns 0, or -1 with a reason in err.
 */
int witness_check_endpoints(const char *list, char *err, size_t errlen);
void witness_destroy(struct witness *w);

/* Reads the VM's ownership (out->exists false when there is no key). */
enum witness_result witness_get(struct witness *w, const char *vm,
				struct witness_ownership *out, char *err,
				size_t errlen);

/*
 * Creates the key with {"owner":owner,"generation":1} if it does not
 * exist (txn compare create_revision == 0).  If it exists: WITNESS_OK when
 * `owner` owns it, WITNESS_LOST when another host does; out holds the
 * current value either way.
 */
enum witness_result witness_claim(struct witness *w, const char *vm,
				  const char *owner, struct witness_ownership *out,
				  char *err, size_t errlen);

/*
 * Compare-and-swap: succeeds only if the stored value is byte-identical to
 * expected->raw (or, when !expected->exists, if there is no key), writing
 * {"owner":new_owner,"generation":expected->generation+1}.  out gets the
 * new value (OK) or the current one (LOST; exists false if deleted).
 *
 * A retry after a lost reply is safe: if the current value is exactly the
 * one this call writes, an earlier attempt of ours (e.g. on an endpoint
 * that timed out after committing) won, and the result is WITNESS_OK.
 */
enum witness_result witness_cas(struct witness *w, const char *vm,
				const struct witness_ownership *expected,
				const char *new_owner, struct witness_ownership *out,
				char *err, size_t errlen);

/*
 * Thread-safe: makes the operation running on another thread return
 * WITNESS_UNREACHABLE ("cancelled") within milliseconds, and every later
 * operation at once.  Used to tear down a worker without waiting for etcd.
 */
void witness_cancel(struct witness *w);

#endif

/*
 * The pure half of the etcd witness (witness.h): the key and value
 * formats, and the JSON bodies of etcd's v3 gateway (`POST /v3/kv/range`,
 * `/v3/kv/txn`) with their replies.  No I/O, so it is unit-tested without
 * a server and fuzzable.
 *
 * Gateway facts this relies on (etcd 3.4, grpc-gateway + jsonpb): keys and
 * values are base64; int64 fields are JSON strings; fields holding their
 * default value are omitted, so a failed txn has no "succeeded" and an
 * absent key's range reply has no "kvs"; errors come with a non-200 status
 * and a body {"error":..,"code":..,"message":..}.
 */
#ifndef REMUSDB_WITNESS_PROTO_H
#define REMUSDB_WITNESS_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "witness/witness.h"

#define WITNESS_KEY_PREFIX "/remusdb/vms/"
#define WITNESS_KEY_SUFFIX "/owner"
#define WITNESS_VM_MAX 64
#define WITNESS_KEY_MAX (sizeof(WITNESS_KEY_PREFIX) + WITNESS_VM_MAX + sizeof(WITNESS_KEY_SUFFIX))

/*
 * Names go into keys and values unescaped, so both are limited to
 * letters, digits, '.', '_' and '-' (what host names and VM names use).
 * Return 0, or -1 with a reason in err.
 */
int witness_check_vm_name(const char *vm, char *err, size_t errlen);
int witness_check_owner(const char *owner, char *err, size_t errlen);

/* "/remusdb/vms/<vm>/owner"; 0, or -1 with a reason in err. */
int witness_key(const char *vm, char *out, size_t outlen, char *err, size_t errlen);

/*
 * The stored value, always in the same byte form:
 * {"owner":"<owner>","generation":N}.  Returns its length, or -1 with a
 * reason in err (bad owner, does not fit).
 */
int witness_encode_value(const char *owner, uint64_t generation, char *out,
			 size_t outlen, char *err, size_t errlen);
/*
 * Fills out (exists = true, raw = the bytes) from a stored value.  Extra
 * fields are tolerated; owner (1..64 bytes) and a non-negative integer
 * generation are required.  Returns 0, or -1 with a reason in err.
 */
int witness_decode_value(const char *value, size_t len,
			 struct witness_ownership *out, char *err, size_t errlen);

/* Standard base64 with padding; returns a malloc'd string or NULL (OOM). */
char *witness_base64_encode(const void *data, size_t len);
/*
 * Decodes into out (at most outlen bytes); returns the decoded length, or
 * -1 when the text is not base64 or the result does not fit.
 */
long witness_base64_decode(const char *text, size_t textlen, void *out, size_t outlen);

/*
 * Request bodies (malloc'd compact JSON, or NULL on bad input / OOM with a
 * reason in err).  expected_raw NULL in the CAS means "the key must not
 * exist"; the claim is exactly that compare.  Both txns read the key back
 * in their failure branch so a LOST answer carries the current value.
 */
char *witness_range_request(const char *key, char *err, size_t errlen);
char *witness_create_txn_request(const char *key, const char *value, char *err,
				 size_t errlen);
char *witness_cas_txn_request(const char *key, const char *expected_raw,
			      const char *value, char *err, size_t errlen);

/*
 * Replies with status 200.  A range reply fills out (exists false when
 * there are no kvs).  A txn reply sets *succeeded; when it did not succeed
 * *current gets kvs[0] of the failure branch's range.  Return 0, or -1
 * with a reason in err (not JSON, wrong shape, bad value).
 */
int witness_parse_range_reply(const char *body, size_t len,
			      struct witness_ownership *out, char *err, size_t errlen);
int witness_parse_txn_reply(const char *body, size_t len, bool *succeeded,
			    struct witness_ownership *current, char *err,
			    size_t errlen);
/*
 * The message of an error reply (non-200), e.g. "etcdserver: no leader";
 * falls back to the first bytes of the body.  Always NUL-terminates out.
 */
void witness_error_reply_message(const char *body, size_t len, char *out,
				 size_t outlen);

#endif

/*
 * The etcd witness client: endpoint failover and HTTP through libcurl.
 *
 * Time budget: one operation gets timeout_ms in total.  Each endpoint
 * gets a fair share of what is left (remaining / endpoints not yet
 * tried), so a member that hangs (partitioned, or without quorum: etcd
 * then holds a linearizable request for seconds) cannot eat the time the
 * healthy members need.  A refused connection costs nothing and passes
 * its share on.
 *
 * Why curl's multi interface for a blocking call: curl_multi_poll() can
 * be woken from another thread (curl_multi_wakeup), which is how
 * witness_cancel() stops a worker promptly instead of letting the
 * daemon's shutdown wait for etcd.
 *
 * Why an etcd error answer (e.g. "no leader") moves on to the next
 * endpoint: in a partition the member we reach first may be the one cut
 * off from its quorum while another member still serves.  Only when every
 * endpoint failed is the result WITNESS_UNREACHABLE.
 */
#include "witness/witness.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/event_loop.h"
#include "witness/witness_proto.h"

/* etcd's replies are a few hundred bytes; refuse to buffer a flood. */
#define MAX_REPLY (64 * 1024)
#define ENDPOINT_MAX 200
/* curl_multi_poll() sleeps at most this long between cancel checks. */
#define POLL_SLICE_MS 100

struct witness {
	char endpoints[WITNESS_MAX_ENDPOINTS][ENDPOINT_MAX + 1];
	unsigned n_endpoints;
	long timeout_ms;
	CURL *easy;
	CURLM *multi;
	struct curl_slist *headers;
	atomic_bool cancelled;
	char curl_error[CURL_ERROR_SIZE];
};

struct reply {
	char *data;
	size_t len;
	bool too_big;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result;

/* curl_global_init() must run once, before any thread uses curl. */
static void init_curl(void)
{
	curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT);
}

const char *witness_result_name(enum witness_result r)
{
	switch (r) {
	case WITNESS_OK:
		return "ok";
	case WITNESS_LOST:
		return "lost";
	case WITNESS_UNREACHABLE:
		return "unreachable";
	case WITNESS_ERROR:
		return "error";
	}
	return "unknown";
}

static int parse_endpoints(struct witness *w, const char *list, char *err, size_t errlen)
{
	const char *p = list;

	while (*p) {
		while (*p == ' ' || *p == ',')
			p++;
		if (!*p)
			break;
		size_t n = strcspn(p, ", ");
		while (n > 0 && p[n - 1] == '/') /* we append /v3/... */
			n--;
		if (w->n_endpoints == WITNESS_MAX_ENDPOINTS) {
			snprintf(err, errlen, "more than %d etcd endpoints", WITNESS_MAX_ENDPOINTS);
			return -1;
		}
		if (n > ENDPOINT_MAX || !((n > 7 && !strncmp(p, "http://", 7)) ||
					  (n > 8 && !strncmp(p, "https://", 8)))) {
			snprintf(err, errlen, "etcd endpoint '%.*s' is not an http:// or "
				 "https:// URL (e.g. http://192.0.2.5:2379)",
				 (int)(n > 80 ? 80 : n), p);
			return -1;
		}
		memcpy(w->endpoints[w->n_endpoints], p, n);
		w->endpoints[w->n_endpoints][n] = '\0';
		w->n_endpoints++;
		p += strcspn(p, ", ");
	}
	if (w->n_endpoints == 0) {
		snprintf(err, errlen, "no etcd endpoint configured");
		return -1;
	}
	return 0;
}

int witness_check_endpoints(const char *list, char *err, size_t errlen)
{
	struct witness *scratch = calloc(1, sizeof(*scratch));
	int r;

	if (!scratch) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	r = parse_endpoints(scratch, list, err, errlen);
	free(scratch);
	return r;
}

struct witness *witness_create(const struct witness_config *cfg, char *err,
			       size_t errlen)
{
	struct witness *w = calloc(1, sizeof(*w));

	if (!w) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	atomic_init(&w->cancelled, false);
	w->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : WITNESS_DEFAULT_TIMEOUT_MS;
	if (memchr(cfg->endpoints, '\0', sizeof(cfg->endpoints)) == NULL) {
		snprintf(err, errlen, "etcd endpoint list is not terminated");
		free(w);
		return NULL;
	}
	if (parse_endpoints(w, cfg->endpoints, err, errlen) < 0) {
		free(w);
		return NULL;
	}
	pthread_once(&curl_once, init_curl);
	if (curl_init_result != CURLE_OK) {
		snprintf(err, errlen, "libcurl initialisation failed: %s",
			 curl_easy_strerror(curl_init_result));
		free(w);
		return NULL;
	}
	w->easy = curl_easy_init();
	w->multi = curl_multi_init();
	w->headers = curl_slist_append(NULL, "Content-Type: application/json");
	if (!w->easy || !w->multi || !w->headers) {
		snprintf(err, errlen, "out of memory setting up libcurl");
		witness_destroy(w);
		return NULL;
	}
	return w;
}

void witness_destroy(struct witness *w)
{
	if (!w)
		return;
	if (w->multi)
		curl_multi_cleanup(w->multi);
	if (w->easy)
		curl_easy_cleanup(w->easy);
	curl_slist_free_all(w->headers);
	free(w);
}

void witness_cancel(struct witness *w)
{
	atomic_store(&w->cancelled, true);
	curl_multi_wakeup(w->multi);
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *opaque)
{
	struct reply *r = opaque;
	size_t n = size * nmemb;

	if (r->len + n > MAX_REPLY) {
		r->too_big = true;
		return 0; /* curl stops with CURLE_WRITE_ERROR */
	}
	char *grown = realloc(r->data, r->len + n + 1);
	if (!grown)
		return 0;
	memcpy(grown + r->len, data, n);
	r->data = grown;
	r->len += n;
	r->data[r->len] = '\0';
	return n;
}

/* Runs the prepared easy handle to completion, or until cancelled. */
static CURLcode perform(struct witness *w)
{
	CURLcode result = CURLE_OK;
	int running = 1;

	if (curl_multi_add_handle(w->multi, w->easy) != CURLM_OK)
		return CURLE_OUT_OF_MEMORY;
	while (running) {
		if (atomic_load(&w->cancelled)) {
			result = CURLE_ABORTED_BY_CALLBACK;
			break;
		}
		if (curl_multi_perform(w->multi, &running) != CURLM_OK) {
			result = CURLE_OUT_OF_MEMORY;
			break;
		}
		if (!running)
			break;
		/* Returns early on socket activity, curl's own timers, or a wakeup. */
		if (curl_multi_poll(w->multi, NULL, 0, POLL_SLICE_MS, NULL) != CURLM_OK) {
			result = CURLE_OUT_OF_MEMORY;
			break;
		}
	}
	if (!running) {
		CURLMsg *msg;
		int left;

		while ((msg = curl_multi_info_read(w->multi, &left)))
			if (msg->msg == CURLMSG_DONE && msg->easy_handle == w->easy)
				result = msg->data.result;
	}
	curl_multi_remove_handle(w->multi, w->easy);
	return result;
}

static void append_note(char *notes, size_t size, const char *fmt, const char *endpoint,
			const char *detail)
{
	size_t used = strlen(notes);

	if (used + 3 >= size)
		return;
	if (used) {
		strcpy(notes + used, "; ");
		used += 2;
	}
	snprintf(notes + used, size - used, fmt, endpoint, detail);
}

/*
 * POSTs body to path on the first endpoint that answers 200 within the
 * budget.  OK: *reply holds the body (malloc'd, NUL-terminated).
 * UNREACHABLE: err lists what every endpoint did.  ERROR: a reply we
 * cannot use (too big) or no memory.
 */
static enum witness_result exchange(struct witness *w, const char *path,
				    const char *body, struct reply *reply, char *err,
				    size_t errlen)
{
	int64_t deadline = monotonic_ms() + w->timeout_ms;
	char notes[768] = "";
	char url[ENDPOINT_MAX + 32];

	memset(reply, 0, sizeof(*reply));
	for (unsigned i = 0; i < w->n_endpoints; i++) {
		const char *endpoint = w->endpoints[i];
		int64_t remaining = deadline - monotonic_ms();

		if (atomic_load(&w->cancelled)) {
			snprintf(err, errlen, "cancelled");
			return WITNESS_UNREACHABLE;
		}
		if (remaining <= 0) {
			append_note(notes, sizeof(notes), "%s: %s", endpoint, "not tried, no time left");
			continue;
		}
		long share = (long)(remaining / (w->n_endpoints - i));
		if (share < 1)
			share = 1;
		snprintf(url, sizeof(url), "%s%s", endpoint, path);
		curl_easy_reset(w->easy);
		w->curl_error[0] = '\0';
		free(reply->data);
		memset(reply, 0, sizeof(*reply));
		curl_easy_setopt(w->easy, CURLOPT_URL, url);
		curl_easy_setopt(w->easy, CURLOPT_PROTOCOLS_STR, "http,https");
		/* An http_proxy in the daemon's environment must not reroute etcd. */
		curl_easy_setopt(w->easy, CURLOPT_NOPROXY, "*");
		curl_easy_setopt(w->easy, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(w->easy, CURLOPT_HTTPHEADER, w->headers);
		curl_easy_setopt(w->easy, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(w->easy, CURLOPT_TIMEOUT_MS, share);
		curl_easy_setopt(w->easy, CURLOPT_CONNECTTIMEOUT_MS, share);
		curl_easy_setopt(w->easy, CURLOPT_WRITEFUNCTION, on_body);
		curl_easy_setopt(w->easy, CURLOPT_WRITEDATA, reply);
		curl_easy_setopt(w->easy, CURLOPT_ERRORBUFFER, w->curl_error);

		CURLcode rc = perform(w);
		long status = 0;
		curl_easy_getinfo(w->easy, CURLINFO_RESPONSE_CODE, &status);
		if (rc == CURLE_ABORTED_BY_CALLBACK && atomic_load(&w->cancelled)) {
			free(reply->data);
			memset(reply, 0, sizeof(*reply));
			snprintf(err, errlen, "cancelled");
			return WITNESS_UNREACHABLE;
		}
		if (rc == CURLE_OK && status == 200)
			return WITNESS_OK;
		if (reply->too_big || rc == CURLE_OUT_OF_MEMORY) {
			snprintf(err, errlen, "%s: %s", endpoint, reply->too_big ?
				 "reply larger than 64 KiB: not etcd?" : "out of memory");
			free(reply->data);
			memset(reply, 0, sizeof(*reply));
			return WITNESS_ERROR;
		}
		if (rc == CURLE_OK) {
			char message[200], detail[240];

			witness_error_reply_message(reply->data ? reply->data : "",
						    reply->len, message, sizeof(message));
			snprintf(detail, sizeof(detail), "HTTP %ld: %s", status, message);
			append_note(notes, sizeof(notes), "%s: %s", endpoint, detail);
		} else {
			append_note(notes, sizeof(notes), "%s: %s", endpoint,
				    w->curl_error[0] ? w->curl_error : curl_easy_strerror(rc));
		}
	}
	free(reply->data);
	memset(reply, 0, sizeof(*reply));
	snprintf(err, errlen, "no etcd endpoint answered within %ld ms (%s)",
		 w->timeout_ms, notes);
	return WITNESS_UNREACHABLE;
}

/* Sends a txn; on OK sets *succeeded and, when it failed, *current. */
static enum witness_result run_txn(struct witness *w, char *request, bool *succeeded,
				   struct witness_ownership *current, char *err,
				   size_t errlen)
{
	struct reply reply;

	if (!request)
		return WITNESS_ERROR;
	enum witness_result r = exchange(w, "/v3/kv/txn", request, &reply, err, errlen);
	free(request);
	if (r != WITNESS_OK)
		return r;
	if (witness_parse_txn_reply(reply.data, reply.len, succeeded, current, err,
				    errlen) < 0)
		r = WITNESS_ERROR;
	free(reply.data);
	return r;
}

/* Every operation starts from an empty answer and no message. */
static void clear_ownership(struct witness_ownership *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	if (errlen)
		err[0] = '\0';
}

enum witness_result witness_get(struct witness *w, const char *vm,
				struct witness_ownership *out, char *err,
				size_t errlen)
{
	char key[WITNESS_KEY_MAX];
	struct reply reply;

	clear_ownership(out, err, errlen);
	if (witness_key(vm, key, sizeof(key), err, errlen) < 0)
		return WITNESS_ERROR;
	char *request = witness_range_request(key, err, errlen);
	if (!request)
		return WITNESS_ERROR;
	enum witness_result r = exchange(w, "/v3/kv/range", request, &reply, err, errlen);
	free(request);
	if (r != WITNESS_OK)
		return r;
	if (witness_parse_range_reply(reply.data, reply.len, out, err, errlen) < 0)
		r = WITNESS_ERROR;
	free(reply.data);
	return r;
}

enum witness_result witness_claim(struct witness *w, const char *vm,
				  const char *owner, struct witness_ownership *out,
				  char *err, size_t errlen)
{
	char key[WITNESS_KEY_MAX];
	char value[WITNESS_RAW_MAX + 1];
	bool succeeded;

	clear_ownership(out, err, errlen);
	if (witness_key(vm, key, sizeof(key), err, errlen) < 0 ||
	    witness_encode_value(owner, 1, value, sizeof(value), err, errlen) < 0)
		return WITNESS_ERROR;
	enum witness_result r = run_txn(w, witness_create_txn_request(key, value, err, errlen),
					&succeeded, out, err, errlen);
	if (r != WITNESS_OK)
		return r;
	if (succeeded)
		return witness_decode_value(value, strlen(value), out, err, errlen) < 0 ?
		       WITNESS_ERROR : WITNESS_OK;
	if (!out->exists) {
		/* Existed at the compare, gone at the read: impossible in one txn. */
		snprintf(err, errlen, "etcd txn for %s failed but the key is absent", key);
		return WITNESS_ERROR;
	}
	if (strcmp(out->owner, owner) == 0)
		return WITNESS_OK;
	snprintf(err, errlen, "VM %s is owned by %s (generation %llu)", vm, out->owner,
		 (unsigned long long)out->generation);
	return WITNESS_LOST;
}

enum witness_result witness_cas(struct witness *w, const char *vm,
				const struct witness_ownership *expected,
				const char *new_owner, struct witness_ownership *out,
				char *err, size_t errlen)
{
	char key[WITNESS_KEY_MAX];
	char value[WITNESS_RAW_MAX + 1];
	bool succeeded;

	clear_ownership(out, err, errlen);
	if (witness_key(vm, key, sizeof(key), err, errlen) < 0)
		return WITNESS_ERROR;
	if (expected->exists &&
	    (!expected->raw[0] || !memchr(expected->raw, '\0', sizeof(expected->raw)))) {
		snprintf(err, errlen, "expected ownership has no stored value to compare "
			 "with (read it with witness_get first)");
		return WITNESS_ERROR;
	}
	if (expected->generation >= INT64_MAX) {
		snprintf(err, errlen, "generation %llu cannot be incremented",
			 (unsigned long long)expected->generation);
		return WITNESS_ERROR;
	}
	if (witness_encode_value(new_owner, expected->generation + 1, value, sizeof(value),
				 err, errlen) < 0)
		return WITNESS_ERROR;
	char *request = witness_cas_txn_request(key, expected->exists ? expected->raw : NULL,
						value, err, errlen);
	enum witness_result r = run_txn(w, request, &succeeded, out, err, errlen);
	if (r != WITNESS_OK)
		return r;
	if (succeeded || (out->exists && strcmp(out->raw, value) == 0))
		return witness_decode_value(value, strlen(value), out, err, errlen) < 0 ?
		       WITNESS_ERROR : WITNESS_OK;
	if (out->exists)
		snprintf(err, errlen, "VM %s moved on: %s owns it at generation %llu", vm,
			 out->owner, (unsigned long long)out->generation);
	else
		snprintf(err, errlen, "VM %s has no ownership key any more", vm);
	return WITNESS_LOST;
}

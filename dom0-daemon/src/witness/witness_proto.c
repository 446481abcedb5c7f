/* The pure half of the etcd witness: key, value and JSON bodies (witness_proto.h). */
#include "witness/witness_proto.h"

#include <inttypes.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Replies are a few hundred bytes; a bigger base64 field is not ours. */
#define MAX_BASE64_TEXT 4096

static bool only_name_chars(const char *s)
{
	for (; *s; s++) {
		char c = *s;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

static int check_name(const char *what, const char *name, size_t max, char *err,
		      size_t errlen)
{
	if (!name || !name[0]) {
		snprintf(err, errlen, "%s is empty", what);
		return -1;
	}
	if (strlen(name) > max || !only_name_chars(name)) {
		snprintf(err, errlen, "%s '%.80s' must be 1..%zu letters, digits, '.', "
			 "'_' or '-'", what, name, max);
		return -1;
	}
	return 0;
}

int witness_check_vm_name(const char *vm, char *err, size_t errlen)
{
	return check_name("VM name", vm, WITNESS_VM_MAX, err, errlen);
}

int witness_check_owner(const char *owner, char *err, size_t errlen)
{
	return check_name("owner (host name)", owner, WITNESS_OWNER_MAX, err, errlen);
}

int witness_key(const char *vm, char *out, size_t outlen, char *err, size_t errlen)
{
	if (witness_check_vm_name(vm, err, errlen) < 0)
		return -1;
	int n = snprintf(out, outlen, "%s%s%s", WITNESS_KEY_PREFIX, vm, WITNESS_KEY_SUFFIX);
	if (n < 0 || (size_t)n >= outlen) {
		snprintf(err, errlen, "key for VM '%s' does not fit %zu bytes", vm, outlen);
		return -1;
	}
	return 0;
}

int witness_encode_value(const char *owner, uint64_t generation, char *out,
			 size_t outlen, char *err, size_t errlen)
{
	if (witness_check_owner(owner, err, errlen) < 0)
		return -1;
	/* jansson's integers are signed: keep generations decodable. */
	if (generation > INT64_MAX) {
		snprintf(err, errlen, "generation %" PRIu64 " is out of range", generation);
		return -1;
	}
	int n = snprintf(out, outlen, "{\"owner\":\"%s\",\"generation\":%" PRIu64 "}",
			 owner, generation);
	if (n < 0 || (size_t)n >= outlen) {
		snprintf(err, errlen, "ownership value does not fit %zu bytes", outlen);
		return -1;
	}
	return n;
}

int witness_decode_value(const char *value, size_t len,
			 struct witness_ownership *out, char *err, size_t errlen)
{
	json_error_t jerr;

	memset(out, 0, sizeof(*out));
	if (len == 0 || len > WITNESS_RAW_MAX || memchr(value, '\0', len)) {
		snprintf(err, errlen, "stored ownership value has %zu bytes%s (expected "
			 "1..%d bytes of JSON text)", len,
			 len && memchr(value, '\0', len) ? " with a NUL" : "", WITNESS_RAW_MAX);
		return -1;
	}
	json_t *root = json_loadb(value, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		snprintf(err, errlen, "stored ownership value '%.*s' is not JSON: %s",
			 (int)(len > 80 ? 80 : len), value, jerr.text);
		return -1;
	}
	json_t *owner = json_object_get(root, "owner");
	json_t *generation = json_object_get(root, "generation");
	int rc = -1;
	if (!json_is_string(owner) || !json_is_integer(generation)) {
		snprintf(err, errlen, "stored ownership value '%.*s' lacks a string "
			 "\"owner\" or an integer \"generation\"",
			 (int)(len > 80 ? 80 : len), value);
	} else if (json_string_length(owner) == 0 ||
		   json_string_length(owner) > WITNESS_OWNER_MAX ||
		   strlen(json_string_value(owner)) != json_string_length(owner)) {
		snprintf(err, errlen, "stored ownership value has an owner of %zu bytes "
			 "(expected 1..%d, no NUL)", json_string_length(owner),
			 WITNESS_OWNER_MAX);
	} else if (json_integer_value(generation) < 0) {
		snprintf(err, errlen, "stored ownership value has a negative generation");
	} else {
		snprintf(out->owner, sizeof(out->owner), "%s", json_string_value(owner));
		out->generation = (uint64_t)json_integer_value(generation);
		memcpy(out->raw, value, len);
		out->raw[len] = '\0';
		out->exists = true;
		rc = 0;
	}
	json_decref(root);
	if (rc < 0)
		memset(out, 0, sizeof(*out));
	return rc;
}

char *witness_base64_encode(const void *data, size_t len)
{
	if (len > MAX_BASE64_TEXT)
		return NULL;
	char *text = malloc(4 * ((len + 2) / 3) + 1);
	if (!text)
		return NULL;
	EVP_EncodeBlock((unsigned char *)text, data, (int)len);
	return text;
}

long witness_base64_decode(const char *text, size_t textlen, void *out, size_t outlen)
{
	/* EVP_DecodeBlock skips surrounding blanks; base64 here has none. */
	if (textlen % 4 != 0 || textlen > MAX_BASE64_TEXT)
		return -1;
	if (textlen == 0)
		return 0;
	for (size_t i = 0; i < textlen; i++)
		if (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r')
			return -1;
	unsigned char *decoded = malloc(textlen / 4 * 3);
	if (!decoded)
		return -1;
	int n = EVP_DecodeBlock(decoded, (const unsigned char *)text, (int)textlen);
	/* It returns whole groups of three: drop what the padding stood for. */
	if (n >= 0 && text[textlen - 1] == '=')
		n -= text[textlen - 2] == '=' ? 2 : 1;
	long rc = -1;
	if (n >= 0 && (size_t)n <= outlen) {
		memcpy(out, decoded, (size_t)n);
		rc = n;
	}
	free(decoded);
	return rc;
}

static char *dump_request(json_t *req, char *err, size_t errlen)
{
	char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;

	if (!body)
		snprintf(err, errlen, "out of memory building an etcd request");
	json_decref(req);
	return body;
}

char *witness_range_request(const char *key, char *err, size_t errlen)
{
	char *key64 = witness_base64_encode(key, strlen(key));

	if (!key64) {
		snprintf(err, errlen, "key too long or out of memory");
		return NULL;
	}
	char *body = dump_request(json_pack("{s:s}", "key", key64), err, errlen);
	free(key64);
	return body;
}

/*
 * {"compare":[<compare>],
 *  "success":[{"request_put":{"key":K,"value":V}}],
 *  "failure":[{"request_range":{"key":K}}]}
 */
static char *txn_request(const char *key64, json_t *compare, const char *value,
			 char *err, size_t errlen)
{
	char *value64 = witness_base64_encode(value, strlen(value));

	if (!value64 || !compare) {
		json_decref(compare);
		free(value64);
		snprintf(err, errlen, "value too long or out of memory");
		return NULL;
	}
	json_t *req = json_pack("{s:[o], s:[{s:{s:s, s:s}}], s:[{s:{s:s}}]}",
				"compare", compare,
				"success", "request_put", "key", key64, "value", value64,
				"failure", "request_range", "key", key64);
	free(value64);
	return dump_request(req, err, errlen);
}

char *witness_create_txn_request(const char *key, const char *value, char *err,
				 size_t errlen)
{
	return witness_cas_txn_request(key, NULL, value, err, errlen);
}

char *witness_cas_txn_request(const char *key, const char *expected_raw,
			      const char *value, char *err, size_t errlen)
{
	char *key64 = witness_base64_encode(key, strlen(key));
	char *expected64 = NULL;
	json_t *compare;

	if (!key64) {
		snprintf(err, errlen, "key too long or out of memory");
		return NULL;
	}
	if (!expected_raw) {
		/* The key has never been created (or was deleted since). */
		compare = json_pack("{s:s, s:s, s:s, s:s}", "key", key64,
				    "target", "CREATE", "result", "EQUAL",
				    "create_revision", "0");
	} else {
		expected64 = witness_base64_encode(expected_raw, strlen(expected_raw));
		compare = expected64 ? json_pack("{s:s, s:s, s:s, s:s}", "key", key64,
						 "target", "VALUE", "result", "EQUAL",
						 "value", expected64) : NULL;
	}
	char *body = txn_request(key64, compare, value, err, errlen);
	free(expected64);
	free(key64);
	return body;
}

/* How much of a reply body an error message quotes. */
static int excerpt(size_t len)
{
	return len > 60 ? 60 : (int)len;
}

static json_t *load_reply(const char *body, size_t len, char *err, size_t errlen)
{
	json_error_t jerr;
	json_t *root = json_loadb(body, len, 0, &jerr);

	if (!root) {
		snprintf(err, errlen, "etcd reply is not JSON (%s): '%.*s'", jerr.text,
			 excerpt(len), body);
		return NULL;
	}
	if (!json_is_object(root)) {
		snprintf(err, errlen, "etcd reply is not a JSON object: '%.*s'",
			 excerpt(len), body);
		json_decref(root);
		return NULL;
	}
	if (json_object_get(root, "error")) {
		char message[200];

		witness_error_reply_message(body, len, message, sizeof(message));
		snprintf(err, errlen, "etcd answered an error: %s", message);
		json_decref(root);
		return NULL;
	}
	return root;
}

/* Fills out from a range response object: {"kvs":[{"value":B64,..}],..}. */
static int ownership_from_range(json_t *range, struct witness_ownership *out,
				char *err, size_t errlen)
{
	char value[WITNESS_RAW_MAX + 1];

	memset(out, 0, sizeof(*out));
	json_t *kvs = json_object_get(range, "kvs");
	if (!kvs || (json_is_array(kvs) && json_array_size(kvs) == 0))
		return 0; /* no such key */
	if (!json_is_array(kvs) || !json_is_object(json_array_get(kvs, 0))) {
		snprintf(err, errlen, "etcd range reply has a malformed \"kvs\"");
		return -1;
	}
	json_t *value64 = json_object_get(json_array_get(kvs, 0), "value");
	/* jsonpb omits an empty value: that decodes as a bad (empty) value. */
	const char *text = json_is_string(value64) ? json_string_value(value64) : "";
	if (value64 && !json_is_string(value64)) {
		snprintf(err, errlen, "etcd range reply has a non-string \"value\"");
		return -1;
	}
	long n = witness_base64_decode(text, strlen(text), value, sizeof(value));
	if (n < 0) {
		snprintf(err, errlen, "etcd range reply's value is not base64 or longer "
			 "than %d bytes", WITNESS_RAW_MAX);
		return -1;
	}
	return witness_decode_value(value, (size_t)n, out, err, errlen);
}

int witness_parse_range_reply(const char *body, size_t len,
			      struct witness_ownership *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	json_t *root = load_reply(body, len, err, errlen);
	if (!root)
		return -1;
	int rc = ownership_from_range(root, out, err, errlen);
	json_decref(root);
	return rc;
}

int witness_parse_txn_reply(const char *body, size_t len, bool *succeeded,
			    struct witness_ownership *current, char *err,
			    size_t errlen)
{
	*succeeded = false;
	memset(current, 0, sizeof(*current));
	json_t *root = load_reply(body, len, err, errlen);
	if (!root)
		return -1;
	int rc = -1;
	json_t *ok = json_object_get(root, "succeeded");
	json_t *responses = json_object_get(root, "responses");
	if (!json_object_get(root, "header")) {
		snprintf(err, errlen, "etcd txn reply has no header: '%.*s'",
			 excerpt(len), body);
	} else if (ok && !json_is_boolean(ok)) {
		snprintf(err, errlen, "etcd txn reply has a non-boolean \"succeeded\"");
	} else if (json_is_true(ok)) {
		*succeeded = true;
		rc = 0;
	} else {
		/* Failure branch: [{"response_range":{...}}]. */
		json_t *range = json_object_get(json_array_get(responses, 0),
						"response_range");
		if (!json_is_object(range))
			snprintf(err, errlen, "etcd txn reply failed without the range "
				 "of its failure branch");
		else
			rc = ownership_from_range(range, current, err, errlen);
	}
	json_decref(root);
	return rc;
}

void witness_error_reply_message(const char *body, size_t len, char *out,
				 size_t outlen)
{
	json_t *root = json_loadb(body, len, 0, NULL);
	json_t *message = json_object_get(root, "message");

	if (!json_is_string(message) || !json_string_value(message)[0])
		message = json_object_get(root, "error");
	if (json_is_string(message)) {
		snprintf(out, outlen, "%s", json_string_value(message));
	} else {
		/* Not etcd's JSON (a proxy?): show the start of it, one line. */
		size_t n = len < 80 ? len : 80;
		snprintf(out, outlen, "%.*s", (int)n, body);
		for (char *c = out; *c; c++)
			if (*c == '\n' || *c == '\r')
				*c = ' ';
	}
	json_decref(root);
}

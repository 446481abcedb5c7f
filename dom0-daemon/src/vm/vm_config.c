/* The VM_CONFIG message: its struct, encoder and validating decoder (vm_config.h). */
#include "vm/vm_config.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/repl_proto.h"

_Static_assert(REPL_VM_CONFIG_MAX <= REPL_MAX_PAYLOAD, "a VM_CONFIG fits in one frame");
_Static_assert(VM_CONFIG_MAC_SIZE == sizeof(((struct vm_definition *)0)->mac),
	       "a VM_CONFIG mac becomes the takeover definition's");

static const char *const fields[] = {
	"vm", "primary_host", "qemu_argv", "run_dir", "disk_size", "mac", "tap",
	"bridge", "interval_ms", "heartbeat_ms", "peer_timeout_ms", "ownership",
	"generation", NULL,
};

void vm_config_clear(struct vm_config *c)
{
	for (size_t i = 0; c->qemu_argv && i < c->qemu_argc; i++)
		free(c->qemu_argv[i]);
	free(c->qemu_argv);
	memset(c, 0, sizeof(*c));
}

int vm_config_set_argv(struct vm_config *c, const json_t *argv, char *err, size_t errlen)
{
	size_t n = json_array_size(argv);

	if (!json_is_array(argv) || n == 0 || n > VM_CONFIG_MAX_ARGS) {
		snprintf(err, errlen, "qemu_argv must be the VM's QEMU command line "
			 "(a non-empty array of at most %d strings)", VM_CONFIG_MAX_ARGS);
		return -1;
	}
	char **out = calloc(n + 1, sizeof(char *));
	if (!out) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		const json_t *arg = json_array_get(argv, i);
		const char *s = json_string_value(arg);
		/* An embedded NUL would cut the argument short without a word. */
		if (!s || strlen(s) != json_string_length(arg) || (i == 0 && !s[0])) {
			snprintf(err, errlen, "qemu_argv[%zu] is not a%s string", i,
				 i == 0 ? " non-empty" : "");
			goto fail;
		}
		out[i] = strdup(s);
		if (!out[i]) {
			snprintf(err, errlen, "out of memory");
			goto fail;
		}
	}
	for (size_t i = 0; c->qemu_argv && i < c->qemu_argc; i++)
		free(c->qemu_argv[i]);
	free(c->qemu_argv);
	c->qemu_argv = out;
	c->qemu_argc = n;
	return 0;
fail:
	for (size_t i = 0; i < n; i++)
		free(out[i]);
	free(out);
	return -1;
}

/* A host name as etcd and the fence command receive it: printable, no blanks. */
static int check_host(const char *host, char *err, size_t errlen)
{
	bool ok = host[0] != '\0';

	for (const char *c = host; ok && *c; c++)
		ok = *c > ' ' && *c < 0x7f;
	if (!ok)
		snprintf(err, errlen, "primary_host '%.64s' must be 1-%d printable characters "
			 "without blanks", host, WITNESS_OWNER_MAX);
	return ok ? 0 : -1;
}

/*
 * The primary's run dir is replaced by the backup's in every argument, so
 * it must be a real directory path: absolute, not the root, no "..".
 */
static int check_run_dir(const char *dir, char *err, size_t errlen)
{
	if (dir[0] != '/' || !strcmp(dir, "/") || strstr(dir, "/../") ||
	    (strlen(dir) >= 3 && !strcmp(dir + strlen(dir) - 3, "/.."))) {
		snprintf(err, errlen, "run_dir '%.200s' must be an absolute directory "
			 "path other than / and without '..'", dir);
		return -1;
	}
	return 0;
}

static int check_ms(const char *key, unsigned v, unsigned min, unsigned max, char *err,
		    size_t errlen)
{
	if (v < min || v > max) {
		snprintf(err, errlen, "%s %u is out of range: use %u..%u ms", key, v, min, max);
		return -1;
	}
	return 0;
}

int vm_config_definition(const struct vm_config *c, const char *disk_path,
			 const char *run_dir, struct vm_definition *def, char *err,
			 size_t errlen)
{
	memset(def, 0, sizeof(*def));
	snprintf(def->name, sizeof(def->name), "%s", c->vm);
	snprintf(def->tap, sizeof(def->tap), "%s", c->tap);
	snprintf(def->bridge, sizeof(def->bridge), "%s", c->bridge);
	snprintf(def->mac, sizeof(def->mac), "%s", c->mac);
	if (snprintf(def->disk, sizeof(def->disk), "%s", disk_path) >= (int)sizeof(def->disk) ||
	    snprintf(def->nbd_socket, sizeof(def->nbd_socket), "%s/nbd.sock", run_dir) >=
	    (int)sizeof(def->nbd_socket) ||
	    snprintf(def->net_socket, sizeof(def->net_socket), "%s/net.sock", run_dir) >=
	    (int)sizeof(def->net_socket) ||
	    snprintf(def->qmp_socket, sizeof(def->qmp_socket), "%s/qmp-daemon.sock", run_dir) >=
	    (int)sizeof(def->qmp_socket)) {
		snprintf(err, errlen, "the run dir %.150s is too long for unix socket paths",
			 run_dir);
		return -1;
	}
	return 0;
}

int vm_config_check(const struct vm_config *c, char *err, size_t errlen)
{
	struct vm_definition def;
	char why[256];

	if (c->qemu_argc == 0 || !c->qemu_argv || !c->qemu_argv[0] || !c->qemu_argv[0][0]) {
		snprintf(err, errlen, "qemu_argv must be a non-empty array of strings");
		return -1;
	}
	if (c->disk_size == 0 || c->disk_size > (uint64_t)INT64_MAX) {
		snprintf(err, errlen, "disk_size %llu is out of range",
			 (unsigned long long)c->disk_size);
		return -1;
	}
	if (check_host(c->primary_host, err, errlen) < 0 ||
	    check_run_dir(c->run_dir, err, errlen) < 0 ||
	    check_ms("interval_ms", c->interval_ms, VM_CONFIG_MIN_INTERVAL_MS,
		     VM_CONFIG_MAX_INTERVAL_MS, err, errlen) < 0 ||
	    check_ms("heartbeat_ms", c->heartbeat_ms, 1, VM_CONFIG_MAX_TIMING_MS, err,
		     errlen) < 0 ||
	    check_ms("peer_timeout_ms", c->peer_timeout_ms, 1, VM_CONFIG_MAX_TIMING_MS, err,
		     errlen) < 0)
		return -1;
	if (!c->tap[0]) {
		snprintf(err, errlen, "tap is required: a protected VM has a NIC");
		return -1;
	}
	/*
	 * The name, NIC and MAC pass the checks vm_add applies at takeover
	 * (the name also becomes the disk replica's file name); the paths
	 * here stand in for the backup's own.
	 */
	if (vm_config_definition(c, "/replica.img", "/run", &def, why, sizeof(why)) < 0 ||
	    vm_definition_validate(&def, why, sizeof(why)) < 0) {
		snprintf(err, errlen, "%s", why);
		return -1;
	}
	return 0;
}

char *vm_config_encode(const struct vm_config *c, char *err, size_t errlen)
{
	if (vm_config_check(c, err, errlen) < 0)
		return NULL;
	if (!c->ownership[0]) {
		snprintf(err, errlen, "no etcd ownership to ship yet");
		return NULL;
	}
	json_t *argv = json_array();
	for (size_t i = 0; argv && i < c->qemu_argc; i++)
		if (json_array_append_new(argv, json_string(c->qemu_argv[i])) < 0) {
			json_decref(argv);
			argv = NULL;
		}
	json_t *o = argv ? json_pack("{s:s, s:s, s:o, s:s, s:I, s:s, s:s, s:s, s:I, s:I, s:I,"
				     " s:s, s:I}",
				     "vm", c->vm, "primary_host", c->primary_host,
				     "qemu_argv", argv, "run_dir", c->run_dir,
				     "disk_size", (json_int_t)c->disk_size, "mac", c->mac,
				     "tap", c->tap, "bridge", c->bridge,
				     "interval_ms", (json_int_t)c->interval_ms,
				     "heartbeat_ms", (json_int_t)c->heartbeat_ms,
				     "peer_timeout_ms", (json_int_t)c->peer_timeout_ms,
				     "ownership", c->ownership,
				     "generation", (json_int_t)c->generation) : NULL;
	char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;

	json_decref(o);
	if (!text)
		snprintf(err, errlen, "cannot encode the VM configuration (out of memory)");
	return text;
}

/* A string member into dst (size cap): -1 if missing, not a string or too long. */
static int get_string(const json_t *o, const char *key, char *dst, size_t cap, char *err,
		      size_t errlen)
{
	const json_t *v = json_object_get(o, key);
	const char *s = json_string_value(v);

	if (!s || strlen(s) != json_string_length(v) || strlen(s) >= cap) {
		snprintf(err, errlen, "%s must be a string of at most %zu bytes", key, cap - 1);
		return -1;
	}
	memcpy(dst, s, strlen(s) + 1);
	return 0;
}

/* An integer member in 0..max. */
static int get_uint(const json_t *o, const char *key, uint64_t max, uint64_t *out,
		    char *err, size_t errlen)
{
	const json_t *v = json_object_get(o, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0 ||
	    (uint64_t)json_integer_value(v) > max) {
		snprintf(err, errlen, "%s must be an integer in 0..%llu", key,
			 (unsigned long long)max);
		return -1;
	}
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int decode_object(const json_t *o, struct vm_config *c, char *err, size_t errlen)
{
	const char *key;
	const json_t *value;
	uint64_t interval, heartbeat, timeout;

	if (!json_is_object(o)) {
		snprintf(err, errlen, "not a JSON object");
		return -1;
	}
	json_object_foreach((json_t *)o, key, value) {
		size_t i = 0;
		while (fields[i] && strcmp(fields[i], key))
			i++;
		if (!fields[i]) {
			snprintf(err, errlen, "unknown member '%.40s'", key);
			return -1;
		}
	}
	if (get_string(o, "vm", c->vm, sizeof(c->vm), err, errlen) < 0 ||
	    get_string(o, "primary_host", c->primary_host, sizeof(c->primary_host), err,
		       errlen) < 0 ||
	    get_string(o, "run_dir", c->run_dir, sizeof(c->run_dir), err, errlen) < 0 ||
	    get_string(o, "mac", c->mac, sizeof(c->mac), err, errlen) < 0 ||
	    get_string(o, "tap", c->tap, sizeof(c->tap), err, errlen) < 0 ||
	    get_string(o, "bridge", c->bridge, sizeof(c->bridge), err, errlen) < 0 ||
	    get_string(o, "ownership", c->ownership, sizeof(c->ownership), err, errlen) < 0 ||
	    get_uint(o, "disk_size", INT64_MAX, &c->disk_size, err, errlen) < 0 ||
	    get_uint(o, "generation", INT64_MAX, &c->generation, err, errlen) < 0 ||
	    get_uint(o, "interval_ms", UINT_MAX, &interval, err, errlen) < 0 ||
	    get_uint(o, "heartbeat_ms", UINT_MAX, &heartbeat, err, errlen) < 0 ||
	    get_uint(o, "peer_timeout_ms", UINT_MAX, &timeout, err, errlen) < 0 ||
	    vm_config_set_argv(c, json_object_get(o, "qemu_argv"), err, errlen) < 0)
		return -1;
	c->interval_ms = (unsigned)interval;
	c->heartbeat_ms = (unsigned)heartbeat;
	c->peer_timeout_ms = (unsigned)timeout;
	if (!c->ownership[0]) {
		snprintf(err, errlen, "ownership must not be empty");
		return -1;
	}
	return vm_config_check(c, err, errlen);
}

int vm_config_decode(const char *json, size_t len, struct vm_config *out, char *err,
		     size_t errlen)
{
	json_error_t jerr;
	char why[200];
	json_t *o = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
	int rc;

	memset(out, 0, sizeof(*out));
	if (!o) {
		snprintf(err, errlen, "VM_CONFIG is not JSON: %s", jerr.text);
		return -1;
	}
	rc = decode_object(o, out, why, sizeof(why));
	json_decref(o);
	if (rc < 0)
		snprintf(err, errlen, "VM_CONFIG: %s", why);
	return rc;
}

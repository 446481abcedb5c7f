/* VM definitions: JSON conversion and validation (no side effects). */
#include "vm/vm.h"

#include <stdio.h>
#include <string.h>

struct field {
	const char *key;
	size_t offset;
	size_t size;
};

#define FIELD(f) { #f, offsetof(struct vm_definition, f), sizeof(((struct vm_definition *)0)->f) }

static const struct field fields[] = {
	FIELD(name), FIELD(disk), FIELD(nbd_socket), FIELD(net_socket),
	FIELD(qmp_socket), FIELD(tap), FIELD(bridge), FIELD(mac), FIELD(clone_of),
	FIELD(clone_watch), FIELD(clone_released),
};

#define N_FIELDS (sizeof(fields) / sizeof(fields[0]))

static const struct field *find_field(const char *key)
{
	for (size_t i = 0; i < N_FIELDS; i++)
		if (strcmp(fields[i].key, key) == 0)
			return &fields[i];
	return NULL;
}

int vm_definition_from_json(const json_t *obj, struct vm_definition *def,
			    char *err, size_t errlen)
{
	const char *key;
	json_t *value;

	memset(def, 0, sizeof(*def));
	if (!json_is_object(obj)) {
		snprintf(err, errlen, "a VM definition must be a JSON object");
		return -1;
	}
	/* json_object_foreach wants a non-const object; it does not modify it. */
	json_object_foreach((json_t *)obj, key, value) {
		const struct field *f = find_field(key);
		if (!f) {
			snprintf(err, errlen, "unknown field '%.40s' (known: name, disk, "
				 "nbd_socket, net_socket, qmp_socket, tap, bridge, mac, clone_of, clone_watch, clone_released)",
				 key);
			return -1;
		}
		if (!json_is_string(value)) {
			snprintf(err, errlen, "field '%s' must be a string", key);
			return -1;
		}
		const char *text = json_string_value(value);
		if (strlen(text) != json_string_length(value)) {
			snprintf(err, errlen, "field '%s' contains a NUL character", key);
			return -1;
		}
		if (strlen(text) >= f->size) {
			snprintf(err, errlen, "field '%s' is too long (at most %zu "
				 "characters)", key, f->size - 1);
			return -1;
		}
		strcpy((char *)def + f->offset, text);
	}
	return 0;
}

json_t *vm_definition_to_json(const struct vm_definition *def)
{
	json_t *obj = json_object();

	if (!obj)
		return NULL;
	for (size_t i = 0; i < N_FIELDS; i++) {
		const char *text = (const char *)def + fields[i].offset;
		if (text[0] && json_object_set_new(obj, fields[i].key,
						   json_string(text)) < 0) {
			json_decref(obj);
			return NULL;
		}
	}
	return obj;
}

static int only_chars(const char *s, const char *extra)
{
	for (; *s; s++) {
		char c = *s;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || strchr(extra, c)))
			return 0;
	}
	return 1;
}

static int check_path(const char *key, const char *path, int required, char *err,
		      size_t errlen)
{
	if (!path[0]) {
		if (required)
			snprintf(err, errlen, "field '%s' is required", key);
		return required ? -1 : 0;
	}
	if (path[0] != '/') {
		snprintf(err, errlen, "field '%s' must be an absolute path, got '%s'",
			 key, path);
		return -1;
	}
	return 0;
}

static int check_ifname(const char *key, const char *name, char *err, size_t errlen)
{
	if (name[0] && !only_chars(name, "_.-")) {
		snprintf(err, errlen, "field '%s': interface name '%s' may use only "
			 "letters, digits, '_', '.' and '-'", key, name);
		return -1;
	}
	return 0;
}

static int check_mac(const char *mac, char *err, size_t errlen)
{
	unsigned octets[6];
	int end = 0;

	if (!mac[0])
		return 0;
	if (sscanf(mac, "%2x:%2x:%2x:%2x:%2x:%2x%n", &octets[0], &octets[1],
		   &octets[2], &octets[3], &octets[4], &octets[5], &end) != 6 ||
	    end != 17 || mac[end] || !only_chars(mac, ":")) {
		snprintf(err, errlen, "field 'mac': '%s' is not a MAC address like "
			 "52:54:00:12:34:56", mac);
		return -1;
	}
	return 0;
}

int vm_definition_validate(const struct vm_definition *def, char *err,
			   size_t errlen)
{
	if (!def->name[0]) {
		snprintf(err, errlen, "field 'name' is required");
		return -1;
	}
	if (!only_chars(def->name, "_-")) {
		snprintf(err, errlen, "VM name '%s' may use only letters, digits, "
			 "'_' and '-' (at most %d characters)", def->name, VM_NAME_MAX);
		return -1;
	}
	/* A clone's QEMU opens its own disk overlay: no export needed. */
	int disk_required = !def->clone_of[0];

	if (check_path("disk", def->disk, disk_required, err, errlen) < 0 ||
	    check_path("nbd_socket", def->nbd_socket, disk_required, err, errlen) < 0 ||
	    check_path("net_socket", def->net_socket, 0, err, errlen) < 0 ||
	    check_path("qmp_socket", def->qmp_socket, 0, err, errlen) < 0 ||
	    check_ifname("tap", def->tap, err, errlen) < 0 ||
	    check_ifname("bridge", def->bridge, err, errlen) < 0 ||
	    check_mac(def->mac, err, errlen) < 0)
		return -1;
	if (!def->disk[0] != !def->nbd_socket[0]) {
		snprintf(err, errlen, "a disk needs both 'disk' and 'nbd_socket'");
		return -1;
	}
	if (def->clone_of[0] && !only_chars(def->clone_of, "_-@.")) {
		snprintf(err, errlen, "field 'clone_of': '%s' is not a fork id", def->clone_of);
		return -1;
	}
	if (def->clone_watch[0] && (strcmp(def->clone_watch, "off") || !def->clone_of[0])) {
		snprintf(err, errlen, "field 'clone_watch' may only be \"off\", on a clone");
		return -1;
	}
	if (def->clone_released[0] && (strcmp(def->clone_released, "1") || !def->clone_of[0])) {
		snprintf(err, errlen, "field 'clone_released' may only be \"1\", on a clone");
		return -1;
	}
	/* The relay needs both ends: QEMU's stream socket and a tap. */
	if (!def->net_socket[0] != !def->tap[0]) {
		snprintf(err, errlen, "a NIC needs both 'net_socket' and 'tap' "
			 "(or neither, for a VM without a NIC)");
		return -1;
	}
	if (!def->tap[0] && (def->bridge[0] || def->mac[0])) {
		snprintf(err, errlen, "'bridge' and 'mac' describe a NIC: give "
			 "'net_socket' and 'tap' too");
		return -1;
	}
	return 0;
}

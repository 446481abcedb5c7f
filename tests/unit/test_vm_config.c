/* VM_CONFIG: encoder and decoder agree, and every malformed field is refused. */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"
#include "vm/vm_config.h"

static void fill(struct vm_config *c)
{
	json_t *argv = json_pack("[s, s, s]", "qemu-system-x86_64", "-name", "db1");

	memset(c, 0, sizeof(*c));
	strcpy(c->vm, "db1");
	strcpy(c->primary_host, "hostA");
	strcpy(c->run_dir, "/run/remusdb/vms/db1");
	c->disk_size = 1 << 30;
	strcpy(c->mac, "52:54:00:12:34:56");
	strcpy(c->tap, "rdbt-db1");
	strcpy(c->bridge, "br0");
	c->interval_ms = 50;
	c->heartbeat_ms = 100;
	c->peer_timeout_ms = 300;
	strcpy(c->ownership, "{\"owner\":\"hostA\",\"generation\":7}");
	c->generation = 7;
	CU_ASSERT_EQUAL_FATAL(vm_config_set_argv(c, argv, (char[64]){ 0 }, 64), 0);
	json_decref(argv);
}

/* The sample config in c, and its encoding (the caller frees both). */
static char *encode_sample(struct vm_config *c)
{
	char err[256];
	char *text;

	fill(c);
	text = vm_config_encode(c, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	return text;
}

static void test_round_trip(void)
{
	struct vm_config c, d;
	char err[256];
	char *text = encode_sample(&c);

	CU_ASSERT_EQUAL_FATAL(vm_config_decode(text, strlen(text), &d, err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(d.vm, "db1");
	CU_ASSERT_STRING_EQUAL(d.primary_host, "hostA");
	CU_ASSERT_STRING_EQUAL(d.run_dir, c.run_dir);
	CU_ASSERT_EQUAL(d.disk_size, 1u << 30);
	CU_ASSERT_STRING_EQUAL(d.mac, c.mac);
	CU_ASSERT_STRING_EQUAL(d.tap, "rdbt-db1");
	CU_ASSERT_STRING_EQUAL(d.bridge, "br0");
	CU_ASSERT_EQUAL(d.interval_ms, 50);
	CU_ASSERT_EQUAL(d.heartbeat_ms, 100);
	CU_ASSERT_EQUAL(d.peer_timeout_ms, 300);
	CU_ASSERT_STRING_EQUAL(d.ownership, c.ownership);
	CU_ASSERT_EQUAL(d.generation, 7);
	CU_ASSERT_EQUAL_FATAL(d.qemu_argc, 3);
	CU_ASSERT_STRING_EQUAL(d.qemu_argv[0], "qemu-system-x86_64");
	CU_ASSERT_STRING_EQUAL(d.qemu_argv[2], "db1");
	CU_ASSERT_PTR_NULL(d.qemu_argv[3]);
	free(text);
	vm_config_clear(&c);
	vm_config_clear(&d);
}

/* Encodes a valid config, applies `edit` to its JSON, and expects `needle` in the refusal. */
static void refuse(void (*edit)(json_t *o), const char *needle)
{
	struct vm_config c, d;
	char err[256];
	char *text = encode_sample(&c);
	json_t *o = json_loads(text, 0, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(o);
	edit(o);
	free(text);
	text = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	err[0] = '\0';
	CU_ASSERT_EQUAL(vm_config_decode(text, strlen(text), &d, err, sizeof(err)), -1);
	if (!strstr(err, needle))
		fprintf(stderr, "\nrefusal '%s' lacks '%s'\n", err, needle);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, needle));
	CU_ASSERT_EQUAL(strncmp(err, "VM_CONFIG", 9), 0);
	free(text);
	vm_config_clear(&c);
	vm_config_clear(&d);
}

#define EDIT(fn, body) static void fn(json_t *o) { body; }
EDIT(bad_name, json_object_set_new(o, "vm", json_string("../etc")))
EDIT(long_name, json_object_set_new(o, "vm", json_string("a234567890123456789012345678901234")))
EDIT(name_not_string, json_object_set_new(o, "vm", json_integer(3)))
EDIT(no_argv, json_object_del(o, "qemu_argv"))
EDIT(empty_argv, json_object_set_new(o, "qemu_argv", json_array()))
EDIT(argv_not_strings, json_object_set_new(o, "qemu_argv", json_pack("[s, i]", "q", 1)))
EDIT(argv_empty_first, json_object_set_new(o, "qemu_argv", json_pack("[s]", "")))
EDIT(argv_nul, json_object_set_new(o, "qemu_argv",
				  json_pack("[s, s#]", "q", "a\0b", (size_t)3)))
EDIT(interval_low, json_object_set_new(o, "interval_ms", json_integer(5)))
EDIT(interval_high, json_object_set_new(o, "interval_ms", json_integer(501)))
EDIT(interval_string, json_object_set_new(o, "interval_ms", json_string("50")))
EDIT(heartbeat_zero, json_object_set_new(o, "heartbeat_ms", json_integer(0)))
EDIT(timeout_zero, json_object_set_new(o, "peer_timeout_ms", json_integer(0)))
EDIT(timeout_negative, json_object_set_new(o, "peer_timeout_ms", json_integer(-1)))
EDIT(disk_zero, json_object_set_new(o, "disk_size", json_integer(0)))
EDIT(disk_real, json_object_set_new(o, "disk_size", json_real(1.5)))
EDIT(run_dir_relative, json_object_set_new(o, "run_dir", json_string("run/db1")))
EDIT(run_dir_root, json_object_set_new(o, "run_dir", json_string("/")))
EDIT(run_dir_dotdot, json_object_set_new(o, "run_dir", json_string("/run/../etc")))
EDIT(bad_mac, json_object_set_new(o, "mac", json_string("52:54:00:12:34")))
EDIT(mac_letters, json_object_set_new(o, "mac", json_string("zz:54:00:12:34:56")))
EDIT(no_tap, json_object_set_new(o, "tap", json_string("")))
EDIT(bad_tap, json_object_set_new(o, "tap", json_string("a b")))
EDIT(long_bridge, json_object_set_new(o, "bridge", json_string("b123456789012345678")))
EDIT(empty_host, json_object_set_new(o, "primary_host", json_string("")))
EDIT(host_blank, json_object_set_new(o, "primary_host", json_string("a b")))
EDIT(empty_ownership, json_object_set_new(o, "ownership", json_string("")))
EDIT(no_generation, json_object_del(o, "generation"))
EDIT(unknown_member, json_object_set_new(o, "extra", json_true()))

static void test_refusals(void)
{
	refuse(bad_name, "VM name");
	refuse(long_name, "vm must be a string");
	refuse(name_not_string, "vm must be a string");
	refuse(no_argv, "qemu_argv");
	refuse(empty_argv, "qemu_argv");
	refuse(argv_not_strings, "qemu_argv[1]");
	refuse(argv_empty_first, "qemu_argv[0]");
	refuse(argv_nul, "is not allowed"); /* jansson refuses NUL itself */
	refuse(interval_low, "interval_ms 5 is out of range");
	refuse(interval_high, "interval_ms 501");
	refuse(interval_string, "interval_ms must be an integer");
	refuse(heartbeat_zero, "heartbeat_ms 0");
	refuse(timeout_zero, "peer_timeout_ms 0");
	refuse(timeout_negative, "peer_timeout_ms must be an integer");
	refuse(disk_zero, "disk_size 0");
	refuse(disk_real, "disk_size must be an integer");
	refuse(run_dir_relative, "run_dir");
	refuse(run_dir_root, "run_dir");
	refuse(run_dir_dotdot, "run_dir");
	refuse(bad_mac, "not a MAC address");
	refuse(mac_letters, "not a MAC address");
	refuse(no_tap, "tap is required");
	refuse(bad_tap, "interface name");
	refuse(long_bridge, "bridge must be a string");
	refuse(empty_host, "primary_host");
	refuse(host_blank, "primary_host");
	refuse(empty_ownership, "ownership");
	refuse(no_generation, "generation");
	refuse(unknown_member, "unknown member 'extra'");
}

static void test_not_json(void)
{
	static const char *const bad[] = { "", "[]", "{", "null", "{\"vm\":\"a\",\"vm\":\"b\"}" };
	struct vm_config d;
	char err[256];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CU_ASSERT_EQUAL(vm_config_decode(bad[i], strlen(bad[i]), &d, err, sizeof(err)), -1);
		CU_ASSERT_EQUAL(strncmp(err, "VM_CONFIG", 9), 0);
		vm_config_clear(&d);
	}
}

/* The encoder refuses what the decoder would: protect reports it on the primary. */
static void test_encoder_refuses(void)
{
	struct vm_config c;
	char err[256];

	fill(&c);
	strcpy(c.mac, "nope");
	CU_ASSERT_PTR_NULL(vm_config_encode(&c, err, sizeof(err)));
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "MAC"));
	strcpy(c.mac, "52:54:00:12:34:56");
	c.ownership[0] = '\0';
	CU_ASSERT_PTR_NULL(vm_config_encode(&c, err, sizeof(err)));
	vm_config_clear(&c);
	CU_ASSERT_EQUAL(vm_config_set_argv(&c, NULL, err, sizeof(err)), -1);
}

static void test_definition(void)
{
	struct vm_config c;
	struct vm_definition def;
	char err[256];

	fill(&c);
	CU_ASSERT_EQUAL_FATAL(vm_config_definition(&c, "/state/replicas/db1.img", "/run/x",
						   &def, err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(def.name, "db1");
	CU_ASSERT_STRING_EQUAL(def.disk, "/state/replicas/db1.img");
	CU_ASSERT_STRING_EQUAL(def.qmp_socket, "/run/x/qmp-daemon.sock");
	CU_ASSERT_STRING_EQUAL(def.net_socket, "/run/x/net.sock");
	CU_ASSERT_STRING_EQUAL(def.mac, c.mac);
	CU_ASSERT_EQUAL(vm_definition_validate(&def, err, sizeof(err)), 0);
	vm_config_clear(&c);
}

int register_vm_config_tests(void)
{
	CU_pSuite suite = CU_add_suite("vm_config", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "round trip", test_round_trip) ||
	    !CU_add_test(suite, "malformed fields refused", test_refusals) ||
	    !CU_add_test(suite, "not a JSON object", test_not_json) ||
	    !CU_add_test(suite, "encoder refuses", test_encoder_refuses) ||
	    !CU_add_test(suite, "takeover definition", test_definition))
		return -1;
	return 0;
}

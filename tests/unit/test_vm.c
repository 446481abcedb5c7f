/* VM definitions and the registry's persistence (VMs without NIC). */
#include <CUnit/CUnit.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "suites.h"
#include "vm/vm.h"

static char err[512];

static int from_text(const char *text, struct vm_definition *def)
{
	json_t *obj = json_loads(text, 0, NULL);
	int rc;

	err[0] = '\0';
	rc = vm_definition_from_json(obj, def, err, sizeof(err));
	if (rc == 0)
		rc = vm_definition_validate(def, err, sizeof(err));
	json_decref(obj);
	return rc;
}

static void expect_refused(const char *text, const char *needle)
{
	struct vm_definition def;

	CU_ASSERT_EQUAL(from_text(text, &def), -1);
	if (!strstr(err, needle))
		fprintf(stderr, "\n  error '%s' lacks '%s'\n", err, needle);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, needle));
}

static void test_definition_validation(void)
{
	struct vm_definition def;

	CU_ASSERT_EQUAL(from_text("{\"name\":\"db-1_a\",\"disk\":\"/d.img\","
				  "\"nbd_socket\":\"/run/n.sock\",\"net_socket\":\"/run/s\","
				  "\"tap\":\"tap-db1\",\"bridge\":\"br0\","
				  "\"mac\":\"52:54:00:AB:cd:01\",\"qmp_socket\":\"/run/q\"}",
				  &def), 0);
	CU_ASSERT_STRING_EQUAL(def.name, "db-1_a");
	CU_ASSERT_STRING_EQUAL(def.tap, "tap-db1");
	CU_ASSERT_STRING_EQUAL(def.mac, "52:54:00:AB:cd:01");
	/* to_json round trip */
	json_t *obj = vm_definition_to_json(&def);
	struct vm_definition back;
	CU_ASSERT_EQUAL(vm_definition_from_json(obj, &back, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(memcmp(&def, &back, sizeof(def)), 0);
	json_decref(obj);

	expect_refused("{\"disk\":\"/d\",\"nbd_socket\":\"/n\"}", "'name' is required");
	expect_refused("{\"name\":\"a b\",\"disk\":\"/d\",\"nbd_socket\":\"/n\"}", "may use only");
	expect_refused("{\"name\":\"a/b\",\"disk\":\"/d\",\"nbd_socket\":\"/n\"}", "may use only");
	expect_refused("{\"name\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\",\"disk\":\"/d\","
		       "\"nbd_socket\":\"/n\"}", "too long");
	expect_refused("{\"name\":\"a\",\"disk\":\"d.img\",\"nbd_socket\":\"/n\"}", "absolute path");
	expect_refused("{\"name\":\"a\",\"disk\":\"/d\"}", "'nbd_socket' is required");
	expect_refused("{\"name\":\"a\",\"disk\":\"/d\",\"nbd_socket\":\"/n\",\"colour\":\"red\"}",
		       "unknown field 'colour'");
	expect_refused("{\"name\":\"a\",\"disk\":7,\"nbd_socket\":\"/n\"}", "must be a string");
	expect_refused("{\"name\":\"a\",\"disk\":\"/d\",\"nbd_socket\":\"/n\",\"tap\":\"t0\"}",
		       "both 'net_socket' and 'tap'");
	expect_refused("{\"name\":\"a\",\"disk\":\"/d\",\"nbd_socket\":\"/n\",\"bridge\":\"br0\"}",
		       "describe a NIC");
	expect_refused("{\"name\":\"a\",\"disk\":\"/d\",\"nbd_socket\":\"/n\",\"net_socket\":\"/s\","
		       "\"tap\":\"t0\",\"mac\":\"52:54:00:12:34\"}", "not a MAC address");
	expect_refused("{\"name\":\"a\",\"disk\":\"/d\",\"nbd_socket\":\"/n\",\"net_socket\":\"/s\","
		       "\"tap\":\"tap with space\"}", "interface name");
	expect_refused("{\"name\":\"a\",\"disk\":\"/d\",\"nbd_socket\":\"/n\",\"net_socket\":\"/s\","
		       "\"tap\":\"a-very-long-tap-name\"}", "too long");
	expect_refused("[1,2]", "JSON object");

	/* A fork's clone: no disk needed (QEMU opens its overlay), both or none. */
	CU_ASSERT_EQUAL(from_text("{\"name\":\"dbc1\",\"clone_of\":\"db@fork-1-1\","
				  "\"net_socket\":\"/run/s\",\"tap\":\"t1\"}", &def), 0);
	CU_ASSERT_STRING_EQUAL(def.clone_of, "db@fork-1-1");
	CU_ASSERT_EQUAL(from_text("{\"name\":\"dbc1\",\"clone_of\":\"db@fork-1-1\","
				  "\"clone_watch\":\"off\",\"clone_released\":\"1\"}", &def), 0);
	expect_refused("{\"name\":\"a\"}", "'disk' is required");
	expect_refused("{\"name\":\"a\",\"clone_of\":\"x\",\"disk\":\"/d\"}",
		       "both 'disk' and 'nbd_socket'");
	expect_refused("{\"name\":\"a\",\"clone_of\":\"x y\"}", "not a fork id");
	expect_refused("{\"name\":\"a\",\"clone_of\":\"x\",\"clone_watch\":\"on\"}",
		       "'clone_watch' may only");
	expect_refused("{\"name\":\"a\",\"disk\":\"/d\",\"nbd_socket\":\"/n\","
		       "\"clone_watch\":\"off\"}", "'clone_watch' may only");
	expect_refused("{\"name\":\"a\",\"disk\":\"/d\",\"nbd_socket\":\"/n\","
		       "\"clone_released\":\"1\"}", "'clone_released' may only");
}

static struct {
	char dir[64];
	char state[96];
	char disk[96];
	char sock[96];
	event_loop *loop;
} fx;

static void make_fixture(void)
{
	strcpy(fx.dir, "/tmp/remusdbd-vm-test-XXXXXX");
	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(fx.dir));
	snprintf(fx.state, sizeof(fx.state), "%s/state/deep", fx.dir);
	snprintf(fx.disk, sizeof(fx.disk), "%s/disk.img", fx.dir);
	snprintf(fx.sock, sizeof(fx.sock), "%s/nbd.sock", fx.dir);
	int fd = open(fx.disk, O_RDWR | O_CREAT, 0600);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(ftruncate(fd, 1 << 20), 0);
	close(fd);
	fx.loop = event_loop_create();
}

static void drop_fixture(void)
{
	char cmd[160];

	event_loop_destroy(fx.loop);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", fx.dir);
	CU_ASSERT_EQUAL(system(cmd), 0);
}

static void fill_definition(struct vm_definition *def, const char *name)
{
	memset(def, 0, sizeof(*def));
	strcpy(def->name, name);
	strcpy(def->disk, fx.disk);
	strcpy(def->nbd_socket, fx.sock);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fputs(text, f);
	fclose(f);
}

static void test_registry_persists_and_reloads(void)
{
	struct vm_definition def;
	char path[160];
	struct stat st;

	make_fixture();
	struct vm_registry *reg = vm_registry_create(fx.loop, fx.state, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	CU_ASSERT_EQUAL(vm_registry_load(reg), 0);

	fill_definition(&def, "vm1");
	CU_ASSERT_EQUAL(vm_add(reg, &def, err, sizeof(err)), 0);
	snprintf(path, sizeof(path), "%s/vms/vm1.json", fx.state);
	CU_ASSERT_EQUAL(stat(path, &st), 0);
	CU_ASSERT_EQUAL(stat(fx.sock, &st), 0);
	CU_ASSERT_TRUE(S_ISSOCK(st.st_mode));
	json_t *saved = json_load_file(path, 0, NULL);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(saved, "disk")), fx.disk);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(saved, "format")), 1);
	json_decref(saved);

	/* Refusals: same name, same socket, missing disk (and none persisted). */
	CU_ASSERT_EQUAL(vm_add(reg, &def, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "already exists"));
	fill_definition(&def, "vm2");
	CU_ASSERT_EQUAL(vm_add(reg, &def, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "already used by VM 'vm1'"));
	snprintf(def.nbd_socket, sizeof(def.nbd_socket), "%s/other.sock", fx.dir);
	snprintf(def.disk, sizeof(def.disk), "%s/missing.img", fx.dir);
	CU_ASSERT_EQUAL(vm_add(reg, &def, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "No such file"));
	snprintf(path, sizeof(path), "%s/vms/vm2.json", fx.state);
	CU_ASSERT_NOT_EQUAL(stat(path, &st), 0);
	CU_ASSERT_EQUAL(vm_registry_count(reg), 1);

	/* Status of one VM. */
	json_t *status = vm_status_json(vm_find(reg, "vm1"));
	json_t *disk = json_array_get(json_object_get(status, "disks"), 0);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(status, "name")), "vm1");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(status, "run_state")), "unknown");
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(disk, "size")), 1 << 20);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(disk, "socket")), fx.sock);
	CU_ASSERT_EQUAL(json_array_size(json_object_get(status, "nics")), 0);
	json_decref(status);

	/* "Restart": a new registry serves the same socket again. */
	vm_registry_destroy(reg);
	CU_ASSERT_NOT_EQUAL(stat(fx.sock, &st), 0);
	snprintf(path, sizeof(path), "%s/vms/broken.json", fx.state);
	write_file(path, "{\"name\": \"broken\", \"disk\": ");
	snprintf(path, sizeof(path), "%s/vms/.vm3.json.tmp", fx.state);
	write_file(path, "{");
	reg = vm_registry_create(fx.loop, fx.state, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	CU_ASSERT_EQUAL(vm_registry_load(reg), 1);
	CU_ASSERT_PTR_NOT_NULL(vm_find(reg, "vm1"));
	CU_ASSERT_PTR_NULL(vm_find(reg, "broken"));
	CU_ASSERT_NOT_EQUAL(stat(path, &st), 0); /* unfinished temp file removed */
	CU_ASSERT_EQUAL(stat(fx.sock, &st), 0);
	json_t *all = vm_registry_status_json(reg);
	CU_ASSERT_EQUAL(json_array_size(all), 1);
	json_decref(all);

	CU_ASSERT_EQUAL(vm_remove(reg, "vm1", err, sizeof(err)), 0);
	snprintf(path, sizeof(path), "%s/vms/vm1.json", fx.state);
	CU_ASSERT_NOT_EQUAL(stat(path, &st), 0);
	CU_ASSERT_PTR_NULL(vm_find(reg, "vm1"));
	CU_ASSERT_EQUAL(vm_remove(reg, "vm1", err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "no VM named 'vm1'"));
	vm_registry_destroy(reg);
	drop_fixture();
}

static void test_loaded_vm_with_missing_disk_reports_error(void)
{
	struct vm_definition def;

	make_fixture();
	struct vm_registry *reg = vm_registry_create(fx.loop, fx.state, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	fill_definition(&def, "vm1");
	snprintf(def.qmp_socket, sizeof(def.qmp_socket), "%s/qmp.sock", fx.dir);
	CU_ASSERT_EQUAL_FATAL(vm_add(reg, &def, err, sizeof(err)), 0);
	vm_registry_destroy(reg);
	unlink(fx.disk);

	reg = vm_registry_create(fx.loop, fx.state, err, sizeof(err));
	CU_ASSERT_EQUAL(vm_registry_load(reg), 1);
	json_t *status = vm_status_json(vm_find(reg, "vm1"));
	const char *error = json_string_value(json_object_get(status, "error"));
	CU_ASSERT_PTR_NOT_NULL(error);
	CU_ASSERT_PTR_NOT_NULL(error ? strstr(error, "disk.img") : NULL);
	json_t *disk = json_array_get(json_object_get(status, "disks"), 0);
	CU_ASSERT_TRUE(json_is_false(json_object_get(disk, "serving")));
	json_decref(status);
	/* It can still be removed. */
	CU_ASSERT_EQUAL(vm_remove(reg, "vm1", err, sizeof(err)), 0);
	vm_registry_destroy(reg);
	drop_fixture();
}

static void test_read_tracking_on_and_off(void)
{
	struct vm_definition def;

	make_fixture();
	struct vm_registry *reg = vm_registry_create(fx.loop, fx.state, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	fill_definition(&def, "vm1");
	CU_ASSERT_EQUAL_FATAL(vm_add(reg, &def, err, sizeof(err)), 0);
	struct vm *vm = vm_find(reg, "vm1");
	CU_ASSERT_PTR_NULL(vm_read_index(vm));
	CU_ASSERT_EQUAL(vm_read_tracking_start(vm, 16, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "16-byte read index"));
	CU_ASSERT_EQUAL(vm_read_tracking_start(vm, 1 << 20, err, sizeof(err)), 0);
	CU_ASSERT_PTR_NOT_NULL(vm_read_index(vm));

	/* The disk's status carries the index's statistics while it is on. */
	json_t *status = vm_status_json(vm);
	json_t *disk = json_array_get(json_object_get(status, "disks"), 0);
	json_t *rt = json_object_get(disk, "read_tracking");
	CU_ASSERT_TRUE(json_integer_value(json_object_get(rt, "capacity")) > 10000);
	CU_ASSERT_TRUE(json_integer_value(json_object_get(rt, "bytes")) <= 1 << 20);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(rt, "entries")), 0);
	CU_ASSERT_TRUE(json_is_real(json_object_get(rt, "hit_rate")));
	json_decref(status);

	vm_read_tracking_stop(vm);
	CU_ASSERT_PTR_NULL(vm_read_index(vm));
	status = vm_status_json(vm);
	disk = json_array_get(json_object_get(status, "disks"), 0);
	CU_ASSERT_PTR_NULL(json_object_get(disk, "read_tracking"));
	json_decref(status);
	/* On again, then freed with the VM. */
	CU_ASSERT_EQUAL(vm_read_tracking_start(vm, 1 << 20, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(vm_remove(reg, "vm1", err, sizeof(err)), 0);
	vm_registry_destroy(reg);
	drop_fixture();
}

static int quiet_logs(void)
{
	/* Above LOG_ERROR: the errors provoked here are expected. */
	return log_open(NULL, LOG_ERROR + 1);
}

static int restore_logs(void)
{
	return log_open(NULL, LOG_INFO);
}

int register_vm_tests(void)
{
	CU_pSuite suite = CU_add_suite("vm", quiet_logs, restore_logs);

	if (!suite ||
	    !CU_add_test(suite, "definition validation", test_definition_validation) ||
	    !CU_add_test(suite, "registry persists and reloads", test_registry_persists_and_reloads) ||
	    !CU_add_test(suite, "missing disk reported, not fatal", test_loaded_vm_with_missing_disk_reports_error) ||
	    !CU_add_test(suite, "read tracking on and off", test_read_tracking_on_and_off))
		return -1;
	return 0;
}

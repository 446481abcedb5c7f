/* The control socket: JSON lines in, JSON lines out, on a real socket. */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "control/control.h"
#include "base/log.h"
#include "suites.h"
#include "vm/vm.h"

static struct {
	char dir[64];
	char sock[96];
	char disk[96];
	event_loop *loop;
	struct vm_registry *vms;
	struct control_server *control;
	int shutdowns;
} fx;

static void on_shutdown(void *data)
{
	fx.shutdowns++;
}

static void setup(void)
{
	char err[256], state[96];

	memset(&fx, 0, sizeof(fx));
	strcpy(fx.dir, "/tmp/remusdbd-ctl-test-XXXXXX");
	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(fx.dir));
	snprintf(fx.sock, sizeof(fx.sock), "%s/ctl.sock", fx.dir);
	snprintf(fx.disk, sizeof(fx.disk), "%s/disk.img", fx.dir);
	snprintf(state, sizeof(state), "%s/state", fx.dir);
	int fd = open(fx.disk, O_RDWR | O_CREAT, 0600);
	CU_ASSERT_FATAL(fd >= 0 && ftruncate(fd, 4096) == 0);
	close(fd);
	fx.loop = event_loop_create();
	fx.vms = vm_registry_create(fx.loop, state, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(fx.vms);
	struct control_config config = {
		.socket_path = fx.sock, .host = "labA", .vms = fx.vms,
		.on_shutdown = on_shutdown,
	};
	fx.control = control_create(fx.loop, &config);
	CU_ASSERT_PTR_NOT_NULL_FATAL(fx.control);
}

static void teardown(void)
{
	char cmd[128];

	control_destroy(fx.control);
	vm_registry_destroy(fx.vms);
	event_loop_destroy(fx.loop);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", fx.dir);
	CU_ASSERT_EQUAL(system(cmd), 0);
}

static int connect_client(void)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	strcpy(addr.sun_path, fx.sock);
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Sends text, then runs the loop until one reply line arrives; parses it. */
static json_t *ask(int fd, const char *text)
{
	char line[8192];
	size_t len = 0;
	int64_t deadline = monotonic_ms() + 3000;

	if (send(fd, text, strlen(text), MSG_NOSIGNAL) != (ssize_t)strlen(text))
		return NULL;
	while (monotonic_ms() < deadline && len < sizeof(line) - 1) {
		ssize_t n = recv(fd, line + len, 1, MSG_DONTWAIT);
		if (n == 1) {
			if (line[len] == '\n')
				return json_loadb(line, len, 0, NULL);
			len++;
			continue;
		}
		if (n == 0 || errno != EAGAIN)
			return NULL;
		event_loop_run_once(fx.loop, 10);
	}
	return NULL;
}

static int is_ok(json_t *reply)
{
	return json_is_true(json_object_get(reply, "ok"));
}

static const char *error_of(json_t *reply)
{
	const char *e = json_string_value(json_object_get(reply, "error"));
	return e ? e : "";
}

/* True when the request's reply is an error containing text. */
static int replies_error(int fd, const char *request, const char *text)
{
	json_t *r = ask(fd, request);
	int found = r && !is_ok(r) && strstr(error_of(r), text) != NULL;

	json_decref(r);
	return found;
}

static void test_ping_and_errors_keep_connection(void)
{
	setup();
	int fd = connect_client();
	CU_ASSERT_FATAL(fd >= 0);

	json_t *r = ask(fd, "{\"cmd\": \"ping\", \"id\": 42}\n");
	CU_ASSERT_TRUE(is_ok(r));
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(r, "host")), "labA");
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(r, "pid")), getpid());
	CU_ASSERT_PTR_NOT_NULL(json_string_value(json_object_get(r, "version")));
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(r, "id")), 42);
	json_decref(r);

	r = ask(fd, "this is not json\n");
	CU_ASSERT_FALSE(is_ok(r));
	CU_ASSERT_PTR_NOT_NULL(strstr(error_of(r), "not valid JSON"));
	json_decref(r);
	r = ask(fd, "[1, 2]\n");
	CU_ASSERT_PTR_NOT_NULL(strstr(error_of(r), "JSON object"));
	json_decref(r);
	r = ask(fd, "{\"cmd\": \"reboot\"}\n");
	CU_ASSERT_PTR_NOT_NULL(strstr(error_of(r), "unknown command 'reboot'"));
	json_decref(r);
	r = ask(fd, "{\"command\": \"ping\"}\n");
	CU_ASSERT_PTR_NOT_NULL(strstr(error_of(r), "missing field 'cmd'"));
	json_decref(r);
	r = ask(fd, "{\"cmd\": \"vm-remove\"}\n");
	CU_ASSERT_PTR_NOT_NULL(strstr(error_of(r), "missing field 'vm'"));
	json_decref(r);
	r = ask(fd, "{\"cmd\": \"ping\", \"extra\": 1}\n");
	CU_ASSERT_PTR_NOT_NULL(strstr(error_of(r), "unknown field 'extra'"));
	json_decref(r);
	r = ask(fd, "{\"cmd\": \"status\", \"vm\": \"ghost\"}\n");
	CU_ASSERT_PTR_NOT_NULL(strstr(error_of(r), "no VM named 'ghost'"));
	json_decref(r);
	/* Blank lines are skipped; two requests in one write get two replies. */
	r = ask(fd, "\n\r\n{\"cmd\": \"ping\"}\n{\"cmd\": \"ping\", \"id\": \"b\"}\n");
	CU_ASSERT_TRUE(is_ok(r));
	json_decref(r);
	r = ask(fd, "");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(r, "id")), "b");
	json_decref(r);
	close(fd);
	teardown();
}

static void test_vm_add_status_remove(void)
{
	char request[512];

	setup();
	int fd = connect_client();
	snprintf(request, sizeof(request),
		 "{\"cmd\": \"vm-add\", \"name\": \"vm1\", \"disk\": \"%s\", "
		 "\"nbd_socket\": \"%s/nbd.sock\"}\n", fx.disk, fx.dir);
	json_t *r = ask(fd, request);
	CU_ASSERT_TRUE(is_ok(r));
	json_t *disk = json_array_get(json_object_get(json_object_get(r, "vm"), "disks"), 0);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(disk, "size")), 4096);
	json_decref(r);

	r = ask(fd, request);
	CU_ASSERT_PTR_NOT_NULL(strstr(error_of(r), "already exists"));
	json_decref(r);
	r = ask(fd, "{\"cmd\": \"vm-add\", \"name\": \"vm2\", \"disk\": \"rel.img\", "
		    "\"nbd_socket\": \"/tmp/x.sock\"}\n");
	CU_ASSERT_PTR_NOT_NULL(strstr(error_of(r), "absolute path"));
	json_decref(r);

	r = ask(fd, "{\"cmd\": \"status\"}\n");
	CU_ASSERT_TRUE(is_ok(r));
	CU_ASSERT_EQUAL(json_array_size(json_object_get(r, "vms")), 1);
	json_decref(r);
	r = ask(fd, "{\"cmd\": \"status\", \"vm\": \"vm1\"}\n");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(json_object_get(r, "vm"), "name")),
			       "vm1");
	json_decref(r);
	/* unprotect and reset-stats are for a protected VM; this one is not. */
	CU_ASSERT_TRUE(replies_error(fd, "{\"cmd\": \"reset-stats\", \"vm\": \"vm1\"}\n",
				     "'vm1' is not protected"));
	CU_ASSERT_TRUE(replies_error(fd, "{\"cmd\": \"unprotect\", \"vm\": \"vm1\"}\n",
				     "'vm1' is not protected"));
	CU_ASSERT_TRUE(replies_error(fd, "{\"cmd\": \"reset-stats\"}\n", "missing field 'vm'"));
	r = ask(fd, "{\"cmd\": \"vm-remove\", \"vm\": \"vm1\"}\n");
	CU_ASSERT_TRUE(is_ok(r));
	json_decref(r);
	CU_ASSERT_EQUAL(vm_registry_count(fx.vms), 0);

	CU_ASSERT_EQUAL(fx.shutdowns, 0);
	r = ask(fd, "{\"cmd\": \"shutdown\"}\n");
	CU_ASSERT_TRUE(is_ok(r));
	json_decref(r);
	CU_ASSERT_EQUAL(fx.shutdowns, 1);
	close(fd);
	teardown();
}

static void test_overlong_line_closes(void)
{
	setup();
	int fd = connect_client();
	int other = connect_client();
	char *big = malloc(70000);

	memset(big, 'x', 70000);
	size_t sent = 0;
	int64_t deadline = monotonic_ms() + 3000;
	while (sent < 70000 && monotonic_ms() < deadline) {
		ssize_t n = send(fd, big + sent, 70000 - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n > 0)
			sent += (size_t)n;
		else if (n < 0 && errno != EAGAIN)
			break; /* the server may already have closed */
		event_loop_run_once(fx.loop, 10);
	}
	int closed = 0;
	while (!closed && monotonic_ms() < deadline) {
		char c;
		ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
		closed = n == 0 || (n < 0 && errno != EAGAIN);
		event_loop_run_once(fx.loop, 10);
	}
	CU_ASSERT_TRUE(closed);
	/* Other clients are unaffected. */
	json_t *r = ask(other, "{\"cmd\": \"ping\"}\n");
	CU_ASSERT_TRUE(is_ok(r));
	json_decref(r);
	free(big);
	close(fd);
	close(other);
	teardown();
}

static int quiet_logs(void)
{
	return log_open(NULL, LOG_ERROR);
}

static int restore_logs(void)
{
	return log_open(NULL, LOG_INFO);
}

int register_control_tests(void)
{
	CU_pSuite suite = CU_add_suite("control", quiet_logs, restore_logs);

	if (!suite ||
	    !CU_add_test(suite, "ping; errors keep the connection", test_ping_and_errors_keep_connection) ||
	    !CU_add_test(suite, "vm-add, status, vm-remove, shutdown", test_vm_add_status_remove) ||
	    !CU_add_test(suite, "overlong line closes that client", test_overlong_line_closes))
		return -1;
	return 0;
}

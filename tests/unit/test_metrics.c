/*
 * /metrics and the health checks: the Prometheus exposition of a status
 * document made by hand (every family declared once with HELP and TYPE,
 * counters named _total, a histogram's buckets cumulative up to +Inf =
 * _count, label values escaped, unknown values left out rather than
 * shown as 0), the /primary and /replica verdicts, and the endpoint
 * itself answering a real HTTP request while the test drives the event
 * loop one turn at a time (libmicrohttpd in external mode, no thread).
 */
#include <CUnit/CUnit.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/event_loop.h"
#include "control/http_endpoint.h"
#include "base/loop_turns.h"
#include "base/metrics.h"
#include "suites.h"
#include "vm/vm.h"

/* ---- the pause histogram ------------------------------------------------ */

static void test_histogram_cumulative(void)
{
	struct pause_histogram h = { 0 };

	pause_histogram_observe(&h, 0.5);   /* le 1 */
	pause_histogram_observe(&h, 7);     /* le 10 */
	pause_histogram_observe(&h, 10);    /* le 10: bounds are inclusive */
	pause_histogram_observe(&h, 9000);  /* beyond 5000: only +Inf */
	json_t *j = pause_histogram_json(&h);
	json_t *cum = json_object_get(j, "cumulative");
	CU_ASSERT_EQUAL(json_array_size(cum), METRICS_PAUSE_BUCKETS);
	CU_ASSERT_EQUAL(json_integer_value(json_array_get(cum, 0)), 1);  /* le 1 */
	CU_ASSERT_EQUAL(json_integer_value(json_array_get(cum, 2)), 1);  /* le 5 */
	CU_ASSERT_EQUAL(json_integer_value(json_array_get(cum, 3)), 3);  /* le 10 */
	CU_ASSERT_EQUAL(json_integer_value(json_array_get(cum, METRICS_PAUSE_BUCKETS - 1)), 3);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(j, "count")), 4);
	CU_ASSERT_DOUBLE_EQUAL(json_number_value(json_object_get(j, "sum_ms")), 9017.5, 1e-9);
	json_decref(j);
}

/* ---- the exposition ----------------------------------------------------- */

/* A protected VM, a bare VM with an awkward name, and two replicas. */
static const char *vms_text =
	"[{\"name\": \"db\", \"run_state\": \"running\", \"protection\": {"
	"   \"role\": \"primary\", \"state\": \"protected\", \"epochs\": 1234,"
	"   \"acked_epoch\": 1233, \"in_flight\": 1, \"last_ack_age_ms\": 42,"
	"   \"bytes_sent\": 987654321, \"backpressure_events\": 3, \"held_frames\": 2,"
	"   \"held_bytes\": 3000, \"interval_ms\": 100,"
	"   \"reprotect\": {\"unprotected_seconds\": 12.5, \"attempts\": 3, \"reprotections\": 2},"
	"   \"pipeline\": {\"raw_dirty_bytes_total\": 4096000, \"page_bytes_sent_total\": 123456},"
	"   \"pause_histogram\": {\"bounds_ms\": [1, 10, 100], \"cumulative\": [0, 5, 9],"
	"                         \"count\": 10, \"sum_ms\": 512.5},"
	"   \"guest_pause_histogram\": {\"bounds_ms\": [1, 10, 100], \"cumulative\": [0, 3, 8],"
	"                         \"count\": 9, \"sum_ms\": 700}}},"
	" {\"name\": \"we\\\"ird\\\\vm\\n\", \"run_state\": \"paused\"}]";
static const char *replicas_text =
	"[{\"vm\": \"other\", \"role\": \"backup\", \"state\": \"ready\", \"committed_epoch\": 77,"
	"  \"epochs_committed\": 70, \"last_heard_ms\": 20, \"failover\": null,"
	"  \"memory\": {\"admitted_bytes\": 1476395008}},"
	" {\"vm\": \"gone\", \"role\": \"backup\", \"state\": \"active\", \"committed_epoch\": 9,"
	"  \"epochs_committed\": 9, \"last_heard_ms\": 60000,"
	"  \"failover\": {\"detected_ms_after_last_heard\": 212, \"arbitration_ms\": 15.5,"
	"                 \"total_ms\": null}}]";

/* The families that describe the host, not one VM (metrics.c's
 * put_host_memory and put_loop_turns). */
static int host_wide(const char *family)
{
	static const char *const names[] = {
		"remusdb_backup_memory_limit_bytes", "remusdb_backup_memory_admitted_bytes",
		"remusdb_backup_protected_ram_bytes", "remusdb_daemon_resident_bytes",
		"remusdb_loop_turn_seconds", "remusdb_loop_busy_seconds_total",
	};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (!strcmp(family, names[i]))
			return 1;
	return 0;
}

static char *exposition(void)
{
	json_error_t e;
	json_t *vms = json_loads(vms_text, 0, &e);
	json_t *replicas = json_loads(replicas_text, 0, &e);
	char *text = NULL;
	size_t len = 0;
	FILE *out = open_memstream(&text, &len);

	CU_ASSERT_PTR_NOT_NULL_FATAL(vms);
	CU_ASSERT_PTR_NOT_NULL_FATAL(replicas);
	json_t *memory = json_pack("{s:I, s:I, s:I, s:I, s:n}", "limit_bytes",
				   (json_int_t)24 << 30, "admitted_bytes", (json_int_t)1476395008,
				   "protected_ram_bytes", (json_int_t)1 << 30, "daemon_rss_bytes",
				   (json_int_t)1200000000, "daemon_rss_per_protected_gib");
	/* three turns: 40 us, 3 ms and 2 s (past the last bound, +Inf only) */
	struct loop_turns turns;
	loop_turns_init(&turns, 1000000);
	loop_turns_observe(&turns, 40);
	loop_turns_observe(&turns, 3000);
	loop_turns_observe(&turns, 2000000);
	json_t *loop = loop_turns_json(&turns, 11000000);
	CU_ASSERT_EQUAL(metrics_write(out, vms, replicas, memory, loop), 0);
	json_decref(loop);
	json_decref(memory);
	fclose(out);
	json_decref(vms);
	json_decref(replicas);
	return text;
}

static int has_line(const char *text, const char *line)
{
	size_t n = strlen(line);

	for (const char *p = text; (p = strstr(p, line)); p++)
		if ((p == text || p[-1] == '\n') && p[n] == '\n')
			return 1;
	return 0;
}

static void test_samples(void)
{
	char *t = exposition();

	CU_ASSERT(has_line(t, "remusdb_checkpoints_total{vm=\"db\",role=\"primary\"} 1234"));
	CU_ASSERT(has_line(t, "remusdb_acked_epoch{vm=\"db\",role=\"primary\"} 1233"));
	CU_ASSERT(has_line(t, "remusdb_ack_age_seconds{vm=\"db\",role=\"primary\"} 0.042"));
	CU_ASSERT(has_line(t, "remusdb_replication_sent_bytes_total{vm=\"db\",role=\"primary\"} 987654321"));
	CU_ASSERT(has_line(t, "remusdb_checkpoint_raw_dirty_bytes_total{vm=\"db\",role=\"primary\"} 4096000"));
	CU_ASSERT(has_line(t, "remusdb_checkpoint_page_sent_bytes_total{vm=\"db\",role=\"primary\"} 123456"));
	CU_ASSERT(has_line(t, "remusdb_backpressure_events_total{vm=\"db\",role=\"primary\"} 3"));
	CU_ASSERT(has_line(t, "remusdb_checkpoint_interval_seconds{vm=\"db\",role=\"primary\"} 0.1"));
	CU_ASSERT(has_line(t, "remusdb_protection_state{vm=\"db\",role=\"primary\",state=\"protected\"} 1"));
	CU_ASSERT(has_line(t, "remusdb_protection_state{vm=\"db\",role=\"primary\",state=\"fenced\"} 0"));
	CU_ASSERT(has_line(t, "remusdb_vm_qemu_running{vm=\"db\",role=\"primary\"} 1"));
	/* label values: \ " and newline escaped */
	CU_ASSERT(has_line(t, "remusdb_vm_qemu_running{vm=\"we\\\"ird\\\\vm\\n\",role=\"primary\"} 0"));
	CU_ASSERT(has_line(t, "remusdb_vm_info{vm=\"we\\\"ird\\\\vm\\n\",role=\"primary\",run_state=\"paused\"} 1"));
	/* the loop's turns: cumulative buckets, +Inf holds the 2 s one */
	CU_ASSERT(has_line(t, "remusdb_loop_turn_seconds_bucket{le=\"5e-05\"} 1"));
	CU_ASSERT(has_line(t, "remusdb_loop_turn_seconds_bucket{le=\"0.0025\"} 1"));
	CU_ASSERT(has_line(t, "remusdb_loop_turn_seconds_bucket{le=\"0.005\"} 2"));
	CU_ASSERT(has_line(t, "remusdb_loop_turn_seconds_bucket{le=\"1\"} 2"));
	CU_ASSERT(has_line(t, "remusdb_loop_turn_seconds_bucket{le=\"+Inf\"} 3"));
	CU_ASSERT(has_line(t, "remusdb_loop_turn_seconds_count 3"));
	CU_ASSERT(has_line(t, "remusdb_loop_busy_seconds_total 2.00304"));
	/* the backup's side */
	CU_ASSERT(has_line(t, "remusdb_epochs_committed_total{vm=\"other\",role=\"backup\"} 70"));
	CU_ASSERT(has_line(t, "remusdb_committed_epoch{vm=\"other\",role=\"backup\"} 77"));
	CU_ASSERT(has_line(t, "remusdb_replica_state{vm=\"other\",role=\"backup\",state=\"ready\"} 1"));
	CU_ASSERT(has_line(t, "remusdb_replica_state{vm=\"other\",role=\"backup\",state=\"active\"} 0"));
	CU_ASSERT(has_line(t, "remusdb_replica_state{vm=\"gone\",role=\"backup\",state=\"active\"} 1"));
	CU_ASSERT(has_line(t, "remusdb_failovers_total{vm=\"other\",role=\"backup\"} 0"));
	CU_ASSERT(has_line(t, "remusdb_failovers_total{vm=\"gone\",role=\"backup\"} 1"));
	CU_ASSERT(has_line(t, "remusdb_failover_detection_seconds{vm=\"gone\",role=\"backup\"} 0.212"));
	CU_ASSERT(has_line(t, "remusdb_failover_arbitration_seconds{vm=\"gone\",role=\"backup\"} 0.0155"));
	/* memory: the replica's admitted need, and the host's gauges without a vm label */
	CU_ASSERT(has_line(t, "remusdb_replica_memory_admitted_bytes{vm=\"other\",role=\"backup\"} 1476395008"));
	CU_ASSERT_PTR_NULL(strstr(t, "remusdb_replica_memory_admitted_bytes{vm=\"gone\""));
	CU_ASSERT(has_line(t, "remusdb_backup_memory_limit_bytes 25769803776"));
	CU_ASSERT(has_line(t, "remusdb_backup_memory_admitted_bytes 1476395008"));
	CU_ASSERT(has_line(t, "remusdb_backup_protected_ram_bytes 1073741824"));
	CU_ASSERT(has_line(t, "remusdb_daemon_resident_bytes 1200000000"));
	/* null means not known yet: no sample, never a made-up 0 */
	CU_ASSERT_PTR_NULL(strstr(t, "remusdb_failover_downtime_seconds{"));
	CU_ASSERT_PTR_NULL(strstr(t, "remusdb_failover_detection_seconds{vm=\"other\""));
	/* automatic re-protection: the gap, its tries, the re-protections */
	CU_ASSERT(has_line(t, "remusdb_vm_unprotected_seconds{vm=\"db\",role=\"primary\"} 12.5"));
	CU_ASSERT(has_line(t, "remusdb_reprotect_attempts{vm=\"db\",role=\"primary\"} 3"));
	CU_ASSERT(has_line(t, "remusdb_reprotections_total{vm=\"db\",role=\"primary\"} 2"));
	/* a VM without protection has no protection samples */
	CU_ASSERT_PTR_NULL(strstr(t, "remusdb_checkpoints_total{vm=\"we"));
	CU_ASSERT_PTR_NULL(strstr(t, "remusdb_vm_unprotected_seconds{vm=\"we"));
	free(t);
}

/* has_line for family's line whose rest (suffix, labels, value) follows its name. */
static int has_family_line(const char *text, const char *family, const char *rest)
{
	char line[256];

	snprintf(line, sizeof(line), "%s%s", family, rest);
	return has_line(text, line);
}

static void test_histogram_exposition(void)
{
	char *t = exposition();
	const char *b = "remusdb_checkpoint_pause_seconds";

	CU_ASSERT(has_line(t, "# TYPE remusdb_checkpoint_pause_seconds histogram"));
	CU_ASSERT(has_family_line(t, b, "_bucket{vm=\"db\",role=\"primary\",le=\"0.001\"} 0"));
	CU_ASSERT(has_family_line(t, b, "_bucket{vm=\"db\",role=\"primary\",le=\"0.01\"} 5"));
	CU_ASSERT(has_family_line(t, b, "_bucket{vm=\"db\",role=\"primary\",le=\"0.1\"} 9"));
	CU_ASSERT(has_family_line(t, b, "_bucket{vm=\"db\",role=\"primary\",le=\"+Inf\"} 10"));
	CU_ASSERT(has_family_line(t, b, "_sum{vm=\"db\",role=\"primary\"} 0.5125"));
	CU_ASSERT(has_family_line(t, b, "_count{vm=\"db\",role=\"primary\"} 10"));
	/* the guest's pause (our REPLY to QEMU's RESUME): its own family, its own key */
	b = "remusdb_checkpoint_guest_pause_seconds";
	CU_ASSERT(has_line(t, "# TYPE remusdb_checkpoint_guest_pause_seconds histogram"));
	CU_ASSERT(has_family_line(t, b, "_bucket{vm=\"db\",role=\"primary\",le=\"0.01\"} 3"));
	CU_ASSERT(has_family_line(t, b, "_bucket{vm=\"db\",role=\"primary\",le=\"+Inf\"} 9"));
	CU_ASSERT(has_family_line(t, b, "_sum{vm=\"db\",role=\"primary\"} 0.7"));
	free(t);
}

/*
 * The format's rules over the whole text: each family's HELP then TYPE,
 * once; every sample belongs to the family declared last (a histogram's
 * with _bucket/_sum/_count); counters end in _total.
 */
static void test_format_rules(void)
{
	char *t = exposition();
	char family[128] = "", type[32] = "";
	char seen[64][128];
	int nseen = 0;

	for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n")) {
		char name[128], kind[32];
		if (sscanf(line, "# HELP %127s", name) == 1) {
			for (int i = 0; i < nseen; i++)
				CU_ASSERT_NOT_EQUAL(strcmp(seen[i], name), 0);
			if (nseen < 64)
				snprintf(seen[nseen++], sizeof(seen[0]), "%s", name);
			snprintf(family, sizeof(family), "%s", name);
			type[0] = 0;
			continue;
		}
		if (sscanf(line, "# TYPE %127s %31s", name, kind) == 2) {
			CU_ASSERT_STRING_EQUAL(name, family);
			snprintf(type, sizeof(type), "%s", kind);
			if (!strcmp(kind, "counter")) {
				size_t n = strlen(name);
				CU_ASSERT(n > 6 && !strcmp(name + n - 6, "_total"));
			}
			continue;
		}
		CU_ASSERT_NOT_EQUAL(line[0], '#');
		CU_ASSERT(type[0] != 0); /* no sample before its TYPE */
		size_t fl = strlen(family);
		CU_ASSERT_EQUAL_FATAL(strncmp(line, family, fl), 0);
		const char *rest = line + fl;
		if (host_wide(family)) {
			/* the host's own: no vm label, so no sum counts them twice */
			if (!strcmp(type, "histogram")) {
				CU_ASSERT(!strncmp(rest, "_bucket{le=\"", 12) ||
					  !strncmp(rest, "_sum ", 5) || !strncmp(rest, "_count ", 7));
			} else {
				CU_ASSERT_EQUAL(rest[0], ' ');
			}
			continue;
		} else if (!strcmp(type, "histogram")) {
			CU_ASSERT(!strncmp(rest, "_bucket{", 8) || !strncmp(rest, "_sum{", 5) ||
				  !strncmp(rest, "_count{", 7));
		} else {
			CU_ASSERT_EQUAL(rest[0], '{');
		}
		CU_ASSERT_PTR_NOT_NULL(strstr(line, "vm=\""));
		CU_ASSERT_PTR_NOT_NULL(strstr(line, ",role=\""));
	}
	CU_ASSERT(nseen >= 20);
	free(t);
}

/* ---- health ------------------------------------------------------------- */

static json_t *load(const char *text)
{
	json_error_t e;
	json_t *j = json_loads(text, 0, &e);

	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	return j;
}

static void test_health_primary(void)
{
	json_t *vms = load("[{\"name\": \"a\", \"run_state\": \"running\"},"
			   " {\"name\": \"b\", \"run_state\": \"colo\", \"protection\": {\"state\": \"protected\"}},"
			   " {\"name\": \"c\", \"run_state\": \"running\", \"protection\": {\"state\": \"fenced\"}},"
			   " {\"name\": \"d\", \"run_state\": \"unknown\"},"
			   " {\"name\": \"e\", \"run_state\": \"colo\"},"
			   " {\"name\": \"f\", \"run_state\": \"running\", \"protection\": {\"state\": \"arbitrating\"}},"
			   " {\"name\": \"g\", \"run_state\": \"running\", \"protection\": {\"state\": \"unprotected\"}}]");
	char why[128];

	CU_ASSERT_TRUE(metrics_health_primary(vms, "a", why, sizeof(why)));
	CU_ASSERT_TRUE(metrics_health_primary(vms, "b", why, sizeof(why)));  /* in a checkpoint */
	CU_ASSERT_FALSE(metrics_health_primary(vms, "c", why, sizeof(why)));
	CU_ASSERT_STRING_EQUAL(why, "VM c: protection fenced");
	CU_ASSERT_FALSE(metrics_health_primary(vms, "d", why, sizeof(why)));
	CU_ASSERT_FALSE(metrics_health_primary(vms, "e", why, sizeof(why)));  /* colo, no protection */
	CU_ASSERT_FALSE(metrics_health_primary(vms, "f", why, sizeof(why)));
	CU_ASSERT_TRUE(metrics_health_primary(vms, "g", why, sizeof(why)));
	CU_ASSERT_FALSE(metrics_health_primary(vms, "zz", why, sizeof(why)));
	CU_ASSERT_STRING_EQUAL(why, "no VM named zz on this host");
	json_decref(vms);
}

static void test_health_replica(void)
{
	json_t *r = load("[{\"vm\": \"a\", \"state\": \"ready\"}, {\"vm\": \"b\", \"state\": \"receiving\"},"
			 " {\"vm\": \"c\", \"state\": \"active\"}]");
	char why[128];

	CU_ASSERT_TRUE(metrics_health_replica(r, "a", why, sizeof(why)));
	CU_ASSERT_FALSE(metrics_health_replica(r, "b", why, sizeof(why)));
	CU_ASSERT_FALSE(metrics_health_replica(r, "c", why, sizeof(why)));
	CU_ASSERT_FALSE(metrics_health_replica(r, "zz", why, sizeof(why)));
	CU_ASSERT_FALSE(metrics_health_replica(NULL, "a", why, sizeof(why)));
	json_decref(r);
}

/* ---- the endpoint on the loop ------------------------------------------- */

/* Sends req, then turns the loop until the server closes; returns the reply. */
static char *http_exchange(event_loop *loop, uint16_t port, const char *req)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	static char reply[65536];
	size_t got = 0;

	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	CU_ASSERT_FATAL(fd >= 0);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		CU_ASSERT_EQUAL_FATAL(errno, EINPROGRESS);
	}
	/* The accept happens in a loop turn: the client never blocks either. */
	size_t sent = 0;
	for (int turns = 0; turns < 400; turns++) {
		event_loop_run_once(loop, 10);
		if (sent < strlen(req)) {
			ssize_t n = send(fd, req + sent, strlen(req) - sent, MSG_NOSIGNAL);
			if (n > 0)
				sent += (size_t)n;
			continue;
		}
		ssize_t n = recv(fd, reply + got, sizeof(reply) - 1 - got, MSG_DONTWAIT);
		if (n == 0)
			break;
		if (n > 0)
			got += (size_t)n;
	}
	close(fd);
	reply[got] = 0;
	return reply;
}

static void test_endpoint_on_loop(void)
{
	char dir[] = "/tmp/rdb-metrics-XXXXXX", err[256];
	event_loop *loop = event_loop_create();

	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	struct vm_registry *vms = vm_registry_create(loop, dir, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(vms);
	struct http_endpoint *h = http_endpoint_create(loop, "127.0.0.1:0", vms, NULL,
						       err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(h);
	uint16_t port = http_endpoint_port(h);
	CU_ASSERT(port != 0);

	char *r = http_exchange(loop, port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	CU_ASSERT(!strncmp(r, "HTTP/1.1 200", 12));
	CU_ASSERT_PTR_NOT_NULL(strstr(r, "text/plain; version=0.0.4"));
	CU_ASSERT_PTR_NOT_NULL(strstr(r, "# TYPE remusdb_checkpoint_pause_seconds histogram\n"));
	r = http_exchange(loop, port, "GET /primary?vm=nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	CU_ASSERT(!strncmp(r, "HTTP/1.1 503", 12));
	CU_ASSERT_PTR_NOT_NULL(strstr(r, "no VM named nope on this host"));
	r = http_exchange(loop, port, "GET /replica/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	CU_ASSERT(!strncmp(r, "HTTP/1.1 503", 12));
	r = http_exchange(loop, port, "GET /primary HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	CU_ASSERT(!strncmp(r, "HTTP/1.1 400", 12));
	r = http_exchange(loop, port, "GET /elsewhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	CU_ASSERT(!strncmp(r, "HTTP/1.1 404", 12));

	http_endpoint_destroy(h);
	vm_registry_destroy(vms);
	event_loop_destroy(loop);
	rmdir(dir);
}

int register_metrics_tests(void)
{
	CU_pSuite s = CU_add_suite("metrics", NULL, NULL);

	if (!s ||
	    !CU_add_test(s, "pause histogram buckets are cumulative", test_histogram_cumulative) ||
	    !CU_add_test(s, "samples of primary, VM and backup", test_samples) ||
	    !CU_add_test(s, "pause histogram exposition", test_histogram_exposition) ||
	    !CU_add_test(s, "HELP/TYPE once, samples in their family, _total", test_format_rules) ||
	    !CU_add_test(s, "/primary verdicts", test_health_primary) ||
	    !CU_add_test(s, "/replica verdicts", test_health_replica) ||
	    !CU_add_test(s, "the endpoint answers on the event loop", test_endpoint_on_loop))
		return -1;
	return 0;
}

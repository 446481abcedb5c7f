/*
 * The etcd witness: the pure key/value/request/reply helpers, then the
 * client against a real etcd (/usr/bin/etcd, started here on free
 * loopback ports with a throwaway data dir), plus two stand-ins for
 * broken servers: a port that accepts connections but never answers,
 * and a tiny HTTP server that answers what a test tells it to (an etcd
 * error, or garbage).  Without /usr/bin/etcd the server tests fail and
 * say to run `make setup`.
 */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/event_loop.h"
#include "suites.h"
#include "test_ports.h"
#include "witness/witness.h"
#include "witness/witness_async.h"
#include "witness/witness_proto.h"

#ifndef ETCD_BINARY /* a test build may point elsewhere */
#define ETCD_BINARY "/usr/bin/etcd"
#endif
#define ETCD_START_MS 15000 /* first start fsyncs a fresh WAL; valgrind is slow */
#define WAIT_MS 10000

extern char **environ;

/* ---- pure helpers ----------------------------------------------------- */

static void test_key_and_names(void)
{
	char key[WITNESS_KEY_MAX], err[256];
	char long_name[WITNESS_VM_MAX + 2];

	CU_ASSERT_EQUAL(witness_key("pg-1", key, sizeof(key), err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(key, "/remusdb/vms/pg-1/owner");
	CU_ASSERT_EQUAL(witness_key("a/b", key, sizeof(key), err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "a/b"));
	CU_ASSERT_EQUAL(witness_key("", key, sizeof(key), err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "empty"));
	memset(long_name, 'v', sizeof(long_name) - 1);
	long_name[sizeof(long_name) - 1] = '\0';
	CU_ASSERT_EQUAL(witness_key(long_name, key, sizeof(key), err, sizeof(err)), -1);
	long_name[WITNESS_VM_MAX] = '\0';
	CU_ASSERT_EQUAL(witness_key(long_name, key, sizeof(key), err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(witness_key("pg", key, 10, err, sizeof(err)), -1);
	CU_ASSERT_EQUAL(witness_check_owner("host.example-1", err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(witness_check_owner("a\"b", err, sizeof(err)), -1);
	CU_ASSERT_EQUAL(witness_check_owner(NULL, err, sizeof(err)), -1);
}

static void test_value_encoding(void)
{
	char value[WITNESS_RAW_MAX + 1], err[256];
	struct witness_ownership o;

	int n = witness_encode_value("primary", 7, value, sizeof(value), err, sizeof(err));
	CU_ASSERT_STRING_EQUAL(value, "{\"owner\":\"primary\",\"generation\":7}");
	CU_ASSERT_EQUAL(n, (int)strlen(value));
	CU_ASSERT_EQUAL(witness_decode_value(value, (size_t)n, &o, err, sizeof(err)), 0);
	CU_ASSERT_TRUE(o.exists);
	CU_ASSERT_STRING_EQUAL(o.owner, "primary");
	CU_ASSERT_EQUAL(o.generation, 7);
	CU_ASSERT_STRING_EQUAL(o.raw, value);
	CU_ASSERT_EQUAL(witness_encode_value("bad owner", 1, value, sizeof(value), err,
					     sizeof(err)), -1);
	CU_ASSERT_EQUAL(witness_encode_value("p", 1, value, 8, err, sizeof(err)), -1);
	CU_ASSERT_EQUAL(witness_encode_value("p", (uint64_t)INT64_MAX + 1, value,
					     sizeof(value), err, sizeof(err)), -1);

	/* Written by someone else: other spacing and extra fields are fine. */
	const char *spaced = "{ \"generation\": 12, \"owner\": \"backup\", \"note\": 1 }";
	CU_ASSERT_EQUAL(witness_decode_value(spaced, strlen(spaced), &o, err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(o.owner, "backup");
	CU_ASSERT_EQUAL(o.generation, 12);
	CU_ASSERT_STRING_EQUAL(o.raw, spaced);

	const char *bad[] = {
		"", "not json", "[1,2]", "{\"owner\":\"p\"}", "{\"generation\":1}",
		"{\"owner\":\"p\",\"generation\":-1}", "{\"owner\":\"p\",\"generation\":\"1\"}",
		"{\"owner\":\"\",\"generation\":1}", "{\"owner\":1,\"generation\":1}",
		"{\"owner\":\"a\\u0000b\",\"generation\":1}",
		"{\"owner\":\"p\",\"owner\":\"q\",\"generation\":1}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		CU_ASSERT_EQUAL(witness_decode_value(bad[i], strlen(bad[i]), &o, err,
						     sizeof(err)), -1);
		CU_ASSERT_FALSE(o.exists);
		CU_ASSERT_NOT_EQUAL(err[0], '\0');
	}
	/* An embedded NUL and an oversized value. */
	CU_ASSERT_EQUAL(witness_decode_value("{\"o\0", 4, &o, err, sizeof(err)), -1);
	char big[WITNESS_RAW_MAX + 2];
	memset(big, ' ', sizeof(big));
	CU_ASSERT_EQUAL(witness_decode_value(big, sizeof(big), &o, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "bytes"));
}

static void test_base64(void)
{
	/* RFC 4648 section 10. */
	const char *plain[] = { "", "f", "fo", "foo", "foob", "fooba", "foobar" };
	const char *coded[] = { "", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy" };
	char out[16];

	for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++) {
		char *text = witness_base64_encode(plain[i], strlen(plain[i]));
		CU_ASSERT_PTR_NOT_NULL_FATAL(text);
		CU_ASSERT_STRING_EQUAL(text, coded[i]);
		free(text);
		long n = witness_base64_decode(coded[i], strlen(coded[i]), out, sizeof(out));
		CU_ASSERT_EQUAL(n, (long)strlen(plain[i]));
		CU_ASSERT_EQUAL(memcmp(out, plain[i], strlen(plain[i])), 0);
	}
	CU_ASSERT_EQUAL(witness_base64_decode("Zm9", 3, out, sizeof(out)), -1);
	CU_ASSERT_EQUAL(witness_base64_decode("Zm!v", 4, out, sizeof(out)), -1);
	CU_ASSERT_EQUAL(witness_base64_decode("Zm9 ", 4, out, sizeof(out)), -1);
	CU_ASSERT_EQUAL(witness_base64_decode("Zm9vYmFy", 8, out, 5), -1);
}

/* Decodes a base64 JSON field of obj into buf (NUL-terminated). */
static const char *field64(json_t *obj, const char *name, char *buf, size_t size)
{
	json_t *v = json_object_get(obj, name);
	long n = json_is_string(v) ? witness_base64_decode(json_string_value(v),
							    json_string_length(v), buf,
							    size - 1) : -1;
	if (n < 0)
		return "";
	buf[n] = '\0';
	return buf;
}

static void test_requests(void)
{
	char err[256], buf[256];
	const char *key = "/remusdb/vms/pg/owner";
	const char *old = "{\"owner\":\"primary\",\"generation\":1}";
	const char *new = "{\"owner\":\"backup\",\"generation\":2}";

	char *body = witness_range_request(key, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(body);
	json_t *req = json_loads(body, 0, NULL);
	CU_ASSERT_STRING_EQUAL(field64(req, "key", buf, sizeof(buf)), key);
	json_decref(req);
	free(body);

	body = witness_cas_txn_request(key, old, new, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(body);
	req = json_loads(body, 0, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(req);
	json_t *cmp = json_array_get(json_object_get(req, "compare"), 0);
	CU_ASSERT_EQUAL(json_array_size(json_object_get(req, "compare")), 1);
	CU_ASSERT_STRING_EQUAL(field64(cmp, "key", buf, sizeof(buf)), key);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(cmp, "target")), "VALUE");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(cmp, "result")), "EQUAL");
	CU_ASSERT_STRING_EQUAL(field64(cmp, "value", buf, sizeof(buf)), old);
	json_t *put = json_object_get(json_array_get(json_object_get(req, "success"), 0),
				      "request_put");
	CU_ASSERT_STRING_EQUAL(field64(put, "key", buf, sizeof(buf)), key);
	CU_ASSERT_STRING_EQUAL(field64(put, "value", buf, sizeof(buf)), new);
	json_t *range = json_object_get(json_array_get(json_object_get(req, "failure"), 0),
					"request_range");
	CU_ASSERT_STRING_EQUAL(field64(range, "key", buf, sizeof(buf)), key);
	json_decref(req);
	free(body);

	/* Create: the compare is "never created" (create_revision 0, a string). */
	body = witness_create_txn_request(key, new, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(body);
	req = json_loads(body, 0, NULL);
	cmp = json_array_get(json_object_get(req, "compare"), 0);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(cmp, "target")), "CREATE");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(cmp, "create_revision")), "0");
	CU_ASSERT_PTR_NULL(json_object_get(cmp, "value"));
	json_decref(req);
	free(body);
}

/* Replies as etcd 3.4.23's gateway sent them. */
#define HEADER "\"header\":{\"cluster_id\":\"1\",\"member_id\":\"2\",\"revision\":\"2\",\"raft_term\":\"2\"}"
#define KV_P1 "{\"key\":\"L3JlbXVzZGIvdm1zL2Evb3duZXI=\",\"create_revision\":\"2\"," \
	"\"mod_revision\":\"2\",\"version\":\"1\"," \
	"\"value\":\"eyJvd25lciI6InAiLCJnZW5lcmF0aW9uIjoxfQ==\"}"

static void test_parse_replies(void)
{
	struct witness_ownership o;
	char err[256];
	bool ok;

	const char *range_absent = "{" HEADER "}";
	CU_ASSERT_EQUAL(witness_parse_range_reply(range_absent, strlen(range_absent), &o,
						  err, sizeof(err)), 0);
	CU_ASSERT_FALSE(o.exists);
	const char *range = "{" HEADER ",\"kvs\":[" KV_P1 "],\"count\":\"1\"}";
	CU_ASSERT_EQUAL(witness_parse_range_reply(range, strlen(range), &o, err,
						  sizeof(err)), 0);
	CU_ASSERT_TRUE(o.exists);
	CU_ASSERT_STRING_EQUAL(o.owner, "p");
	CU_ASSERT_EQUAL(o.generation, 1);
	CU_ASSERT_STRING_EQUAL(o.raw, "{\"owner\":\"p\",\"generation\":1}");

	const char *won = "{" HEADER ",\"succeeded\":true,\"responses\":[{\"response_put\":"
			  "{\"header\":{\"revision\":\"2\"}}}]}";
	CU_ASSERT_EQUAL(witness_parse_txn_reply(won, strlen(won), &ok, &o, err, sizeof(err)), 0);
	CU_ASSERT_TRUE(ok);
	/* jsonpb leaves out "succeeded": false. */
	const char *lost = "{" HEADER ",\"responses\":[{\"response_range\":{\"header\":"
			   "{\"revision\":\"2\"},\"kvs\":[" KV_P1 "],\"count\":\"1\"}}]}";
	CU_ASSERT_EQUAL(witness_parse_txn_reply(lost, strlen(lost), &ok, &o, err, sizeof(err)), 0);
	CU_ASSERT_FALSE(ok);
	CU_ASSERT_TRUE(o.exists);
	CU_ASSERT_STRING_EQUAL(o.owner, "p");
	const char *lost_deleted = "{" HEADER ",\"responses\":[{\"response_range\":"
				   "{\"header\":{\"revision\":\"3\"}}}]}";
	CU_ASSERT_EQUAL(witness_parse_txn_reply(lost_deleted, strlen(lost_deleted), &ok, &o,
						err, sizeof(err)), 0);
	CU_ASSERT_FALSE(ok);
	CU_ASSERT_FALSE(o.exists);

	const char *bad[] = {
		"", "garbage", "[]", "{\"error\":\"etcdserver: no leader\",\"code\":14}",
		"{\"succeeded\":true}",                          /* no header */
		"{" HEADER ",\"succeeded\":\"yes\"}",            /* not a boolean */
		"{" HEADER "}",                                  /* failed, no range */
		"{" HEADER ",\"responses\":[{\"response_range\":{\"kvs\":[{\"value\":\"!!\"}]}}]}",
		"{" HEADER ",\"responses\":[{\"response_range\":{\"kvs\":[{\"value\":\"e30=\"}]}}]}",
		"{" HEADER ",\"responses\":[{\"response_range\":{\"kvs\":[{}]}}]}",
		"{" HEADER ",\"responses\":[{\"response_range\":{\"kvs\":7}}]}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		CU_ASSERT_EQUAL(witness_parse_txn_reply(bad[i], strlen(bad[i]), &ok, &o, err,
							sizeof(err)), -1);
		CU_ASSERT_FALSE(ok);
		CU_ASSERT_NOT_EQUAL(err[0], '\0');
	}
	const char *no_leader = "{\"error\":\"etcdserver: no leader\",\"code\":14}";
	CU_ASSERT_EQUAL(witness_parse_range_reply(no_leader, strlen(no_leader), &o, err,
						  sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "no leader"));
	/* Not NUL-terminated: the parser must stay within len. */
	char unterminated[4] = { '{', '}', 'x', 'x' };
	CU_ASSERT_EQUAL(witness_parse_range_reply(unterminated, 2, &o, err, sizeof(err)), 0);
}

static void test_error_message(void)
{
	char msg[64];
	const char *etcd = "{\"error\":\"etcdserver: no leader\",\"message\":"
			   "\"etcdserver: no leader\",\"code\":14}";

	witness_error_reply_message(etcd, strlen(etcd), msg, sizeof(msg));
	CU_ASSERT_STRING_EQUAL(msg, "etcdserver: no leader");
	witness_error_reply_message("<html>\nBad Gateway", 18, msg, sizeof(msg));
	CU_ASSERT_STRING_EQUAL(msg, "<html> Bad Gateway");
	witness_error_reply_message("", 0, msg, sizeof(msg));
	CU_ASSERT_STRING_EQUAL(msg, "");
}

static void test_create_checks_endpoints(void)
{
	struct witness_config cfg = { .timeout_ms = 0 };
	char err[256];
	const char *bad[] = {
		"", " , ", "10.77.0.5:2379", "ftp://10.77.0.5", "http://",
		"http://a,http://b,http://c,http://d,http://e,http://f,http://g,http://h,http://i",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(cfg.endpoints, sizeof(cfg.endpoints), "%s", bad[i]);
		err[0] = '\0';
		CU_ASSERT_PTR_NULL(witness_create(&cfg, err, sizeof(err)));
		CU_ASSERT_NOT_EQUAL(err[0], '\0');
		/* remusdbd's startup check refuses exactly what create refuses. */
		err[0] = '\0';
		CU_ASSERT_EQUAL(witness_check_endpoints(bad[i], err, sizeof(err)), -1);
		CU_ASSERT_NOT_EQUAL(err[0], '\0');
	}
	CU_ASSERT_EQUAL(witness_check_endpoints("http://etcd1.example:2379,https://h:1", err,
						sizeof(err)), 0);
	CU_ASSERT_EQUAL(witness_check_endpoints("http://etcd1:2379,etcd2:2379", err,
						sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "'etcd2:2379'"));
	snprintf(cfg.endpoints, sizeof(cfg.endpoints), "http://10.77.0.5:2379/, https://h:1");
	struct witness *w = witness_create(&cfg, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL(w);
	witness_destroy(w);
	CU_ASSERT_STRING_EQUAL(witness_result_name(WITNESS_OK), "ok");
	CU_ASSERT_STRING_EQUAL(witness_result_name(WITNESS_LOST), "lost");
	CU_ASSERT_STRING_EQUAL(witness_result_name(WITNESS_UNREACHABLE), "unreachable");
	CU_ASSERT_STRING_EQUAL(witness_result_name(WITNESS_ERROR), "error");
}

/* ---- servers: a real etcd, a silent port, a scripted HTTP server ------ */

static struct {
	pid_t pid;
	char dir[64];
	int client_port;
	char endpoint[64];
	char problem[768]; /* why etcd is not available, "" when it is */
} etcd;

/* A listening socket; *port gets its number. */
static int listen_loopback(int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 16) < 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
		close(fd);
		return -1;
	}
	*port = ntohs(a.sin_port);
	return fd;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

static void config_for(struct witness_config *cfg, const char *endpoints, long timeout_ms)
{
	memset(cfg, 0, sizeof(*cfg));
	snprintf(cfg->endpoints, sizeof(cfg->endpoints), "%s", endpoints);
	cfg->timeout_ms = timeout_ms;
}

static void read_log_tail(char *out, size_t size)
{
	char path[128], buf[256];
	size_t n = 0;

	snprintf(path, sizeof(path), "%s/etcd.log", etcd.dir);
	FILE *f = fopen(path, "r");
	if (f) {
		fseek(f, 0, SEEK_END);
		long end = ftell(f);
		fseek(f, end > (long)sizeof(buf) - 1 ? end - (long)sizeof(buf) + 1 : 0, SEEK_SET);
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
	}
	buf[n] = '\0';
	snprintf(out, size, "%s", buf);
}

static int start_etcd(void)
{
	char client_url[64], peer_url[64], cluster[80], data[96], log_path[96];
	posix_spawn_file_actions_t actions;

	memset(&etcd, 0, sizeof(etcd));
	if (access(ETCD_BINARY, X_OK) != 0) {
		snprintf(etcd.problem, sizeof(etcd.problem), "%s is missing (%s): run "
			 "`make setup` to install etcd-server", ETCD_BINARY, strerror(errno));
		return 0;
	}
	strcpy(etcd.dir, "/tmp/remusdb-witness-test-XXXXXX");
	if (!mkdtemp(etcd.dir)) {
		snprintf(etcd.problem, sizeof(etcd.problem), "mkdtemp: %s", strerror(errno));
		etcd.dir[0] = '\0';
		return 0;
	}
	etcd.client_port = test_free_port();
	int peer_port = test_free_port();
	snprintf(client_url, sizeof(client_url), "http://127.0.0.1:%d", etcd.client_port);
	snprintf(peer_url, sizeof(peer_url), "http://127.0.0.1:%d", peer_port);
	snprintf(cluster, sizeof(cluster), "t=%s", peer_url);
	snprintf(data, sizeof(data), "%s/data", etcd.dir);
	snprintf(log_path, sizeof(log_path), "%s/etcd.log", etcd.dir);
	snprintf(etcd.endpoint, sizeof(etcd.endpoint), "%s", client_url);
	char *argv[] = {
		ETCD_BINARY, "--name", "t", "--data-dir", data,
		"--listen-client-urls", client_url, "--advertise-client-urls", client_url,
		"--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
		"--initial-cluster", cluster, "--initial-cluster-state", "new", NULL,
	};
	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_addopen(&actions, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	posix_spawn_file_actions_adddup2(&actions, 1, 2);
	posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
	int rc = posix_spawn(&etcd.pid, ETCD_BINARY, &actions, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&actions);
	if (rc != 0) {
		snprintf(etcd.problem, sizeof(etcd.problem), "cannot start %s: %s",
			 ETCD_BINARY, strerror(rc));
		etcd.pid = 0;
		return 0;
	}

	/* Ready when a read answers (a linearizable read needs a leader). */
	struct witness_config cfg;
	char err[512];
	config_for(&cfg, etcd.endpoint, 300);
	struct witness *w = witness_create(&cfg, err, sizeof(err));
	int64_t give_up = monotonic_ms() + ETCD_START_MS;
	enum witness_result r = WITNESS_UNREACHABLE;
	while (w && monotonic_ms() < give_up) {
		struct witness_ownership o;
		int status;

		r = witness_get(w, "ready-check", &o, err, sizeof(err));
		if (r == WITNESS_OK)
			break;
		if (waitpid(etcd.pid, &status, WNOHANG) == etcd.pid) {
			char tail[256];

			etcd.pid = 0;
			read_log_tail(tail, sizeof(tail));
			snprintf(etcd.problem, sizeof(etcd.problem), "etcd exited at "
				 "start: %s", tail);
			break;
		}
		usleep(50 * 1000);
	}
	witness_destroy(w);
	if (r != WITNESS_OK && !etcd.problem[0])
		snprintf(etcd.problem, sizeof(etcd.problem), "etcd did not answer within "
			 "%d ms: %s", ETCD_START_MS, err);
	return 0;
}

static int stop_etcd(void)
{
	if (etcd.pid > 0) {
		kill(etcd.pid, SIGKILL);
		waitpid(etcd.pid, NULL, 0);
		etcd.pid = 0;
	}
	if (etcd.dir[0])
		nftw(etcd.dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
	return 0;
}

/* Every server test starts here: no etcd is a failure, never a skip. */
#define REQUIRE_ETCD()                                                         \
	do {                                                                   \
		if (etcd.problem[0]) {                                         \
			fprintf(stderr, "\n  witness: %s\n", etcd.problem);  \
			CU_FAIL_FATAL("no etcd to test against: run `make setup` " \
				      "(see the message above)");              \
		}                                                              \
	} while (0)

/*
 * The scripted server: answers every request with `response`, closing
 * each connection, until the test stops it.
 */
struct scripted_server {
	int fd;
	int port;
	const char *response;
	int requests;
	pthread_t thread;
};

static void *serve(void *data)
{
	struct scripted_server *s = data;
	char buf[8192];

	for (;;) {
		int c = accept(s->fd, NULL, NULL);
		if (c < 0)
			return NULL; /* shut down */
		size_t got = 0;
		/* Read the headers and the body Content-Length announces. */
		for (;;) {
			ssize_t n = read(c, buf + got, sizeof(buf) - 1 - got);
			if (n <= 0)
				break;
			got += (size_t)n;
			buf[got] = '\0';
			char *end = strstr(buf, "\r\n\r\n");
			char *cl = strcasestr(buf, "Content-Length:");
			if (end && (!cl || got >= (size_t)(end + 4 - buf) + (size_t)atoi(cl + 15)))
				break;
		}
		s->requests++;
		(void)!write(c, s->response, strlen(s->response));
		close(c);
	}
}

static int scripted_start(struct scripted_server *s, const char *response)
{
	s->response = response;
	s->requests = 0;
	s->fd = listen_loopback(&s->port);
	if (s->fd < 0)
		return -1;
	return pthread_create(&s->thread, NULL, serve, s);
}

static void scripted_stop(struct scripted_server *s)
{
	shutdown(s->fd, SHUT_RDWR); /* wakes accept() */
	pthread_join(s->thread, NULL);
	close(s->fd);
}

static struct witness *client(const char *endpoints, long timeout_ms)
{
	struct witness_config cfg;
	char err[256];

	config_for(&cfg, endpoints, timeout_ms);
	struct witness *w = witness_create(&cfg, err, sizeof(err));
	if (!w)
		fprintf(stderr, "witness_create(%s): %s\n", endpoints, err);
	return w;
}

/* ---- the client against etcd ------------------------------------------ */

static void test_claim_get_cas(void)
{
	REQUIRE_ETCD();
	struct witness *w = client(etcd.endpoint, 2000);
	struct witness_ownership o, first, second;
	char err[512];

	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	CU_ASSERT_EQUAL(witness_get(w, "vm-a", &o, err, sizeof(err)), WITNESS_OK);
	CU_ASSERT_FALSE(o.exists);

	CU_ASSERT_EQUAL(witness_claim(w, "vm-a", "primary", &first, err, sizeof(err)), WITNESS_OK);
	CU_ASSERT_TRUE(first.exists);
	CU_ASSERT_STRING_EQUAL(first.owner, "primary");
	CU_ASSERT_EQUAL(first.generation, 1);
	CU_ASSERT_STRING_EQUAL(first.raw, "{\"owner\":\"primary\",\"generation\":1}");
	/* Claiming again is harmless; another host is told who owns it. */
	CU_ASSERT_EQUAL(witness_claim(w, "vm-a", "primary", &o, err, sizeof(err)), WITNESS_OK);
	CU_ASSERT_STRING_EQUAL(o.raw, first.raw);
	CU_ASSERT_EQUAL(witness_claim(w, "vm-a", "backup", &o, err, sizeof(err)), WITNESS_LOST);
	CU_ASSERT_STRING_EQUAL(o.owner, "primary");
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "primary"));

	CU_ASSERT_EQUAL(witness_get(w, "vm-a", &o, err, sizeof(err)), WITNESS_OK);
	CU_ASSERT_STRING_EQUAL(o.raw, first.raw);

	CU_ASSERT_EQUAL(witness_cas(w, "vm-a", &first, "backup", &second, err, sizeof(err)),
			WITNESS_OK);
	CU_ASSERT_STRING_EQUAL(second.owner, "backup");
	CU_ASSERT_EQUAL(second.generation, 2);
	CU_ASSERT_EQUAL(witness_get(w, "vm-a", &o, err, sizeof(err)), WITNESS_OK);
	CU_ASSERT_STRING_EQUAL(o.raw, second.raw);

	/* The primary, still at generation 1, loses and learns the truth. */
	CU_ASSERT_EQUAL(witness_cas(w, "vm-a", &first, "primary", &o, err, sizeof(err)),
			WITNESS_LOST);
	CU_ASSERT_STRING_EQUAL(o.owner, "backup");
	CU_ASSERT_EQUAL(o.generation, 2);
	/* The backup retrying the same CAS (reply lost) is told it won. */
	CU_ASSERT_EQUAL(witness_cas(w, "vm-a", &first, "backup", &o, err, sizeof(err)),
			WITNESS_OK);
	CU_ASSERT_STRING_EQUAL(o.raw, second.raw);
	/* From the current value, the primary can move it back. */
	CU_ASSERT_EQUAL(witness_cas(w, "vm-a", &second, "primary", &o, err, sizeof(err)),
			WITNESS_OK);
	CU_ASSERT_EQUAL(o.generation, 3);

	/* Bad arguments never reach etcd. */
	CU_ASSERT_EQUAL(witness_claim(w, "../x", "primary", &o, err, sizeof(err)), WITNESS_ERROR);
	CU_ASSERT_EQUAL(witness_cas(w, "vm-a", &o, "two words", &o, err, sizeof(err)),
			WITNESS_ERROR);
	struct witness_ownership no_raw = { .exists = true, .generation = 3 };
	CU_ASSERT_EQUAL(witness_cas(w, "vm-a", &no_raw, "primary", &o, err, sizeof(err)),
			WITNESS_ERROR);
	witness_destroy(w);
}

static void test_cas_from_absent_key(void)
{
	REQUIRE_ETCD();
	struct witness *w = client(etcd.endpoint, 2000);
	struct witness_ownership absent = { .exists = false }, o;
	char err[512];

	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	CU_ASSERT_EQUAL(witness_cas(w, "vm-fresh", &absent, "backup", &o, err, sizeof(err)),
			WITNESS_OK);
	CU_ASSERT_EQUAL(o.generation, 1);
	CU_ASSERT_STRING_EQUAL(o.owner, "backup");
	CU_ASSERT_EQUAL(witness_cas(w, "vm-fresh", &absent, "primary", &o, err, sizeof(err)),
			WITNESS_LOST);
	CU_ASSERT_STRING_EQUAL(o.owner, "backup");
	witness_destroy(w);
}

struct racer {
	const char *vm;
	const char *me;
	const struct witness_ownership *expected;
	pthread_barrier_t *start;
	enum witness_result result;
	struct witness_ownership now;
	char err[512];
};

static void *race(void *data)
{
	struct racer *r = data;
	struct witness *w = client(etcd.endpoint, 3000);

	r->result = WITNESS_ERROR;
	pthread_barrier_wait(r->start);
	if (w)
		r->result = witness_cas(w, r->vm, r->expected, r->me, &r->now, r->err,
					sizeof(r->err));
	witness_destroy(w);
	return NULL;
}

/* Both sides lose each other and CAS from the same value at once. */
static void test_competing_cas(void)
{
	REQUIRE_ETCD();
	struct witness *w = client(etcd.endpoint, 2000);
	char err[512], vm[32];

	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	for (int round = 0; round < 5; round++) {
		struct witness_ownership known;
		pthread_barrier_t start;
		pthread_t threads[2];

		snprintf(vm, sizeof(vm), "vm-race-%d", round);
		CU_ASSERT_EQUAL_FATAL(witness_claim(w, vm, "primary", &known, err, sizeof(err)),
				      WITNESS_OK);
		struct racer racers[2] = {
			{ .vm = vm, .me = "primary", .expected = &known, .start = &start },
			{ .vm = vm, .me = "backup", .expected = &known, .start = &start },
		};
		pthread_barrier_init(&start, NULL, 2);
		for (int i = 0; i < 2; i++)
			pthread_create(&threads[i], NULL, race, &racers[i]);
		for (int i = 0; i < 2; i++)
			pthread_join(threads[i], NULL);
		pthread_barrier_destroy(&start);

		int winners = 0, losers = 0;
		const char *winner = NULL;
		for (int i = 0; i < 2; i++) {
			if (racers[i].result == WITNESS_OK) {
				winners++;
				winner = racers[i].me;
			} else if (racers[i].result == WITNESS_LOST) {
				losers++;
			}
		}
		CU_ASSERT_EQUAL(winners, 1);
		CU_ASSERT_EQUAL(losers, 1);
		if (winners != 1 || losers != 1)
			continue;
		for (int i = 0; i < 2; i++) {
			/* Both now know the same value: the winner's, at generation 2. */
			CU_ASSERT_STRING_EQUAL(racers[i].now.owner, winner);
			CU_ASSERT_EQUAL(racers[i].now.generation, 2);
		}
		struct witness_ownership stored;
		CU_ASSERT_EQUAL(witness_get(w, vm, &stored, err, sizeof(err)), WITNESS_OK);
		CU_ASSERT_STRING_EQUAL(stored.owner, winner);
	}
	witness_destroy(w);
}

static void test_closed_port_is_unreachable(void)
{
	char endpoint[64], err[512];
	struct witness_ownership o;

	snprintf(endpoint, sizeof(endpoint), "http://127.0.0.1:%d", test_free_port());
	struct witness *w = client(endpoint, 500);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	int64_t t0 = monotonic_ms();
	CU_ASSERT_EQUAL(witness_claim(w, "vm-x", "primary", &o, err, sizeof(err)),
			WITNESS_UNREACHABLE);
	CU_ASSERT(monotonic_ms() - t0 < 500 + 300);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, endpoint));
	CU_ASSERT_FALSE(o.exists);
	witness_destroy(w);
}

/* A port that accepts but never answers: the budget is the limit. */
static void test_silent_endpoint_times_out(void)
{
	char endpoint[64], err[512];
	struct witness_ownership o;
	int port;
	int fd = listen_loopback(&port);

	CU_ASSERT_FATAL(fd >= 0);
	snprintf(endpoint, sizeof(endpoint), "http://127.0.0.1:%d", port);
	struct witness *w = client(endpoint, 300);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	int64_t t0 = monotonic_ms();
	CU_ASSERT_EQUAL(witness_get(w, "vm-x", &o, err, sizeof(err)), WITNESS_UNREACHABLE);
	int64_t took = monotonic_ms() - t0;
	CU_ASSERT(took >= 250);
	CU_ASSERT(took < 300 + 500);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "300 ms"));
	witness_destroy(w);
	close(fd);
}

static void test_dead_first_endpoint(void)
{
	REQUIRE_ETCD();
	char endpoints[160], err[512];
	struct witness_ownership o;

	snprintf(endpoints, sizeof(endpoints), "http://127.0.0.1:%d,%s", test_free_port(),
		 etcd.endpoint);
	struct witness *w = client(endpoints, 1000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	CU_ASSERT_EQUAL(witness_claim(w, "vm-list", "primary", &o, err, sizeof(err)),
			WITNESS_OK);
	CU_ASSERT_STRING_EQUAL(o.owner, "primary");
	witness_destroy(w);
}

/* A hung first member gets only its share, and the second still answers. */
static void test_silent_first_endpoint(void)
{
	REQUIRE_ETCD();
	char endpoints[160], err[512];
	struct witness_ownership o;
	int port;
	int fd = listen_loopback(&port);

	CU_ASSERT_FATAL(fd >= 0);
	snprintf(endpoints, sizeof(endpoints), "http://127.0.0.1:%d,%s", port, etcd.endpoint);
	struct witness *w = client(endpoints, 1000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	int64_t t0 = monotonic_ms();
	CU_ASSERT_EQUAL(witness_claim(w, "vm-list", "primary", &o, err, sizeof(err)),
			WITNESS_OK);
	int64_t took = monotonic_ms() - t0;
	CU_ASSERT(took >= 450 && took < 1000);
	witness_destroy(w);
	close(fd);
}

/* An HTTP/1.1 response with the right Content-Length, in a static buffer. */
static const char *http_response(const char *status, const char *body)
{
	static char response[2][512];
	static int next;
	char *out = response[next++ % 2];

	snprintf(out, sizeof(response[0]), "HTTP/1.1 %s\r\nContent-Type: application/json"
		 "\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s", status,
		 strlen(body), body);
	return out;
}

static void test_error_answer(void)
{
	REQUIRE_ETCD();
	struct scripted_server s;
	char endpoints[160], err[512];
	struct witness_ownership o;

	CU_ASSERT_EQUAL_FATAL(scripted_start(&s, http_response("503 Service Unavailable",
				"{\"error\":\"etcdserver: no leader\",\"message\":"
				"\"etcdserver: no leader\",\"code\":14}")), 0);
	snprintf(endpoints, sizeof(endpoints), "http://127.0.0.1:%d", s.port);
	struct witness *w = client(endpoints, 1000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	CU_ASSERT_EQUAL(witness_claim(w, "vm-e", "primary", &o, err, sizeof(err)),
			WITNESS_UNREACHABLE);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "HTTP 503: etcdserver: no leader"));
	witness_destroy(w);

	/* A member without a leader is skipped for one that has one. */
	snprintf(endpoints, sizeof(endpoints), "http://127.0.0.1:%d,%s", s.port,
		 etcd.endpoint);
	w = client(endpoints, 1000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	CU_ASSERT_EQUAL(witness_claim(w, "vm-e", "primary", &o, err, sizeof(err)), WITNESS_OK);
	witness_destroy(w);
	scripted_stop(&s);
	CU_ASSERT_EQUAL(s.requests, 2);
}

static void test_garbage_answer(void)
{
	struct scripted_server s;
	char endpoints[64], err[512];
	struct witness_ownership o;

	CU_ASSERT_EQUAL_FATAL(scripted_start(&s, http_response("200 OK", "not json!")), 0);
	snprintf(endpoints, sizeof(endpoints), "http://127.0.0.1:%d", s.port);
	struct witness *w = client(endpoints, 1000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	CU_ASSERT_EQUAL(witness_get(w, "vm-g", &o, err, sizeof(err)), WITNESS_ERROR);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "not JSON"));
	CU_ASSERT_EQUAL(witness_cas(w, "vm-g", &o, "primary", &o, err, sizeof(err)),
			WITNESS_ERROR);
	witness_destroy(w);
	scripted_stop(&s);
}

/* ---- the async wrapper on the event loop ------------------------------ */

struct outcome {
	int calls;
	enum witness_result result;
	struct witness_ownership now;
	char err[512];
	struct witness_async **destroy; /* destroy this handle in the callback */
};

static void on_outcome(void *opaque, enum witness_result r,
		       const struct witness_ownership *now, const char *err)
{
	struct outcome *o = opaque;

	o->calls++;
	o->result = r;
	o->now = *now;
	snprintf(o->err, sizeof(o->err), "%s", err ? err : "");
	if (o->destroy) {
		witness_async_destroy(*o->destroy);
		*o->destroy = NULL;
	}
}

static void run_until_called(event_loop *loop, const struct outcome *o)
{
	int64_t give_up = monotonic_ms() + WAIT_MS;

	while (o->calls == 0 && monotonic_ms() < give_up)
		event_loop_run_once(loop, 50);
}

static struct witness_async *async_client(event_loop *loop, const char *endpoints,
					  long timeout_ms)
{
	struct witness_config cfg;
	char err[256];

	config_for(&cfg, endpoints, timeout_ms);
	struct witness_async *wa = witness_async_create(loop, &cfg, err, sizeof(err));
	if (!wa)
		fprintf(stderr, "witness_async_create(%s): %s\n", endpoints, err);
	return wa;
}

static void test_async_claim_then_cas(void)
{
	REQUIRE_ETCD();
	event_loop *loop = event_loop_create();
	struct outcome claimed = { 0 }, moved = { 0 }, refused = { 0 };

	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	struct witness_async *wa = async_client(loop, etcd.endpoint, 2000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(wa);
	CU_ASSERT_FALSE(witness_async_busy(wa));
	CU_ASSERT_EQUAL(witness_async_claim(wa, "vm-async", "primary", on_outcome, &claimed), 0);
	CU_ASSERT_TRUE(witness_async_busy(wa));
	/* One at a time. */
	CU_ASSERT_EQUAL(witness_async_claim(wa, "vm-async", "primary", on_outcome, &refused), -1);
	CU_ASSERT_EQUAL(claimed.calls, 0); /* never from inside the call */
	run_until_called(loop, &claimed);
	CU_ASSERT_EQUAL(claimed.calls, 1);
	CU_ASSERT_EQUAL(claimed.result, WITNESS_OK);
	CU_ASSERT_STRING_EQUAL(claimed.now.owner, "primary");
	CU_ASSERT_FALSE(witness_async_busy(wa));

	CU_ASSERT_EQUAL(witness_async_cas(wa, "vm-async", &claimed.now, "backup", on_outcome,
					  &moved), 0);
	run_until_called(loop, &moved);
	CU_ASSERT_EQUAL(moved.result, WITNESS_OK);
	CU_ASSERT_STRING_EQUAL(moved.now.owner, "backup");
	CU_ASSERT_EQUAL(moved.now.generation, 2);

	/* The stale CAS loses and reports the winner; this callback frees the handle. */
	struct outcome stale = { .destroy = &wa };
	CU_ASSERT_EQUAL(witness_async_cas(wa, "vm-async", &claimed.now, "primary", on_outcome,
					  &stale), 0);
	run_until_called(loop, &stale);
	CU_ASSERT_EQUAL(stale.result, WITNESS_LOST);
	CU_ASSERT_STRING_EQUAL(stale.now.owner, "backup");
	CU_ASSERT_PTR_NULL(wa);
	/* Nothing is left for the loop to call. */
	event_loop_run_once(loop, 20);
	CU_ASSERT_EQUAL(stale.calls, 1);
	CU_ASSERT_EQUAL(refused.calls, 0);
	witness_async_destroy(wa);
	event_loop_destroy(loop);
}

static void test_async_unreachable_and_bad_arguments(void)
{
	event_loop *loop = event_loop_create();
	struct outcome down = { 0 }, bad = { 0 };
	char endpoint[64];

	snprintf(endpoint, sizeof(endpoint), "http://127.0.0.1:%d", test_free_port());
	struct witness_async *wa = async_client(loop, endpoint, 500);
	CU_ASSERT_PTR_NOT_NULL_FATAL(wa);
	CU_ASSERT_EQUAL(witness_async_get(wa, "vm-x", on_outcome, &down), 0);
	run_until_called(loop, &down);
	CU_ASSERT_EQUAL(down.result, WITNESS_UNREACHABLE);
	CU_ASSERT_PTR_NOT_NULL(strstr(down.err, endpoint));

	/* Refused up front, but still answered through the loop. */
	CU_ASSERT_EQUAL(witness_async_claim(wa, "no/slash", "primary", on_outcome, &bad), 0);
	CU_ASSERT_EQUAL(bad.calls, 0);
	run_until_called(loop, &bad);
	CU_ASSERT_EQUAL(bad.result, WITNESS_ERROR);
	CU_ASSERT_PTR_NOT_NULL(strstr(bad.err, "no/slash"));
	CU_ASSERT_FALSE(witness_async_busy(wa));

	struct witness_config cfg;
	char err[256];
	config_for(&cfg, "not-a-url", 100);
	CU_ASSERT_PTR_NULL(witness_async_create(loop, &cfg, err, sizeof(err)));
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "not-a-url"));
	witness_async_destroy(wa);
	event_loop_destroy(loop);
}

/* Destroying a handle with a worker stuck on a silent etcd is prompt. */
static void test_async_destroy_in_flight(void)
{
	event_loop *loop = event_loop_create();
	struct outcome never = { 0 };
	char endpoint[64];
	int port;
	int fd = listen_loopback(&port);

	CU_ASSERT_FATAL(fd >= 0);
	snprintf(endpoint, sizeof(endpoint), "http://127.0.0.1:%d", port);
	struct witness_async *wa = async_client(loop, endpoint, 5000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(wa);
	CU_ASSERT_EQUAL(witness_async_claim(wa, "vm-x", "primary", on_outcome, &never), 0);
	event_loop_run_once(loop, 100); /* the worker is now waiting on the socket */
	int64_t t0 = monotonic_ms();
	witness_async_destroy(wa);
	CU_ASSERT(monotonic_ms() - t0 < 1000);
	event_loop_run_once(loop, 20);
	CU_ASSERT_EQUAL(never.calls, 0);
	event_loop_destroy(loop);
	close(fd);
}

int register_witness_tests(void)
{
	CU_pSuite pure = CU_add_suite("witness_proto", NULL, NULL);
	CU_pSuite live = CU_add_suite("witness_etcd", start_etcd, stop_etcd);

	if (!pure || !live)
		return -1;
	if (!CU_add_test(pure, "key and names", test_key_and_names) ||
	    !CU_add_test(pure, "value encoding", test_value_encoding) ||
	    !CU_add_test(pure, "base64", test_base64) ||
	    !CU_add_test(pure, "request bodies", test_requests) ||
	    !CU_add_test(pure, "reply parsing", test_parse_replies) ||
	    !CU_add_test(pure, "error reply message", test_error_message) ||
	    !CU_add_test(pure, "endpoint list checks", test_create_checks_endpoints) ||
	    !CU_add_test(live, "claim, get, cas", test_claim_get_cas) ||
	    !CU_add_test(live, "cas from an absent key", test_cas_from_absent_key) ||
	    !CU_add_test(live, "competing cas: one wins", test_competing_cas) ||
	    !CU_add_test(live, "closed port is unreachable", test_closed_port_is_unreachable) ||
	    !CU_add_test(live, "silent endpoint times out", test_silent_endpoint_times_out) ||
	    !CU_add_test(live, "dead first endpoint", test_dead_first_endpoint) ||
	    !CU_add_test(live, "silent first endpoint", test_silent_first_endpoint) ||
	    !CU_add_test(live, "etcd error answer", test_error_answer) ||
	    !CU_add_test(live, "garbage answer", test_garbage_answer) ||
	    !CU_add_test(live, "async claim then cas", test_async_claim_then_cas) ||
	    !CU_add_test(live, "async unreachable, bad arguments",
			 test_async_unreachable_and_bad_arguments) ||
	    !CU_add_test(live, "async destroy in flight", test_async_destroy_in_flight))
		return -1;
	return 0;
}

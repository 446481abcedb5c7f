/*
 * The replication handshake, both roles against each other over a
 * socketpair: the right key authenticates both ways; a wrong key, a
 * wrong role or a wrong version is refused with the right error code.
 */
#include <CUnit/CUnit.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/buffer.h"
#include "wire/repl_handshake.h"
#include "suites.h"

static const uint8_t key_a[] = "0123456789abcdef-shared";
static const uint8_t key_b[] = "0123456789abcdef-other!";

struct side {
	struct repl_handshake h;
	int fd;
	struct buffer out;
	struct buffer in;
	enum repl_handshake_result last;
};

/* Sends what the side queued to its peer through the socket. */
static void send_out(struct side *s)
{
	while (buffer_len(&s->out) > 0)
		CU_ASSERT_FATAL(buffer_write_fd(&s->out, s->fd) >= 0);
}

/*
 * Reads from the socket and feeds each whole frame to the handshake.
 * Returns how many frames it fed; stops at the first failure.
 */
static int receive(struct side *s)
{
	struct repl_frame f;
	const char *err;
	int fed = 0;

	CU_ASSERT_FATAL(buffer_read_fd(&s->in, s->fd, 1 << 16) > 0);
	for (;;) {
		ssize_t n = repl_frame_parse(buffer_head(&s->in), buffer_len(&s->in), &f, &err);
		CU_ASSERT_FATAL(n >= 0);
		if (n == 0)
			return fed;
		s->last = repl_handshake_on_frame(&s->h, &f, &s->out);
		buffer_consume(&s->in, (size_t)n);
		fed++;
		if (s->last != REPL_HANDSHAKE_MORE)
			return fed;
	}
}

static void open_pair(struct side *primary, struct side *backup, const uint8_t *primary_key,
		      const uint8_t *backup_key)
{
	int sv[2];

	memset(primary, 0, sizeof(*primary));
	memset(backup, 0, sizeof(*backup));
	CU_ASSERT_EQUAL_FATAL(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	primary->fd = sv[0];
	backup->fd = sv[1];
	buffer_init(&primary->out);
	buffer_init(&primary->in);
	buffer_init(&backup->out);
	buffer_init(&backup->in);
	CU_ASSERT_EQUAL_FATAL(repl_handshake_init(&primary->h, REPL_ROLE_PRIMARY, primary_key,
						  sizeof(key_a) - 1, "hostA", NULL), 0);
	CU_ASSERT_EQUAL_FATAL(repl_handshake_init(&backup->h, REPL_ROLE_BACKUP, backup_key,
						  sizeof(key_b) - 1, "hostB", NULL), 0);
}

static void close_pair(struct side *a, struct side *b)
{
	close(a->fd);
	close(b->fd);
	buffer_free(&a->out);
	buffer_free(&a->in);
	buffer_free(&b->out);
	buffer_free(&b->in);
}

static void test_both_sides_authenticate(void)
{
	struct side p, b;

	open_pair(&p, &b, key_a, key_a);
	CU_ASSERT(memcmp(p.h.nonce, b.h.nonce, REPL_NONCE_SIZE) != 0);
	CU_ASSERT_EQUAL_FATAL(repl_handshake_put_hello(&b.h, &b.out), 0);
	send_out(&b);
	CU_ASSERT_EQUAL(receive(&p), 1);           /* backup's HELLO */
	CU_ASSERT_EQUAL(p.last, REPL_HANDSHAKE_MORE);
	CU_ASSERT_STRING_EQUAL(p.h.peer_name, "hostB");
	send_out(&p);                               /* HELLO and AUTH */
	CU_ASSERT_EQUAL(receive(&b), 2);
	CU_ASSERT_EQUAL(b.last, REPL_HANDSHAKE_DONE);
	CU_ASSERT_STRING_EQUAL(b.h.peer_name, "hostA");
	send_out(&b);                               /* AUTH_OK */
	CU_ASSERT_EQUAL(receive(&p), 1);
	CU_ASSERT_EQUAL(p.last, REPL_HANDSHAKE_DONE);
	CU_ASSERT(p.h.done && b.h.done);
	close_pair(&p, &b);
}

static void test_wrong_key_is_refused(void)
{
	struct side p, b;

	open_pair(&p, &b, key_a, key_b);
	CU_ASSERT_EQUAL_FATAL(repl_handshake_put_hello(&b.h, &b.out), 0);
	send_out(&b);
	receive(&p);
	send_out(&p);
	receive(&b);
	CU_ASSERT_EQUAL(b.last, REPL_HANDSHAKE_FAILED);
	CU_ASSERT_EQUAL(b.h.error_code, REPL_ERR_AUTH);
	CU_ASSERT_PTR_NOT_NULL(strstr(b.h.error, "pre-shared keys differ"));
	CU_ASSERT_FALSE(b.h.done);
	close_pair(&p, &b);

	/* The primary refuses an AUTH_OK that does not prove the key. */
	open_pair(&p, &b, key_a, key_a);
	CU_ASSERT_EQUAL_FATAL(repl_handshake_put_hello(&b.h, &b.out), 0);
	send_out(&b);
	receive(&p);
	send_out(&p);
	receive(&b);
	CU_ASSERT_EQUAL_FATAL(b.last, REPL_HANDSHAKE_DONE);
	/* Corrupt the AUTH_OK's MAC on its way. */
	buffer_head(&b.out)[REPL_HEADER_SIZE] ^= 1;
	send_out(&b);
	receive(&p);
	CU_ASSERT_EQUAL(p.last, REPL_HANDSHAKE_FAILED);
	CU_ASSERT_EQUAL(p.h.error_code, REPL_ERR_AUTH);
	CU_ASSERT_PTR_NOT_NULL(strstr(p.h.error, "does not know our pre-shared key"));
	close_pair(&p, &b);
}

static void test_wrong_role_is_refused(void)
{
	struct side p, b;

	/* Two primaries: the one playing backup says role primary. */
	open_pair(&p, &b, key_a, key_a);
	b.h.role = REPL_ROLE_PRIMARY;
	CU_ASSERT_EQUAL_FATAL(repl_handshake_put_hello(&b.h, &b.out), 0);
	send_out(&b);
	receive(&p);
	CU_ASSERT_EQUAL(p.last, REPL_HANDSHAKE_FAILED);
	CU_ASSERT_PTR_NOT_NULL(strstr(p.h.error, "not a backup"));
	close_pair(&p, &b);

	/* A backup connecting to a backup. */
	open_pair(&p, &b, key_a, key_a);
	p.h.role = REPL_ROLE_BACKUP;
	CU_ASSERT_EQUAL_FATAL(repl_handshake_put_hello(&p.h, &p.out), 0);
	send_out(&p);
	receive(&b);
	CU_ASSERT_EQUAL(b.last, REPL_HANDSHAKE_FAILED);
	CU_ASSERT_EQUAL(b.h.error_code, REPL_ERR_PROTOCOL);
	CU_ASSERT_PTR_NOT_NULL(strstr(b.h.error, "only a primary"));
	close_pair(&p, &b);
}

static void test_wrong_version_is_refused(void)
{
	struct side p, b;
	struct repl_hello h;

	open_pair(&p, &b, key_a, key_a);
	memset(&h, 0, sizeof(h));
	h.role = REPL_ROLE_PRIMARY;
	strcpy(h.name, "future");
	/* The encoder speaks only our version: patch the version on the wire. */
	h.version = REPL_PROTOCOL_VERSION;
	CU_ASSERT_EQUAL_FATAL(repl_put_hello(&p.out, &h), 0);
	uint8_t *v = buffer_head(&p.out) + REPL_HEADER_SIZE + REPL_HELLO_MAGIC_SIZE;
	v[1] = (uint8_t)(REPL_PROTOCOL_VERSION + 1);
	send_out(&p);
	receive(&b);
	CU_ASSERT_EQUAL(b.last, REPL_HANDSHAKE_FAILED);
	CU_ASSERT_EQUAL(b.h.error_code, REPL_ERR_VERSION);
	CU_ASSERT_PTR_NOT_NULL(strstr(b.h.error, "version 2"));
	close_pair(&p, &b);
}

static void test_out_of_order_is_refused(void)
{
	struct side p, b;
	uint8_t mac[REPL_MAC_SIZE] = { 0 };

	open_pair(&p, &b, key_a, key_a);
	CU_ASSERT_EQUAL_FATAL(repl_put_auth(&p.out, REPL_AUTH, mac), 0);
	send_out(&p);
	receive(&b);
	CU_ASSERT_EQUAL(b.last, REPL_HANDSHAKE_FAILED);
	CU_ASSERT_PTR_NOT_NULL(strstr(b.h.error, "before HELLO"));
	close_pair(&p, &b);

	open_pair(&p, &b, key_a, key_a);
	CU_ASSERT_EQUAL_FATAL(repl_put_heartbeat(&p.out, 1, 0), 0);
	send_out(&p);
	receive(&b);
	CU_ASSERT_EQUAL(b.last, REPL_HANDSHAKE_FAILED);
	CU_ASSERT_PTR_NOT_NULL(strstr(b.h.error, "during the handshake"));
	close_pair(&p, &b);
}

int register_repl_handshake_tests(void)
{
	CU_pSuite suite = CU_add_suite("repl_handshake", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "both sides authenticate", test_both_sides_authenticate) ||
	    !CU_add_test(suite, "wrong key refused", test_wrong_key_is_refused) ||
	    !CU_add_test(suite, "wrong role refused", test_wrong_role_is_refused) ||
	    !CU_add_test(suite, "wrong version refused", test_wrong_version_is_refused) ||
	    !CU_add_test(suite, "out of order refused", test_out_of_order_is_refused))
		return -1;
	return 0;
}

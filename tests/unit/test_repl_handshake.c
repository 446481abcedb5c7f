/*
 * The replication handshake, both roles against each other over a
 * socketpair: the right key authenticates both ways; a wrong key, a
 * wrong role or a wrong version is refused with the right error code.
 * The version's negotiation: two builds agree on their highest version;
 * against a version-1 backup (played by hand, byte for byte as the
 * previous release answers) the primary learns 1..1 and its second
 * HELLO is version 1's; disjoint ranges end in the line naming both.
 */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/buffer.h"
#include "wire/repl_fields.h"
#include "wire/repl_handshake.h"
#include "wire/repl_proto.h"
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

	/* A frame a test peeked at is already here: read only for more. */
	if (repl_frame_parse(buffer_head(&s->in), buffer_len(&s->in), &f, &err) == 0)
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

/* The rest of a handshake whose backup HELLO is on its way to the primary:
 * the primary's HELLO and AUTH, the backup's AUTH_OK, both sides done. */
static void finish_from_hello(struct side *p, struct side *b)
{
	CU_ASSERT_EQUAL(receive(p), 1);
	send_out(p);
	CU_ASSERT_EQUAL(receive(b), 2);
	CU_ASSERT_EQUAL(b->last, REPL_HANDSHAKE_DONE);
	send_out(b);
	CU_ASSERT_EQUAL(receive(p), 1);
	CU_ASSERT_EQUAL(p->last, REPL_HANDSHAKE_DONE);
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

/* A HELLO of `version` from role, queued on out (the version patched on the wire). */
static void put_hello_of(struct buffer *out, enum repl_role role, uint16_t version,
			 const char *name)
{
	struct repl_hello h;

	memset(&h, 0, sizeof(h));
	h.role = (uint8_t)role;
	h.version = 1;
	memset(h.nonce, 0x42, sizeof(h.nonce));
	snprintf(h.name, sizeof(h.name), "%s", name);
	/* The encoder writes only versions we speak: the others are patched. */
	CU_ASSERT_EQUAL_FATAL(repl_put_hello(out, &h), 0);
	uint8_t *v = buffer_head(out) + buffer_len(out) - (REPL_HELLO_FIXED + strlen(name)) +
		     REPL_HELLO_AT_version;
	v[0] = (uint8_t)(version >> 8);
	v[1] = (uint8_t)version;
}

/* The frame at the head of s->in, without feeding it anywhere. */
static bool peek_frame(struct side *s, struct repl_frame *f)
{
	const char *err;

	if (buffer_len(&s->in) == 0)
		CU_ASSERT_FATAL(buffer_read_fd(&s->in, s->fd, 1 << 16) > 0);
	return repl_frame_parse(buffer_head(&s->in), buffer_len(&s->in), f, &err) > 0;
}

static void test_wrong_version_is_refused(void)
{
	struct side p, b;
	char want[256];

	/* A primary that offers a version above ours. */
	open_pair(&p, &b, key_a, key_a);
	put_hello_of(&p.out, REPL_ROLE_PRIMARY, REPL_PROTOCOL_MAX + 1, "future");
	send_out(&p);
	receive(&b);
	CU_ASSERT_EQUAL(b.last, REPL_HANDSHAKE_FAILED);
	CU_ASSERT_EQUAL(b.h.error_code, REPL_ERR_VERSION);
	snprintf(want, sizeof(want), "supported %u..%u; the primary offers replication "
		 "protocol %u, this daemon speaks %u..%u: the primary retries with %u if it "
		 "speaks it, otherwise upgrade this daemon first", REPL_PROTOCOL_MIN,
		 REPL_PROTOCOL_MAX, REPL_PROTOCOL_MAX + 1, REPL_PROTOCOL_MIN, REPL_PROTOCOL_MAX,
		 REPL_PROTOCOL_MAX);
	CU_ASSERT_STRING_EQUAL(b.h.error, want);
	CU_ASSERT_EQUAL(b.h.version, 0);
	close_pair(&p, &b);

	/* Version 0 does not exist: a protocol error, not a version to negotiate. */
	open_pair(&p, &b, key_a, key_a);
	put_hello_of(&p.out, REPL_ROLE_PRIMARY, 0, "zero");
	send_out(&p);
	receive(&b);
	CU_ASSERT_EQUAL(b.last, REPL_HANDSHAKE_FAILED);
	CU_ASSERT_EQUAL(b.h.error_code, REPL_ERR_PROTOCOL);
	CU_ASSERT_PTR_NOT_NULL(strstr(b.h.error, "protocol version 0"));
	close_pair(&p, &b);
}

/* Two builds of this tree: the backup opens with its lowest, they agree on the highest. */
static void test_same_builds_agree_on_the_highest(void)
{
	struct side p, b;
	struct repl_frame f;
	struct repl_hello h;
	const char *err;

	open_pair(&p, &b, key_a, key_a);
	CU_ASSERT_EQUAL_FATAL(repl_handshake_put_hello(&b.h, &b.out), 0);
	send_out(&b);
	CU_ASSERT_FATAL(peek_frame(&p, &f));
	CU_ASSERT_EQUAL_FATAL(repl_decode_hello(&f, &h, &err), 0);
	CU_ASSERT_EQUAL(h.version, REPL_PROTOCOL_MIN);
	finish_from_hello(&p, &b);
	CU_ASSERT_EQUAL(p.h.version, REPL_PROTOCOL_MAX);
	CU_ASSERT_EQUAL(b.h.version, REPL_PROTOCOL_MAX);
	close_pair(&p, &b);
}

/*
 * Version 3 binds the session's version into both MACs: a HELLO whose
 * version field is changed on the way, to one the backup also speaks,
 * makes the two sides MAC different versions, and the backup refuses the
 * AUTH.  The control: the same handshake untouched agrees on 3.
 */
static void test_tampered_version_fails_authentication(void)
{
	for (int tamper = 0; tamper <= 1; tamper++) {
		struct side p, b;

		open_pair(&p, &b, key_a, key_a);
		CU_ASSERT_EQUAL_FATAL(repl_handshake_put_hello(&b.h, &b.out), 0);
		send_out(&b);
		CU_ASSERT_EQUAL(receive(&p), 1);
		CU_ASSERT_EQUAL(p.h.offered, REPL_PROTOCOL_MAX);
		uint8_t *low = buffer_head(&p.out) + REPL_HEADER_SIZE + REPL_HELLO_AT_version + 1;
		CU_ASSERT_EQUAL(*low, REPL_PROTOCOL_MAX);
		if (tamper)
			*low = REPL_AUTH_BINDS_VERSION - 1; /* 2: the backup speaks it too */
		send_out(&p);
		CU_ASSERT_EQUAL(receive(&b), 2);
		if (tamper) {
			CU_ASSERT_EQUAL(b.last, REPL_HANDSHAKE_FAILED);
			CU_ASSERT_EQUAL(b.h.error_code, REPL_ERR_AUTH);
			CU_ASSERT_PTR_NOT_NULL(strstr(b.h.error, "authentication failed"));
		} else {
			CU_ASSERT_EQUAL(b.last, REPL_HANDSHAKE_DONE);
			CU_ASSERT_EQUAL(b.h.version, REPL_PROTOCOL_MAX);
			send_out(&b);
			CU_ASSERT_EQUAL(receive(&p), 1);
			CU_ASSERT_EQUAL(p.last, REPL_HANDSHAKE_DONE);
		}
		close_pair(&p, &b);
	}
}

/*
 * A forged refusal ("supported 1..2") talks the primary down to 2.  Each
 * nonce carries its daemon's range inside both MACs, so the backup, once
 * the AUTH checks, sees that the primary speaks 3 as well and refuses the
 * offer with its range: the primary's next connection offers 3.  If only
 * the backup's nonce says so (the primary's carries no range), the
 * primary catches it on AUTH_OK.  The control: a primary whose nonce
 * carries no range (a daemon that speaks 1..2) is accepted at 2.
 */
static void test_forged_refusal_is_caught(void)
{
	static const uint8_t plain_nonce[REPL_NONCE_SIZE] = { 1, 2, 3 };
	struct repl_error e;

	for (int primary_stamped = 1; primary_stamped >= 0; primary_stamped--) {
		struct side p, b;

		open_pair(&p, &b, key_a, key_a);
		if (!primary_stamped)
			CU_ASSERT_EQUAL_FATAL(repl_handshake_init(&p.h, REPL_ROLE_PRIMARY, key_a,
								  sizeof(key_a) - 1, "hostA",
								  plain_nonce), 0);
		p.h.backup_range = (struct repl_version_range){ 1, 2 }; /* the forgery's */
		CU_ASSERT_EQUAL_FATAL(repl_handshake_put_hello(&b.h, &b.out), 0);
		send_out(&b);
		CU_ASSERT_EQUAL(receive(&p), 1);
		CU_ASSERT_EQUAL(p.h.offered, 2);
		send_out(&p);
		CU_ASSERT_EQUAL(receive(&b), 2);
		if (primary_stamped) {
			CU_ASSERT_EQUAL(b.last, REPL_HANDSHAKE_FAILED);
			CU_ASSERT_EQUAL(b.h.error_code, REPL_ERR_VERSION);
			CU_ASSERT_PTR_NOT_NULL(strstr(b.h.error, "forged"));
			/* Its refusal is an ordinary one: the primary retries with 3. */
			e.code = REPL_ERR_VERSION;
			e.reason = b.h.error;
			e.reason_len = strlen(b.h.error);
			CU_ASSERT_EQUAL(repl_handshake_on_version_refusal(&p.h, &e, "b:1"),
					REPL_PROTOCOL_MAX);
		} else {
			CU_ASSERT_EQUAL(b.last, REPL_HANDSHAKE_DONE); /* the control */
			CU_ASSERT_EQUAL(b.h.version, 2);
			send_out(&b);
			CU_ASSERT_EQUAL(receive(&p), 1);
			CU_ASSERT_EQUAL(p.last, REPL_HANDSHAKE_FAILED);
			CU_ASSERT_EQUAL(p.h.error_code, REPL_ERR_VERSION);
			CU_ASSERT_PTR_NOT_NULL(strstr(p.h.error, "proves it speaks replication "
						      "protocol 1..3"));
		}
		close_pair(&p, &b);
	}
}

/* A daemon whose nonce carries no range (1..2, or the previous release) is taken at 2. */
static void test_unstamped_primary_at_two_is_accepted(void)
{
	static const uint8_t plain_nonce[REPL_NONCE_SIZE] = { 9, 8, 7 };
	static const uint8_t plain_nonce_b[REPL_NONCE_SIZE] = { 6, 5, 4 };
	struct side p, b;

	open_pair(&p, &b, key_a, key_a);
	CU_ASSERT_EQUAL_FATAL(repl_handshake_init(&p.h, REPL_ROLE_PRIMARY, key_a,
						  sizeof(key_a) - 1, "hostA", plain_nonce), 0);
	CU_ASSERT_EQUAL_FATAL(repl_handshake_init(&b.h, REPL_ROLE_BACKUP, key_a,
						  sizeof(key_a) - 1, "hostB", plain_nonce_b), 0);
	p.h.backup_range = (struct repl_version_range){ 1, 2 };
	CU_ASSERT_EQUAL_FATAL(repl_handshake_put_hello(&b.h, &b.out), 0);
	send_out(&b);
	finish_from_hello(&p, &b);
	CU_ASSERT_EQUAL(p.h.version, 2);
	close_pair(&p, &b);
}

/* What the previous release (version 1 only) answers a HELLO of version 2. */
#define V1_REFUSAL "the peer speaks replication protocol version 2, we speak 1: run the " \
		   "same remusdbd version on both hosts"

/*
 * The primary against a version-1 backup, played by hand: it offers our
 * highest, learns 1..1 from the plain refusal, and on the second
 * connection offers 1 in exactly version 1's bytes, which completes.
 */
static void test_version_1_backup(void)
{
	struct side p, b;
	struct repl_frame f;
	struct repl_hello h;
	struct repl_error e;
	const char *err;

	open_pair(&p, &b, key_a, key_a);
	put_hello_of(&b.out, REPL_ROLE_BACKUP, 1, "old-backup");
	send_out(&b);
	CU_ASSERT_EQUAL(receive(&p), 1);
	CU_ASSERT_EQUAL(p.last, REPL_HANDSHAKE_MORE);
	CU_ASSERT_EQUAL(p.h.peer_hello_version, 1);
	send_out(&p);
	CU_ASSERT_FATAL(peek_frame(&b, &f));
	CU_ASSERT_EQUAL_FATAL(repl_decode_hello(&f, &h, &err), 0);
	CU_ASSERT_EQUAL(h.version, REPL_PROTOCOL_MAX);
	e.code = REPL_ERR_VERSION;
	e.reason = V1_REFUSAL;
	e.reason_len = strlen(V1_REFUSAL);
	CU_ASSERT_EQUAL(repl_handshake_on_version_refusal(&p.h, &e, "10.77.0.2:7788"), 1);
	CU_ASSERT(p.h.backup_range.lo == 1 && p.h.backup_range.hi == 1);
	struct repl_version_range learnt = p.h.backup_range;
	close_pair(&p, &b);

	/* The second connection: the owner hands the range to a new handshake. */
	open_pair(&p, &b, key_a, key_a);
	p.h.backup_range = learnt;
	memset(p.h.nonce, 0x17, sizeof(p.h.nonce));
	/* The backup of this tree plays the old one's part: its nonce is the hand-made HELLO's. */
	memset(b.h.nonce, 0x42, sizeof(b.h.nonce));
	put_hello_of(&b.out, REPL_ROLE_BACKUP, 1, "old-backup");
	send_out(&b);
	CU_ASSERT_EQUAL(receive(&p), 1);
	CU_ASSERT_EQUAL(p.h.offered, 1);
	send_out(&p);
	/* Byte for byte a version-1 HELLO: magic, version 1, role 1, nonce, name. */
	CU_ASSERT_FATAL(peek_frame(&b, &f));
	const uint8_t head[] = { 0, 1, 0, 0, 0, 0, 0, 49, 'R', 'D', 'B', 'R', 'E', 'P', 'L', 0,
				 0, 1, 1 };
	CU_ASSERT_EQUAL(memcmp(buffer_head(&b.in), head, sizeof(head)), 0);
	for (int i = 0; i < REPL_NONCE_SIZE; i++)
		CU_ASSERT_EQUAL(f.payload[11 + i], 0x17);
	CU_ASSERT_EQUAL(f.length, 49);
	CU_ASSERT_EQUAL(memcmp(f.payload + 43, "\x05hostA", 6), 0);
	/* The version-1 session completes both ways. */
	CU_ASSERT_EQUAL(receive(&b), 2);
	CU_ASSERT_EQUAL_FATAL(b.last, REPL_HANDSHAKE_DONE);
	CU_ASSERT_EQUAL(b.h.version, 1);
	send_out(&b);
	CU_ASSERT_EQUAL(receive(&p), 1);
	CU_ASSERT_EQUAL(p.last, REPL_HANDSHAKE_DONE);
	CU_ASSERT_EQUAL(p.h.version, 1);
	close_pair(&p, &b);
}

/* A backup of a later range than ours: its HELLO we cannot read, its refusal we can. */
static void test_disjoint_newer_backup(void)
{
	struct side p, b;
	struct repl_frame f;
	struct repl_hello h;
	struct repl_error e;
	const char *err;
	char reason[256], want[256];
	const uint16_t lo = REPL_PROTOCOL_MAX + 1, hi = REPL_PROTOCOL_MAX + 2;

	open_pair(&p, &b, key_a, key_a);
	put_hello_of(&b.out, REPL_ROLE_BACKUP, lo, "new-backup");
	send_out(&b);
	CU_ASSERT_EQUAL(receive(&p), 1);
	CU_ASSERT_EQUAL(p.last, REPL_HANDSHAKE_MORE);
	send_out(&p);
	/* Our HELLO alone: no AUTH without the backup's nonce. */
	CU_ASSERT_FATAL(peek_frame(&b, &f));
	CU_ASSERT_EQUAL_FATAL(repl_decode_hello(&f, &h, &err), 0);
	CU_ASSERT_EQUAL(h.version, REPL_PROTOCOL_MAX);
	CU_ASSERT_EQUAL(buffer_len(&b.in), REPL_HEADER_SIZE + f.length);
	snprintf(reason, sizeof(reason), "supported %u..%u; the primary offers ...", lo, hi);
	e.code = REPL_ERR_VERSION;
	e.reason = reason;
	e.reason_len = strlen(reason);
	CU_ASSERT_EQUAL(repl_handshake_on_version_refusal(&p.h, &e, "10.77.0.2:7788"), 0);
	snprintf(want, sizeof(want), "backup 10.77.0.2:7788 speaks replication protocol "
		 "%u..%u, this daemon %u..%u: upgrade the older daemon (this one) first", lo, hi,
		 REPL_PROTOCOL_MIN, REPL_PROTOCOL_MAX);
	CU_ASSERT_STRING_EQUAL(p.h.error, want);
	close_pair(&p, &b);
}

/* The primary's other answers to a refusal: the retry, and the refusals that end it. */
static void test_primary_after_refusal(void)
{
	struct repl_handshake h;
	struct repl_error e = { .code = REPL_ERR_VERSION };

	/* An overlapping backup that stops below our offer: retry with the highest common. */
	CU_ASSERT_EQUAL_FATAL(repl_handshake_init(&h, REPL_ROLE_PRIMARY, key_a, 8, "p", NULL), 0);
	h.peer_hello_version = 1;
	h.offered = 3;
	e.reason = "supported 1..2; x";
	e.reason_len = strlen(e.reason);
	CU_ASSERT_EQUAL(repl_handshake_on_version_refusal(&h, &e, "b:1"), 2);
	/* A backup refusing what it says it speaks: no loop. */
	h.offered = REPL_PROTOCOL_MAX;
	e.reason = "supported 1..65535";
	e.reason_len = strlen(e.reason);
	CU_ASSERT_EQUAL(repl_handshake_on_version_refusal(&h, &e, "b:1"), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(h.error, "although it says it speaks 1..65535"));
	/* A backup that opened with 2 and gives no range: nothing to go on. */
	h.peer_hello_version = 2;
	e.reason = "no";
	e.reason_len = 2;
	CU_ASSERT_EQUAL(repl_handshake_on_version_refusal(&h, &e, "b:1"), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(h.error, "did not say which versions it speaks"));
	/* The same plain refusal from a backup that opened with 1: a version-1 daemon. */
	h.peer_hello_version = 1;
	CU_ASSERT_EQUAL(repl_handshake_on_version_refusal(&h, &e, "b:1"), 1);
}

/* A range learnt from a daemon whose lowest version was another belongs to the one replaced. */
static void test_learnt_range_of_a_replaced_backup_is_dropped(void)
{
	struct side p, b;

	open_pair(&p, &b, key_a, key_a);
	p.h.backup_range = (struct repl_version_range){ 1, 1 };
	put_hello_of(&b.out, REPL_ROLE_BACKUP, 2, "upgraded");
	send_out(&b);
	receive(&p);
	CU_ASSERT_EQUAL(p.h.offered, REPL_PROTOCOL_MAX);
	CU_ASSERT_FALSE(repl_version_known(p.h.backup_range));
	close_pair(&p, &b);

	/* Negative control: the same lowest version keeps it, and the offer follows it. */
	open_pair(&p, &b, key_a, key_a);
	p.h.backup_range = (struct repl_version_range){ 1, 1 };
	put_hello_of(&b.out, REPL_ROLE_BACKUP, 1, "old");
	send_out(&b);
	receive(&p);
	CU_ASSERT_EQUAL(p.h.offered, 1);
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
	    !CU_add_test(suite, "same builds agree on the highest version",
			 test_same_builds_agree_on_the_highest) ||
	    !CU_add_test(suite, "a version-1 backup", test_version_1_backup) ||
	    !CU_add_test(suite, "a disjoint newer backup", test_disjoint_newer_backup) ||
	    !CU_add_test(suite, "the primary after a refusal", test_primary_after_refusal) ||
	    !CU_add_test(suite, "a replaced backup's range is dropped",
			 test_learnt_range_of_a_replaced_backup_is_dropped) ||
	    !CU_add_test(suite, "out of order refused", test_out_of_order_is_refused) ||
	    !CU_add_test(suite, "a tampered version field fails authentication",
			 test_tampered_version_fails_authentication) ||
	    !CU_add_test(suite, "a forged refusal is caught", test_forged_refusal_is_caught) ||
	    !CU_add_test(suite, "an unstamped primary at version 2 is accepted",
			 test_unstamped_primary_at_two_is_accepted))
		return -1;
	return 0;
}

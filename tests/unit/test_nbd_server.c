/*
 * The NBD server end to end: a real export on a temporary unix socket and
 * disk image, driven by a minimal in-test client (nbd_test_client.c).
 */
#include <CUnit/CUnit.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/be.h"
#include "base/event_loop.h"
#include "base/log.h"
#include "nbd/nbd_proto.h"
#include "nbd/nbd_server.h"
#include "nbd_test_client.h"
#include "suites.h"

#define DISK_SIZE (16u * 1024 * 1024)

static struct nbd_fixture fx;

static int setup(void)
{
	return nbd_fixture_setup(&fx, DISK_SIZE);
}

static void teardown(void)
{
	nbd_fixture_teardown(&fx);
}

static struct nbd_export_stats stats(void)
{
	struct nbd_export_stats s;

	nbd_export_get_stats(fx.export, &s);
	return s;
}

static void test_handshake_go(void)
{
	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int fd = nbd_client_connect();
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(nbd_client_handshake(fd, "vm1", DISK_SIZE), 0);
	CU_ASSERT_EQUAL(stats().connections_current, 1);
	CU_ASSERT_EQUAL(stats().connections_total, 1);
	int fd2 = nbd_client_connect();
	CU_ASSERT_EQUAL(nbd_client_handshake(fd2, "", DISK_SIZE), 0); /* the default export */
	CU_ASSERT_EQUAL(stats().connections_current, 2);
	close(fd);
	close(fd2);
	nbd_client_pump(20);
	CU_ASSERT_EQUAL(stats().connections_current, 0);
	CU_ASSERT_EQUAL(stats().connections_total, 2);
	teardown();
}

static void test_handshake_errors_and_export_name(void)
{
	uint8_t greeting[NBD_GREETING_SIZE], data[256], reply[NBD_EXPORT_NAME_REPLY_SIZE];
	const uint8_t fixed_only[] = { 0, 0, 0, NBD_FLAG_C_FIXED_NEWSTYLE };
	uint32_t len;

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int fd = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_recv(fd, greeting, sizeof(greeting)), 0);
	CU_ASSERT_EQUAL(nbd_client_send(fd, fixed_only, 4), 0);
	/* Unknown export: an error reply, the connection stays usable. */
	CU_ASSERT_EQUAL(nbd_client_send_go(fd, "nosuch"), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_option_reply(fd, NBD_OPT_GO, data, sizeof(data), &len),
			NBD_REP_ERR_UNKNOWN);
	/* Malformed GO payload. */
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_GO, "\0\0\0\x09vm1\0\0", 9), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_option_reply(fd, NBD_OPT_GO, data, sizeof(data), &len),
			NBD_REP_ERR_INVALID);
	/* An option we do not know. */
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, 0x4242, "xyz", 3), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_option_reply(fd, 0x4242, data, sizeof(data), &len),
			NBD_REP_ERR_UNSUP);
	/* LIST names our export. */
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_LIST, NULL, 0), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_option_reply(fd, NBD_OPT_LIST, data, sizeof(data), &len),
			NBD_REP_SERVER);
	CU_ASSERT_EQUAL(len, 7);
	CU_ASSERT_EQUAL(memcmp(data, "\0\0\0\x03vm1", 7), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_option_reply(fd, NBD_OPT_LIST, data, sizeof(data), &len),
			NBD_REP_ACK);
	/* EXPORT_NAME without NO_ZEROES: size, flags and 124 zero bytes. */
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_EXPORT_NAME, "vm1", 3), 0);
	CU_ASSERT_EQUAL_FATAL(nbd_client_recv(fd, reply, sizeof(reply)), 0);
	CU_ASSERT_EQUAL(load_be64(reply), DISK_SIZE);
	CU_ASSERT_EQUAL((reply[8] << 8) | reply[9],
			NBD_SERVER_TRANSMISSION_FLAGS | NBD_FLAG_CAN_MULTI_CONN);
	CU_ASSERT_EQUAL(reply[133], 0);
	/* Now in transmission. */
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_FLUSH, 0, 0, 0, NULL, NULL), 0);
	close(fd);

	/* EXPORT_NAME for an unknown export can only be answered by closing. */
	fd = nbd_client_connect();
	CU_ASSERT_EQUAL(nbd_client_recv(fd, greeting, sizeof(greeting)), 0);
	CU_ASSERT_EQUAL(nbd_client_send(fd, fixed_only, 4), 0);
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_EXPORT_NAME, "other", 5), 0);
	CU_ASSERT_EQUAL(nbd_client_sees_eof(fd), 1);
	close(fd);

	/* Bad option magic closes; so do unknown client flags. */
	fd = nbd_client_connect();
	CU_ASSERT_EQUAL(nbd_client_recv(fd, greeting, sizeof(greeting)), 0);
	CU_ASSERT_EQUAL(nbd_client_send(fd, fixed_only, 4), 0);
	CU_ASSERT_EQUAL(nbd_client_send(fd, "IHAVEOPXxxxxxxxx", 16), 0);
	CU_ASSERT_EQUAL(nbd_client_sees_eof(fd), 1);
	close(fd);
	fd = nbd_client_connect();
	CU_ASSERT_EQUAL(nbd_client_recv(fd, greeting, sizeof(greeting)), 0);
	CU_ASSERT_EQUAL(nbd_client_send(fd, "\0\0\x01\x01", 4), 0);
	CU_ASSERT_EQUAL(nbd_client_sees_eof(fd), 1);
	close(fd);

	/* ABORT is acknowledged, then the server closes. */
	fd = nbd_client_connect();
	CU_ASSERT_EQUAL(nbd_client_recv(fd, greeting, sizeof(greeting)), 0);
	CU_ASSERT_EQUAL(nbd_client_send(fd, fixed_only, 4), 0);
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_ABORT, NULL, 0), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_option_reply(fd, NBD_OPT_ABORT, data, sizeof(data), &len),
			NBD_REP_ACK);
	CU_ASSERT_EQUAL(nbd_client_sees_eof(fd), 1);
	close(fd);
	nbd_client_pump(20);
	CU_ASSERT_EQUAL(stats().connections_current, 0);
	teardown();
}

static void test_write_read_flush_trim(void)
{
	uint8_t out[8192], in[8192], on_disk[8192], zeros[8192] = { 0 };

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int fd = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake(fd, "vm1", DISK_SIZE), 0);

	nbd_client_fill_pattern(out, sizeof(out), 1);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_WRITE, 0, 65536, sizeof(out), out, NULL), 0);
	/* Acknowledged means it is in the file (page cache) already. */
	CU_ASSERT_EQUAL(pread(fx.disk_fd, on_disk, sizeof(on_disk), 65536), (ssize_t)sizeof(on_disk));
	CU_ASSERT_EQUAL(memcmp(on_disk, out, sizeof(out)), 0);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_READ, 0, 65536, sizeof(in), NULL, in), 0);
	CU_ASSERT_EQUAL(memcmp(in, out, sizeof(out)), 0);
	/* Unaligned read straddling written and unwritten bytes. */
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_READ, 0, 65536 + 8000, 1000, NULL, in), 0);
	CU_ASSERT_EQUAL(memcmp(in, out + 8000, 192), 0);
	CU_ASSERT_EQUAL(memcmp(in + 192, zeros, 808), 0);

	nbd_client_fill_pattern(out, 4096, 2);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, DISK_SIZE - 4096,
				 4096, out, NULL), 0);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_FLUSH, 0, 0, 0, NULL, NULL), 0);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_TRIM, 0, 65536, 4096, NULL, NULL), 0);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_WRITE_ZEROES, 0, 65536 + 4096, 4096, NULL, NULL), 0);
	CU_ASSERT_EQUAL(pread(fx.disk_fd, on_disk, 4096, 65536 + 4096), 4096);
	CU_ASSERT_EQUAL(memcmp(on_disk, zeros, 4096), 0);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_NO_HOLE, 0, 512,
				 NULL, NULL), 0);

	struct nbd_export_stats s = stats();
	CU_ASSERT_EQUAL(s.writes, 2);
	CU_ASSERT_EQUAL(s.bytes_written, 8192 + 4096);
	CU_ASSERT_EQUAL(s.reads, 2);
	CU_ASSERT_EQUAL(s.bytes_read, 8192 + 1000);
	CU_ASSERT_EQUAL(s.flushes, 2); /* the FUA write and the FLUSH */
	CU_ASSERT_EQUAL(s.trims, 1);
	CU_ASSERT_EQUAL(s.write_zeroes, 2);
	CU_ASSERT_EQUAL(s.errors, 0);

	/* NBD_CMD_DISC: no reply, the server closes. */
	CU_ASSERT_EQUAL(nbd_client_send_request(fd, NBD_CMD_DISC, 0, 99, 0, 0), 0);
	CU_ASSERT_EQUAL(nbd_client_sees_eof(fd), 1);
	close(fd);
	teardown();
}

/*
 * A FLUSH (and a FUA write) is answered from a worker thread's fdatasync;
 * requests the client sent behind it wait for its reply, so no reply
 * overtakes it.
 */
static void test_flush_replies_in_order(void)
{
	uint8_t out[4096], in[4096];

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int fd = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake(fd, "vm1", DISK_SIZE), 0);
	nbd_client_fill_pattern(out, sizeof(out), 3);
	/* FLUSH, then a READ sent before the FLUSH's reply. */
	CU_ASSERT_EQUAL(nbd_client_send_request(fd, NBD_CMD_FLUSH, 0, 1001, 0, 0), 0);
	CU_ASSERT_EQUAL(nbd_client_send_request(fd, NBD_CMD_READ, 0, 1002, 0, sizeof(in)), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_reply(fd, 1001, NULL, 0), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_reply(fd, 1002, in, sizeof(in)), 0);
	/* A FUA write, then a READ of what it wrote. */
	CU_ASSERT_EQUAL(nbd_client_send_request(fd, NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 1003, 8192,
						sizeof(out)), 0);
	CU_ASSERT_EQUAL(nbd_client_send(fd, out, sizeof(out)), 0);
	CU_ASSERT_EQUAL(nbd_client_send_request(fd, NBD_CMD_READ, 0, 1004, 8192, sizeof(in)), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_reply(fd, 1003, NULL, 0), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_reply(fd, 1004, in, sizeof(in)), 0);
	CU_ASSERT_EQUAL(memcmp(in, out, sizeof(out)), 0);
	struct nbd_export_stats s = stats();
	CU_ASSERT_EQUAL(s.flushes, 2);
	CU_ASSERT_EQUAL(s.errors, 0);
	close(fd);
	teardown();
}

/*
 * Requests that arrive together are served as one batch on the
 * connection's worker (nbd_io_batch.c), in order: each read sees the
 * writes before it and none after it, and a FUA write or a FLUSH ends
 * the batch with its fdatasync.
 */
static void test_a_batch_keeps_its_order(void)
{
	uint8_t a[4096], b[4096], zero[4096] = {0}, in[4096];
	uint8_t msg[8 * NBD_REQUEST_SIZE + 2 * 4096], *p = msg;
	struct { uint16_t type, flags; uint64_t offset; const uint8_t *payload; } req[] = {
		{ NBD_CMD_WRITE, 0, 0, a },
		{ NBD_CMD_READ, 0, 0, NULL },
		{ NBD_CMD_WRITE_ZEROES, 0, 0, NULL },
		{ NBD_CMD_READ, 0, 0, NULL },
		{ NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 8192, b },
		{ NBD_CMD_READ, 0, 8192, NULL },
		{ NBD_CMD_FLUSH, 0, 0, NULL },
		{ NBD_CMD_READ, 0, 409600, NULL },
	};
	const uint8_t *expect[] = { NULL, a, NULL, zero, NULL, b, NULL, zero };

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int fd = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake(fd, "vm1", DISK_SIZE), 0);
	nbd_client_fill_pattern(a, sizeof(a), 5);
	nbd_client_fill_pattern(b, sizeof(b), 6);
	for (size_t i = 0; i < 8; i++) {
		store_be32(p, NBD_MAGIC_REQUEST);
		store_be16(p + 4, req[i].flags);
		store_be16(p + 6, req[i].type);
		store_be64(p + 8, 2000 + i);
		store_be64(p + 16, req[i].offset);
		store_be32(p + 24, req[i].type == NBD_CMD_FLUSH ? 0 : 4096);
		p += NBD_REQUEST_SIZE;
		if (req[i].payload) {
			memcpy(p, req[i].payload, 4096);
			p += 4096;
		}
	}
	/* One send: the server finds them all buffered at once. */
	CU_ASSERT_EQUAL_FATAL(nbd_client_send(fd, msg, (size_t)(p - msg)), 0);
	for (size_t i = 0; i < 8; i++) {
		memset(in, 0xee, sizeof(in));
		CU_ASSERT_EQUAL(nbd_client_recv_reply(fd, 2000 + i, expect[i] ? in : NULL,
						      expect[i] ? sizeof(in) : 0), 0);
		if (expect[i])
			CU_ASSERT_EQUAL(memcmp(in, expect[i], sizeof(in)), 0);
	}
	struct nbd_export_stats s = stats();
	CU_ASSERT_EQUAL(s.writes, 2);
	CU_ASSERT_EQUAL(s.write_zeroes, 1);
	CU_ASSERT_EQUAL(s.reads, 4);
	CU_ASSERT_EQUAL(s.flushes, 2);
	CU_ASSERT_EQUAL(s.errors, 0);
	CU_ASSERT_EQUAL(pread(fx.disk_fd, in, sizeof(in), 8192), (ssize_t)sizeof(in));
	CU_ASSERT_EQUAL(memcmp(in, b, sizeof(in)), 0);
	close(fd);
	teardown();
}

struct hook_count {
	int writes;
	uint64_t offset;
};

static void count_write(void *opaque, enum nbd_write_kind kind, uint64_t offset,
			const uint8_t *data, uint64_t len)
{
	struct hook_count *h = opaque;

	(void)data;
	(void)len;
	if (kind == NBD_WRITE_DATA) {
		h->writes++;
		h->offset = offset;
	}
}

/*
 * A connection closed while its batch runs on the worker (the export
 * destroyed, the client gone): the write is in the image, so the write
 * hook (the replication's, the change log's) must see it, reply or not.
 */
static void test_a_closed_connection_finishes_its_batch(void)
{
	struct hook_count h = {0};
	uint8_t out[4096], in[4096];

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	nbd_export_set_write_hook(fx.export, count_write, &h);
	int fd = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake(fd, "vm1", DISK_SIZE), 0);
	nbd_client_fill_pattern(out, sizeof(out), 7);
	CU_ASSERT_EQUAL(nbd_client_send_request(fd, NBD_CMD_WRITE, 0, 3001, 12288,
						sizeof(out)), 0);
	CU_ASSERT_EQUAL(nbd_client_send(fd, out, sizeof(out)), 0);
	/*
	 * One turn reads the request and posts it; the worker's answer is a
	 * byte in a pipe the loop reads only at a later turn.
	 */
	event_loop_run_once(fx.loop, 1000);
	CU_ASSERT_EQUAL(h.writes, 0);
	nbd_export_destroy(fx.export);
	fx.export = NULL;
	CU_ASSERT_EQUAL(h.writes, 1);
	CU_ASSERT_EQUAL(h.offset, 12288);
	CU_ASSERT_EQUAL(pread(fx.disk_fd, in, sizeof(in), 12288), (ssize_t)sizeof(in));
	CU_ASSERT_EQUAL(memcmp(in, out, sizeof(in)), 0);
	close(fd);
	teardown();
}

static void test_out_of_range_gets_error_reply(void)
{
	uint8_t buf[4096] = { 1 };

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int fd = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake(fd, "vm1", DISK_SIZE), 0);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_READ, 0, DISK_SIZE, 512, NULL, buf), NBD_EINVAL);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_READ, 0, DISK_SIZE - 511, 512, NULL, buf), NBD_EINVAL);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_READ, 0, UINT64_MAX - 100, 512, NULL, buf), NBD_EINVAL);
	/* A write past the end: its payload is consumed, then ENOSPC. */
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_WRITE, 0, DISK_SIZE - 100, sizeof(buf), buf, NULL),
			NBD_ENOSPC);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_TRIM, 0, DISK_SIZE, 1, NULL, NULL), NBD_EINVAL);
	/* Unknown command and bad flags: EINVAL, connection kept. */
	CU_ASSERT_EQUAL(nbd_client_transact(fd, 42, 0, 0, 0, NULL, NULL), NBD_EINVAL);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 512, NULL, buf), NBD_EINVAL);
	/* Still in sync: a valid request works. */
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_READ, 0, DISK_SIZE - 512, 512, NULL, buf), 0);
	CU_ASSERT_EQUAL(stats().errors, 7);
	CU_ASSERT_EQUAL(stats().connections_current, 1);
	close(fd);
	teardown();
}

static void test_bad_magic_closes_only_that_connection(void)
{
	uint8_t buf[512];

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int good = nbd_client_connect();
	int bad = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake(good, "vm1", DISK_SIZE), 0);
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake(bad, "vm1", DISK_SIZE), 0);
	CU_ASSERT_EQUAL(stats().connections_current, 2);
	const uint8_t garbage[NBD_REQUEST_SIZE] = { 0xde, 0xad, 0xbe, 0xef };
	CU_ASSERT_EQUAL(nbd_client_send(bad, garbage, sizeof(garbage)), 0);
	CU_ASSERT_EQUAL(nbd_client_sees_eof(bad), 1);
	CU_ASSERT_EQUAL(stats().connections_current, 1);
	CU_ASSERT_EQUAL(stats().errors, 1);
	CU_ASSERT_EQUAL(nbd_client_transact(good, NBD_CMD_READ, 0, 0, sizeof(buf), NULL, buf), 0);
	close(bad);

	/* An oversized write cannot be skipped: closed as well. */
	bad = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake(bad, "vm1", DISK_SIZE), 0);
	CU_ASSERT_EQUAL(nbd_client_send_request(bad, NBD_CMD_WRITE, 0, 5, 0, NBD_MAX_PAYLOAD + 1), 0);
	CU_ASSERT_EQUAL(nbd_client_sees_eof(bad), 1);
	CU_ASSERT_EQUAL(nbd_client_transact(good, NBD_CMD_FLUSH, 0, 0, 0, NULL, NULL), 0);
	close(bad);
	close(good);
	teardown();
}

static void test_peer_vanishes_mid_write(void)
{
	uint8_t first[4096], partial[1000], on_disk[4096], zeros[4096] = { 0 };

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int fd = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake(fd, "vm1", DISK_SIZE), 0);
	nbd_client_fill_pattern(first, sizeof(first), 3);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_WRITE, 0, 0, sizeof(first), first, NULL), 0);
	/* Header of a 4 KiB write, 1000 bytes of payload, then gone. */
	memset(partial, 0xee, sizeof(partial));
	CU_ASSERT_EQUAL(nbd_client_send_request(fd, NBD_CMD_WRITE, 0, 77, 8192, 4096), 0);
	CU_ASSERT_EQUAL(nbd_client_send(fd, partial, sizeof(partial)), 0);
	nbd_client_pump(20);
	close(fd);
	nbd_client_pump(50);
	CU_ASSERT_EQUAL(stats().connections_current, 0);
	CU_ASSERT_EQUAL(stats().writes, 1);
	CU_ASSERT_EQUAL(stats().errors, 1);
	/* The acknowledged write is on disk; the torn one was never applied. */
	CU_ASSERT_EQUAL(pread(fx.disk_fd, on_disk, sizeof(on_disk), 0), 4096);
	CU_ASSERT_EQUAL(memcmp(on_disk, first, sizeof(first)), 0);
	CU_ASSERT_EQUAL(pread(fx.disk_fd, on_disk, sizeof(on_disk), 8192), 4096);
	CU_ASSERT_EQUAL(memcmp(on_disk, zeros, sizeof(zeros)), 0);
	/* The export still accepts new clients. */
	fd = nbd_client_connect();
	CU_ASSERT_EQUAL(nbd_client_handshake(fd, "vm1", DISK_SIZE), 0);
	close(fd);
	teardown();
}

static void test_pipelined_large_reads_with_backpressure(void)
{
	const uint32_t len = 8u * 1024 * 1024; /* above the 4 MiB high-water mark */
	uint8_t *pattern = malloc(len), *in = malloc(len);
	uint64_t handles[3];

	CU_ASSERT_FATAL(pattern && in);
	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int fd = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake(fd, "vm1", DISK_SIZE), 0);
	nbd_client_fill_pattern(pattern, len, 4);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_WRITE, 0, 0, len, pattern, NULL), 0);
	/* Three requests before reading any reply: the server must hold back. */
	for (int i = 0; i < 3; i++) {
		handles[i] = nbd_client_next_handle();
		CU_ASSERT_EQUAL(nbd_client_send_request(fd, NBD_CMD_READ, 0, handles[i],
					     (uint64_t)i * 4096, len), 0);
	}
	for (int i = 0; i < 3; i++) {
		memset(in, 0, len);
		CU_ASSERT_EQUAL(nbd_client_recv_reply(fd, handles[i], in, len), 0);
		CU_ASSERT_EQUAL(memcmp(in, pattern + (size_t)i * 4096, len - (size_t)i * 4096), 0);
	}
	CU_ASSERT_EQUAL(stats().bytes_read, 3ULL * len);
	close(fd);
	teardown();
	free(pattern);
	free(in);
}

/*
 * A client that pipelines many reads and reads the replies in another
 * thread, as nbdcopy and QEMU do: while the server's output is over the
 * high-water mark it leaves requests in its input buffer; when one flush
 * then drains all of the output (the client reads as fast as it is
 * written), those requests must still be served although no new input
 * comes: the client sends nothing more until it has their replies.
 */
#define PIPE_REQUESTS 256
#define PIPE_LEN (256u * 1024)

struct pipe_reader {
	int fd;
	unsigned replies;
	atomic_int done;
};

static int recv_all(int fd, uint8_t *p, size_t len)
{
	while (len > 0) {
		ssize_t n = recv(fd, p, len, 0);
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void *pipe_reader_main(void *arg)
{
	struct pipe_reader *r = arg;
	static uint8_t requests[PIPE_REQUESTS][NBD_REQUEST_SIZE];
	uint8_t *data = malloc(NBD_SIMPLE_REPLY_SIZE + PIPE_LEN);

	for (int i = 0; i < PIPE_REQUESTS; i++) {
		store_be32(requests[i], NBD_MAGIC_REQUEST);
		store_be16(requests[i] + 4, 0);
		store_be16(requests[i] + 6, NBD_CMD_READ);
		store_be64(requests[i] + 8, 1000 + (uint64_t)i);
		store_be64(requests[i] + 16, (uint64_t)(i % 8) * PIPE_LEN);
		store_be32(requests[i] + 24, PIPE_LEN);
	}
	/* All requests at once, then only replies: the server must finish. */
	if (data && send(r->fd, requests, sizeof(requests), 0) == (ssize_t)sizeof(requests)) {
		while (r->replies < PIPE_REQUESTS &&
		       recv_all(r->fd, data, NBD_SIMPLE_REPLY_SIZE + PIPE_LEN) == 0 &&
		       load_be32(data) == NBD_MAGIC_SIMPLE_REPLY && load_be32(data + 4) == 0)
			r->replies++;
	}
	free(data);
	atomic_store(&r->done, 1);
	return NULL;
}

static void test_pipelined_reads_with_a_concurrent_reader(void)
{
	struct pipe_reader r = { .fd = -1 };
	struct timeval timeout = { .tv_sec = 20 };
	pthread_t thread;

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	r.fd = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake(r.fd, "vm1", DISK_SIZE), 0);
	/* Blocking from here on, in the reader's thread; the loop runs here. */
	CU_ASSERT_EQUAL(fcntl(r.fd, F_SETFL, fcntl(r.fd, F_GETFL) & ~O_NONBLOCK), 0);
	setsockopt(r.fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
	CU_ASSERT_EQUAL_FATAL(pthread_create(&thread, NULL, pipe_reader_main, &r), 0);
	for (int ms = 0; ms < 20000 && !atomic_load(&r.done); ms++)
		event_loop_run_once(fx.loop, 1);
	pthread_join(thread, NULL);
	CU_ASSERT_EQUAL(r.replies, PIPE_REQUESTS);
	CU_ASSERT_EQUAL(stats().reads, PIPE_REQUESTS);
	close(r.fd);
	teardown();
}

/* ---- structured replies and block status ---------------------------- */

#define OPTION_CAP 512

static uint32_t option_reply(int fd, uint32_t option, uint8_t *data, uint32_t *len)
{
	return nbd_client_recv_option_reply(fd, option, data, OPTION_CAP, len);
}

static void test_meta_context_negotiation(void)
{
	uint8_t greeting[NBD_GREETING_SIZE], payload[256], data[OPTION_CAP];
	const uint8_t flags[] = { 0, 0, 0, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES };
	const char *const alloc[] = { NBD_CONTEXT_BASE_ALLOCATION };
	const char *const wildcard[] = { "base:" };
	const char *const mixed[] = { "x-other:thing", "base:allocation",
				      "base:allocation", "qemu:dirty-bitmap:a" };
	uint32_t len, n;

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int fd = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_recv(fd, greeting, sizeof(greeting)), 0);
	CU_ASSERT_EQUAL(nbd_client_send(fd, flags, sizeof(flags)), 0);
	/* Contexts need structured replies first. */
	n = nbd_client_meta_payload(payload, "vm1", alloc, 1);
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_SET_META_CONTEXT, payload, n), 0);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_SET_META_CONTEXT, data, &len), NBD_REP_ERR_INVALID);
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_LIST_META_CONTEXT, payload, n), 0);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_LIST_META_CONTEXT, data, &len), NBD_REP_ERR_INVALID);
	/* STRUCTURED_REPLY takes no data. */
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_STRUCTURED_REPLY, "x", 1), 0);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_STRUCTURED_REPLY, data, &len), NBD_REP_ERR_INVALID);
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_STRUCTURED_REPLY, NULL, 0), 0);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_STRUCTURED_REPLY, data, &len), NBD_REP_ACK);
	/* LIST without queries lists base:allocation, with the reserved id 0. */
	n = nbd_client_meta_payload(payload, "vm1", NULL, 0);
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_LIST_META_CONTEXT, payload, n), 0);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_LIST_META_CONTEXT, data, &len), NBD_REP_META_CONTEXT);
	CU_ASSERT_EQUAL(len, 4 + 15);
	CU_ASSERT_EQUAL(load_be32(data), 0);
	CU_ASSERT_EQUAL(memcmp(data + 4, "base:allocation", 15), 0);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_LIST_META_CONTEXT, data, &len), NBD_REP_ACK);
	/* "base:" lists it, but selects nothing. */
	n = nbd_client_meta_payload(payload, "vm1", wildcard, 1);
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_LIST_META_CONTEXT, payload, n), 0);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_LIST_META_CONTEXT, data, &len), NBD_REP_META_CONTEXT);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_LIST_META_CONTEXT, data, &len), NBD_REP_ACK);
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_SET_META_CONTEXT, payload, n), 0);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_SET_META_CONTEXT, data, &len), NBD_REP_ACK);
	/* Unknown namespaces are ignored; a repeated name selects once. */
	n = nbd_client_meta_payload(payload, "vm1", mixed, 4);
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_SET_META_CONTEXT, payload, n), 0);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_SET_META_CONTEXT, data, &len), NBD_REP_META_CONTEXT);
	CU_ASSERT_EQUAL(load_be32(data), 1);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_SET_META_CONTEXT, data, &len), NBD_REP_ACK);
	/* Another export's name, and a query running past the payload. */
	n = nbd_client_meta_payload(payload, "other", alloc, 1);
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_SET_META_CONTEXT, payload, n), 0);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_SET_META_CONTEXT, data, &len), NBD_REP_ERR_UNKNOWN);
	n = nbd_client_meta_payload(payload, "vm1", alloc, 1);
	CU_ASSERT_EQUAL(nbd_client_send_option(fd, NBD_OPT_SET_META_CONTEXT, payload, n - 1), 0);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_SET_META_CONTEXT, data, &len), NBD_REP_ERR_INVALID);
	/*
	 * The failed SET cleared the selection (the spec): BLOCK_STATUS is
	 * refused with an error chunk, while READ is answered in chunks.
	 */
	CU_ASSERT_EQUAL(nbd_client_send_go(fd, "vm1"), 0);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_GO, data, &len), NBD_REP_INFO);
	CU_ASSERT_EQUAL(load_be16(data + 10),
			NBD_SERVER_TRANSMISSION_FLAGS | NBD_FLAG_CAN_MULTI_CONN | NBD_FLAG_SEND_DF);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_GO, data, &len), NBD_REP_INFO);
	CU_ASSERT_EQUAL(option_reply(fd, NBD_OPT_GO, data, &len), NBD_REP_ACK);
	uint16_t cflags, type;
	uint64_t h = nbd_client_next_handle();
	CU_ASSERT_EQUAL(nbd_client_send_request(fd, NBD_CMD_BLOCK_STATUS, 0, h, 0, 4096), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_chunk(fd, h, &cflags, &type, data, sizeof(data), &len), 0);
	CU_ASSERT_EQUAL(type, NBD_REPLY_TYPE_ERROR);
	CU_ASSERT_EQUAL(cflags, NBD_REPLY_FLAG_DONE);
	CU_ASSERT_EQUAL(load_be32(data), NBD_EINVAL);
	CU_ASSERT_EQUAL(load_be16(data + 4), len - 6);
	close(fd);
	teardown();
}

#define HZ (NBD_STATE_HOLE | NBD_STATE_ZERO)

static void test_block_status_and_structured_reads(void)
{
	const uint32_t K64 = 64 * 1024, M = 1024 * 1024;
	uint8_t *block = malloc(K64), *in = malloc(K64 + 8);
	uint8_t data[512];
	uint32_t pairs[32], len, error;
	uint16_t cflags, type;

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	nbd_client_fill_pattern(block, K64, 7);
	/* Data at [1 MiB, +64 KiB) and [4 MiB, +128 KiB), behind the server. */
	CU_ASSERT_EQUAL(pwrite(fx.disk_fd, block, K64, M), (ssize_t)K64);
	CU_ASSERT_EQUAL(pwrite(fx.disk_fd, block, K64, 4 * M), (ssize_t)K64);
	CU_ASSERT_EQUAL(pwrite(fx.disk_fd, block, K64, 4 * M + K64), (ssize_t)K64);
	int fd = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake_structured(fd, "vm1", DISK_SIZE,
		NBD_SERVER_TRANSMISSION_FLAGS | NBD_FLAG_CAN_MULTI_CONN, 1), 0);
	/* The whole export: exactly the layout written. */
	const uint32_t want[] = { M, HZ, K64, 0, 3 * M - K64, HZ, 2 * K64, 0,
				  DISK_SIZE - 4 * M - 2 * K64, HZ };
	CU_ASSERT_EQUAL(nbd_client_block_status(fd, 0, 0, DISK_SIZE, pairs, 16, &error), 5);
	CU_ASSERT_EQUAL(memcmp(pairs, want, sizeof(want)), 0);
	/* A range starting inside data, ending inside a hole: clipped. */
	CU_ASSERT_EQUAL(nbd_client_block_status(fd, 0, M + 4096, K64, pairs, 16, &error), 2);
	CU_ASSERT_EQUAL(pairs[0], K64 - 4096);
	CU_ASSERT_EQUAL(pairs[1], 0);
	CU_ASSERT_EQUAL(pairs[2], 4096);
	CU_ASSERT_EQUAL(pairs[3], HZ);
	/* REQ_ONE: one descriptor, no longer than asked. */
	CU_ASSERT_EQUAL(nbd_client_block_status(fd, NBD_CMD_FLAG_REQ_ONE, 0, DISK_SIZE, pairs, 16,
						&error), 1);
	CU_ASSERT_EQUAL(pairs[0], M);
	CU_ASSERT_EQUAL(pairs[1], HZ);
	CU_ASSERT_EQUAL(nbd_client_block_status(fd, NBD_CMD_FLAG_REQ_ONE, 4 * M, 4096, pairs, 16,
						&error), 1);
	CU_ASSERT_EQUAL(pairs[0], 4096);
	CU_ASSERT_EQUAL(pairs[1], 0);
	/* A trim punches a hole that the next status shows. */
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_TRIM, 0, 4 * M, K64, NULL, NULL), 0);
	CU_ASSERT_EQUAL(nbd_client_block_status(fd, 0, 4 * M, 2 * K64, pairs, 16, &error), 2);
	CU_ASSERT_EQUAL(pairs[0], K64);
	CU_ASSERT_EQUAL(pairs[1], HZ);
	CU_ASSERT_EQUAL(pairs[3], 0);
	/* Beyond the end: an error chunk with EINVAL. */
	uint64_t h = nbd_client_next_handle();
	CU_ASSERT_EQUAL(nbd_client_send_request(fd, NBD_CMD_BLOCK_STATUS, 0, h,
						DISK_SIZE - 512, 1024), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_chunk(fd, h, &cflags, &type, data, sizeof(data), &len), 0);
	CU_ASSERT_EQUAL(type, NBD_REPLY_TYPE_ERROR);
	CU_ASSERT_EQUAL(load_be32(data), NBD_EINVAL);
	/* READ: one OFFSET_DATA chunk, DF accepted. */
	h = nbd_client_next_handle();
	CU_ASSERT_EQUAL(nbd_client_send_request(fd, NBD_CMD_READ, NBD_CMD_FLAG_DF, h, M, K64), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_chunk(fd, h, &cflags, &type, in, K64 + 8, &len), 0);
	CU_ASSERT_EQUAL(cflags, NBD_REPLY_FLAG_DONE);
	CU_ASSERT_EQUAL(type, NBD_REPLY_TYPE_OFFSET_DATA);
	CU_ASSERT_EQUAL(len, K64 + 8);
	CU_ASSERT_EQUAL(load_be64(in), M);
	CU_ASSERT_EQUAL(memcmp(in + 8, block, K64), 0);
	/* Even a read refused early gets an error chunk, never a simple reply. */
	h = nbd_client_next_handle();
	CU_ASSERT_EQUAL(nbd_client_send_request(fd, NBD_CMD_READ, 0, h, DISK_SIZE, 512), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_chunk(fd, h, &cflags, &type, data, sizeof(data), &len), 0);
	CU_ASSERT_EQUAL(type, NBD_REPLY_TYPE_ERROR);
	CU_ASSERT_EQUAL(cflags, NBD_REPLY_FLAG_DONE);
	CU_ASSERT_EQUAL(load_be32(data), NBD_EINVAL);
	/* Other successes stay simple replies, as the spec allows. */
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_FLUSH, 0, 0, 0, NULL, NULL), 0);
	CU_ASSERT_EQUAL(stats().block_status, 5);
	close(fd);
	teardown();
	free(block);
	free(in);
}

static int quiet_logs(void)
{
	/* Protocol errors are provoked on purpose: keep the output readable. */
	return log_open(NULL, LOG_ERROR);
}

static int restore_logs(void)
{
	return log_open(NULL, LOG_INFO);
}

int register_nbd_server_tests(void)
{
	CU_pSuite suite = CU_add_suite("nbd_server", quiet_logs, restore_logs);

	if (!suite ||
	    !CU_add_test(suite, "handshake with OPT_GO", test_handshake_go) ||
	    !CU_add_test(suite, "handshake errors, EXPORT_NAME", test_handshake_errors_and_export_name) ||
	    !CU_add_test(suite, "write, read, flush, trim", test_write_read_flush_trim) ||
	    !CU_add_test(suite, "a flush's reply is not overtaken", test_flush_replies_in_order) ||
	    !CU_add_test(suite, "a batch keeps its order", test_a_batch_keeps_its_order) ||
	    !CU_add_test(suite, "a closed connection finishes its batch",
			 test_a_closed_connection_finishes_its_batch) ||
	    !CU_add_test(suite, "out of range gets an error reply", test_out_of_range_gets_error_reply) ||
	    !CU_add_test(suite, "bad magic closes only that connection", test_bad_magic_closes_only_that_connection) ||
	    !CU_add_test(suite, "peer vanishes mid-write", test_peer_vanishes_mid_write) ||
	    !CU_add_test(suite, "pipelined large reads, backpressure", test_pipelined_large_reads_with_backpressure) ||
	    !CU_add_test(suite, "pipelined reads, a concurrent reader",
			 test_pipelined_reads_with_a_concurrent_reader) ||
	    !CU_add_test(suite, "meta context negotiation", test_meta_context_negotiation) ||
	    !CU_add_test(suite, "block status, structured reads", test_block_status_and_structured_reads))
		return -1;
	return 0;
}

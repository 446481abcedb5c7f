/*
 * The NBD server end to end: a real export on a temporary unix socket and
 * disk image, driven by a minimal in-test client.  Client and server share
 * this thread, so every client wait runs the event loop step by step.
 */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "event_loop.h"
#include "log.h"
#include "nbd_proto.h"
#include "nbd_server.h"
#include "suites.h"

#define DISK_SIZE (16u * 1024 * 1024)
/* Without progress for this long, a client wait fails (valgrind is slow). */
#define WAIT_MS 10000

static struct {
	event_loop *loop;
	char dir[64];
	char socket_path[128];
	char disk_path[128];
	int disk_fd; /* to check the image behind the server's back */
	struct nbd_export *export;
} fx;

static uint64_t next_handle = 1;

static int setup(void)
{
	memset(&fx, 0, sizeof(fx));
	strcpy(fx.dir, "/tmp/remusdbd-nbd-test-XXXXXX");
	if (!mkdtemp(fx.dir))
		return -1;
	snprintf(fx.socket_path, sizeof(fx.socket_path), "%s/nbd.sock", fx.dir);
	snprintf(fx.disk_path, sizeof(fx.disk_path), "%s/disk.img", fx.dir);
	fx.disk_fd = open(fx.disk_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fx.disk_fd < 0 || ftruncate(fx.disk_fd, DISK_SIZE) < 0)
		return -1;
	fx.loop = event_loop_create();
	fx.export = nbd_export_create(fx.loop, "vm1", fx.socket_path, fx.disk_path);
	return fx.export ? 0 : -1;
}

static void teardown(void)
{
	nbd_export_destroy(fx.export);
	event_loop_destroy(fx.loop);
	close(fx.disk_fd);
	unlink(fx.disk_path);
	unlink(fx.socket_path);
	rmdir(fx.dir);
}

static struct nbd_export_stats stats(void)
{
	struct nbd_export_stats s;

	nbd_export_get_stats(fx.export, &s);
	return s;
}

static int client_connect(void)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	strcpy(addr.sun_path, fx.socket_path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

static void pump(int ms)
{
	int64_t end = monotonic_ms() + ms;

	do
		event_loop_run_once(fx.loop, 1);
	while (monotonic_ms() < end);
}

static int client_send(int fd, const void *data, size_t len)
{
	const uint8_t *p = data;
	int64_t deadline = monotonic_ms() + WAIT_MS;

	while (len > 0) {
		ssize_t n = send(fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			deadline = monotonic_ms() + WAIT_MS;
			continue;
		}
		if (n < 0 && errno != EAGAIN)
			return -1;
		if (monotonic_ms() > deadline)
			return -1;
		event_loop_run_once(fx.loop, 10);
	}
	return 0;
}

/* Receives exactly len bytes; -1 on EOF, error or timeout. */
static int client_recv(int fd, void *out, size_t len)
{
	uint8_t *p = out;
	int64_t deadline = monotonic_ms() + WAIT_MS;

	while (len > 0) {
		ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			deadline = monotonic_ms() + WAIT_MS;
			continue;
		}
		if (n == 0 || errno != EAGAIN || monotonic_ms() > deadline)
			return -1;
		event_loop_run_once(fx.loop, 10);
	}
	return 0;
}

/* 1 once the server has closed fd's peer, 0 if it stays open. */
static int client_sees_eof(int fd)
{
	int64_t deadline = monotonic_ms() + WAIT_MS;
	uint8_t byte;

	while (monotonic_ms() < deadline) {
		ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN))
			return 1;
		event_loop_run_once(fx.loop, 10);
	}
	return 0;
}

static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static uint32_t get_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t get_be64(const uint8_t *p)
{
	return (uint64_t)get_be32(p) << 32 | get_be32(p + 4);
}

static int send_option(int fd, uint32_t option, const void *data, uint32_t len)
{
	uint8_t header[NBD_OPTION_HEADER_SIZE];

	memcpy(header, "IHAVEOPT", 8);
	put_be32(header + 8, option);
	put_be32(header + 12, len);
	if (client_send(fd, header, sizeof(header)) < 0)
		return -1;
	return len ? client_send(fd, data, len) : 0;
}

/* Reads one option reply; returns its type, payload copied to data. */
static uint32_t recv_option_reply(int fd, uint32_t option, uint8_t *data,
				  uint32_t cap, uint32_t *len)
{
	uint8_t header[NBD_OPTION_REPLY_HEADER_SIZE];

	if (client_recv(fd, header, sizeof(header)) < 0)
		return 0;
	CU_ASSERT_EQUAL(get_be64(header), NBD_MAGIC_OPTION_REPLY);
	CU_ASSERT_EQUAL(get_be32(header + 8), option);
	*len = get_be32(header + 16);
	if (*len > cap || client_recv(fd, data, *len) < 0)
		return 0;
	return get_be32(header + 12);
}

static int send_go(int fd, const char *name)
{
	uint8_t data[64];
	uint32_t name_len = (uint32_t)strlen(name);

	put_be32(data, name_len);
	memcpy(data + 4, name, name_len);
	/* One info request: NBD_INFO_BLOCK_SIZE, as QEMU sends. */
	const uint8_t tail[] = { 0, 1, 0, NBD_INFO_BLOCK_SIZE };
	memcpy(data + 4 + name_len, tail, sizeof(tail));
	return send_option(fd, NBD_OPT_GO, data, 4 + name_len + sizeof(tail));
}

/* The handshake QEMU 7.2 performs.  Returns 0 with fd in transmission. */
static int handshake(int fd, const char *name)
{
	uint8_t greeting[NBD_GREETING_SIZE], expected[NBD_GREETING_SIZE];
	const uint8_t flags[] = { 0, 0, 0, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES };
	uint8_t data[256];
	uint32_t len;

	nbd_encode_greeting(expected);
	if (client_recv(fd, greeting, sizeof(greeting)) < 0 ||
	    memcmp(greeting, expected, sizeof(greeting)) != 0)
		return -1;
	if (client_send(fd, flags, sizeof(flags)) < 0 ||
	    send_option(fd, NBD_OPT_STRUCTURED_REPLY, NULL, 0) < 0)
		return -1;
	if (recv_option_reply(fd, NBD_OPT_STRUCTURED_REPLY, data, sizeof(data), &len) !=
	    NBD_REP_ERR_UNSUP)
		return -1;
	if (send_go(fd, name) < 0)
		return -1;
	/* INFO_EXPORT, INFO_BLOCK_SIZE (requested), then ACK. */
	if (recv_option_reply(fd, NBD_OPT_GO, data, sizeof(data), &len) != NBD_REP_INFO ||
	    len != NBD_INFO_EXPORT_SIZE || data[1] != NBD_INFO_EXPORT ||
	    get_be64(data + 2) != DISK_SIZE ||
	    ((data[10] << 8) | data[11]) != NBD_SERVER_TRANSMISSION_FLAGS)
		return -1;
	if (recv_option_reply(fd, NBD_OPT_GO, data, sizeof(data), &len) != NBD_REP_INFO ||
	    len != NBD_INFO_BLOCK_SIZE_SIZE || data[1] != NBD_INFO_BLOCK_SIZE ||
	    get_be32(data + 2) != 1 || get_be32(data + 10) != NBD_MAX_PAYLOAD)
		return -1;
	if (recv_option_reply(fd, NBD_OPT_GO, data, sizeof(data), &len) != NBD_REP_ACK ||
	    len != 0)
		return -1;
	return 0;
}

static int send_request(int fd, uint16_t type, uint16_t flags, uint64_t handle,
			uint64_t offset, uint32_t length)
{
	uint8_t req[NBD_REQUEST_SIZE];

	put_be32(req, NBD_MAGIC_REQUEST);
	req[4] = flags >> 8; req[5] = (uint8_t)flags;
	req[6] = type >> 8; req[7] = (uint8_t)type;
	put_be32(req + 8, (uint32_t)(handle >> 32));
	put_be32(req + 12, (uint32_t)handle);
	put_be32(req + 16, (uint32_t)(offset >> 32));
	put_be32(req + 20, (uint32_t)offset);
	put_be32(req + 24, length);
	return client_send(fd, req, sizeof(req));
}

/* Reads a simple reply for handle; returns its error, or -1 on failure. */
static int64_t recv_reply(int fd, uint64_t handle, void *data, uint32_t len)
{
	uint8_t reply[NBD_SIMPLE_REPLY_SIZE];

	if (client_recv(fd, reply, sizeof(reply)) < 0)
		return -1;
	CU_ASSERT_EQUAL(get_be32(reply), NBD_MAGIC_SIMPLE_REPLY);
	CU_ASSERT_EQUAL(get_be64(reply + 8), handle);
	uint32_t error = get_be32(reply + 4);
	if (error == 0 && data && client_recv(fd, data, len) < 0)
		return -1;
	return error;
}

/* One request, one reply.  Returns the NBD error or -1. */
static int64_t transact(int fd, uint16_t type, uint16_t flags, uint64_t offset,
			uint32_t length, const void *payload, void *read_out)
{
	uint64_t handle = next_handle++;

	if (send_request(fd, type, flags, handle, offset, length) < 0)
		return -1;
	if (payload && client_send(fd, payload, length) < 0)
		return -1;
	return recv_reply(fd, handle, read_out, length);
}

static void fill_pattern(uint8_t *p, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)(i * 7 + seed + (i >> 12));
}

static void test_handshake_go(void)
{
	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int fd = client_connect();
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(handshake(fd, "vm1"), 0);
	CU_ASSERT_EQUAL(stats().connections_current, 1);
	CU_ASSERT_EQUAL(stats().connections_total, 1);
	int fd2 = client_connect();
	CU_ASSERT_EQUAL(handshake(fd2, ""), 0); /* the default export */
	CU_ASSERT_EQUAL(stats().connections_current, 2);
	close(fd);
	close(fd2);
	pump(20);
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
	int fd = client_connect();
	CU_ASSERT_EQUAL_FATAL(client_recv(fd, greeting, sizeof(greeting)), 0);
	CU_ASSERT_EQUAL(client_send(fd, fixed_only, 4), 0);
	/* Unknown export: an error reply, the connection stays usable. */
	CU_ASSERT_EQUAL(send_go(fd, "nosuch"), 0);
	CU_ASSERT_EQUAL(recv_option_reply(fd, NBD_OPT_GO, data, sizeof(data), &len),
			NBD_REP_ERR_UNKNOWN);
	/* Malformed GO payload. */
	CU_ASSERT_EQUAL(send_option(fd, NBD_OPT_GO, "\0\0\0\x09vm1\0\0", 9), 0);
	CU_ASSERT_EQUAL(recv_option_reply(fd, NBD_OPT_GO, data, sizeof(data), &len),
			NBD_REP_ERR_INVALID);
	/* An option we do not know. */
	CU_ASSERT_EQUAL(send_option(fd, 0x4242, "xyz", 3), 0);
	CU_ASSERT_EQUAL(recv_option_reply(fd, 0x4242, data, sizeof(data), &len),
			NBD_REP_ERR_UNSUP);
	/* LIST names our export. */
	CU_ASSERT_EQUAL(send_option(fd, NBD_OPT_LIST, NULL, 0), 0);
	CU_ASSERT_EQUAL(recv_option_reply(fd, NBD_OPT_LIST, data, sizeof(data), &len),
			NBD_REP_SERVER);
	CU_ASSERT_EQUAL(len, 7);
	CU_ASSERT_EQUAL(memcmp(data, "\0\0\0\x03vm1", 7), 0);
	CU_ASSERT_EQUAL(recv_option_reply(fd, NBD_OPT_LIST, data, sizeof(data), &len),
			NBD_REP_ACK);
	/* EXPORT_NAME without NO_ZEROES: size, flags and 124 zero bytes. */
	CU_ASSERT_EQUAL(send_option(fd, NBD_OPT_EXPORT_NAME, "vm1", 3), 0);
	CU_ASSERT_EQUAL_FATAL(client_recv(fd, reply, sizeof(reply)), 0);
	CU_ASSERT_EQUAL(get_be64(reply), DISK_SIZE);
	CU_ASSERT_EQUAL((reply[8] << 8) | reply[9], NBD_SERVER_TRANSMISSION_FLAGS);
	CU_ASSERT_EQUAL(reply[133], 0);
	/* Now in transmission. */
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_FLUSH, 0, 0, 0, NULL, NULL), 0);
	close(fd);

	/* EXPORT_NAME for an unknown export can only be answered by closing. */
	fd = client_connect();
	CU_ASSERT_EQUAL(client_recv(fd, greeting, sizeof(greeting)), 0);
	CU_ASSERT_EQUAL(client_send(fd, fixed_only, 4), 0);
	CU_ASSERT_EQUAL(send_option(fd, NBD_OPT_EXPORT_NAME, "other", 5), 0);
	CU_ASSERT_EQUAL(client_sees_eof(fd), 1);
	close(fd);

	/* Bad option magic closes; so do unknown client flags. */
	fd = client_connect();
	CU_ASSERT_EQUAL(client_recv(fd, greeting, sizeof(greeting)), 0);
	CU_ASSERT_EQUAL(client_send(fd, fixed_only, 4), 0);
	CU_ASSERT_EQUAL(client_send(fd, "IHAVEOPXxxxxxxxx", 16), 0);
	CU_ASSERT_EQUAL(client_sees_eof(fd), 1);
	close(fd);
	fd = client_connect();
	CU_ASSERT_EQUAL(client_recv(fd, greeting, sizeof(greeting)), 0);
	CU_ASSERT_EQUAL(client_send(fd, "\0\0\x01\x01", 4), 0);
	CU_ASSERT_EQUAL(client_sees_eof(fd), 1);
	close(fd);

	/* ABORT is acknowledged, then the server closes. */
	fd = client_connect();
	CU_ASSERT_EQUAL(client_recv(fd, greeting, sizeof(greeting)), 0);
	CU_ASSERT_EQUAL(client_send(fd, fixed_only, 4), 0);
	CU_ASSERT_EQUAL(send_option(fd, NBD_OPT_ABORT, NULL, 0), 0);
	CU_ASSERT_EQUAL(recv_option_reply(fd, NBD_OPT_ABORT, data, sizeof(data), &len),
			NBD_REP_ACK);
	CU_ASSERT_EQUAL(client_sees_eof(fd), 1);
	close(fd);
	pump(20);
	CU_ASSERT_EQUAL(stats().connections_current, 0);
	teardown();
}

static void test_write_read_flush_trim(void)
{
	uint8_t out[8192], in[8192], on_disk[8192], zeros[8192] = { 0 };

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int fd = client_connect();
	CU_ASSERT_EQUAL_FATAL(handshake(fd, "vm1"), 0);

	fill_pattern(out, sizeof(out), 1);
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_WRITE, 0, 65536, sizeof(out), out, NULL), 0);
	/* Acknowledged means it is in the file (page cache) already. */
	CU_ASSERT_EQUAL(pread(fx.disk_fd, on_disk, sizeof(on_disk), 65536), (ssize_t)sizeof(on_disk));
	CU_ASSERT_EQUAL(memcmp(on_disk, out, sizeof(out)), 0);
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_READ, 0, 65536, sizeof(in), NULL, in), 0);
	CU_ASSERT_EQUAL(memcmp(in, out, sizeof(out)), 0);
	/* Unaligned read straddling written and unwritten bytes. */
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_READ, 0, 65536 + 8000, 1000, NULL, in), 0);
	CU_ASSERT_EQUAL(memcmp(in, out + 8000, 192), 0);
	CU_ASSERT_EQUAL(memcmp(in + 192, zeros, 808), 0);

	fill_pattern(out, 4096, 2);
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, DISK_SIZE - 4096,
				 4096, out, NULL), 0);
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_FLUSH, 0, 0, 0, NULL, NULL), 0);
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_TRIM, 0, 65536, 4096, NULL, NULL), 0);
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_WRITE_ZEROES, 0, 65536 + 4096, 4096, NULL, NULL), 0);
	CU_ASSERT_EQUAL(pread(fx.disk_fd, on_disk, 4096, 65536 + 4096), 4096);
	CU_ASSERT_EQUAL(memcmp(on_disk, zeros, 4096), 0);
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_NO_HOLE, 0, 512,
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
	CU_ASSERT_EQUAL(send_request(fd, NBD_CMD_DISC, 0, 99, 0, 0), 0);
	CU_ASSERT_EQUAL(client_sees_eof(fd), 1);
	close(fd);
	teardown();
}

static void test_out_of_range_gets_error_reply(void)
{
	uint8_t buf[4096] = { 1 };

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int fd = client_connect();
	CU_ASSERT_EQUAL_FATAL(handshake(fd, "vm1"), 0);
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_READ, 0, DISK_SIZE, 512, NULL, buf), NBD_EINVAL);
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_READ, 0, DISK_SIZE - 511, 512, NULL, buf), NBD_EINVAL);
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_READ, 0, UINT64_MAX - 100, 512, NULL, buf), NBD_EINVAL);
	/* A write past the end: its payload is consumed, then ENOSPC. */
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_WRITE, 0, DISK_SIZE - 100, sizeof(buf), buf, NULL),
			NBD_ENOSPC);
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_TRIM, 0, DISK_SIZE, 1, NULL, NULL), NBD_EINVAL);
	/* Unknown command and bad flags: EINVAL, connection kept. */
	CU_ASSERT_EQUAL(transact(fd, 42, 0, 0, 0, NULL, NULL), NBD_EINVAL);
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 512, NULL, buf), NBD_EINVAL);
	/* Still in sync: a valid request works. */
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_READ, 0, DISK_SIZE - 512, 512, NULL, buf), 0);
	CU_ASSERT_EQUAL(stats().errors, 7);
	CU_ASSERT_EQUAL(stats().connections_current, 1);
	close(fd);
	teardown();
}

static void test_bad_magic_closes_only_that_connection(void)
{
	uint8_t buf[512];

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int good = client_connect();
	int bad = client_connect();
	CU_ASSERT_EQUAL_FATAL(handshake(good, "vm1"), 0);
	CU_ASSERT_EQUAL_FATAL(handshake(bad, "vm1"), 0);
	CU_ASSERT_EQUAL(stats().connections_current, 2);
	const uint8_t garbage[NBD_REQUEST_SIZE] = { 0xde, 0xad, 0xbe, 0xef };
	CU_ASSERT_EQUAL(client_send(bad, garbage, sizeof(garbage)), 0);
	CU_ASSERT_EQUAL(client_sees_eof(bad), 1);
	CU_ASSERT_EQUAL(stats().connections_current, 1);
	CU_ASSERT_EQUAL(stats().errors, 1);
	CU_ASSERT_EQUAL(transact(good, NBD_CMD_READ, 0, 0, sizeof(buf), NULL, buf), 0);
	close(bad);

	/* An oversized write cannot be skipped: closed as well. */
	bad = client_connect();
	CU_ASSERT_EQUAL_FATAL(handshake(bad, "vm1"), 0);
	CU_ASSERT_EQUAL(send_request(bad, NBD_CMD_WRITE, 0, 5, 0, NBD_MAX_PAYLOAD + 1), 0);
	CU_ASSERT_EQUAL(client_sees_eof(bad), 1);
	CU_ASSERT_EQUAL(transact(good, NBD_CMD_FLUSH, 0, 0, 0, NULL, NULL), 0);
	close(bad);
	close(good);
	teardown();
}

static void test_peer_vanishes_mid_write(void)
{
	uint8_t first[4096], partial[1000], on_disk[4096], zeros[4096] = { 0 };

	CU_ASSERT_EQUAL_FATAL(setup(), 0);
	int fd = client_connect();
	CU_ASSERT_EQUAL_FATAL(handshake(fd, "vm1"), 0);
	fill_pattern(first, sizeof(first), 3);
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_WRITE, 0, 0, sizeof(first), first, NULL), 0);
	/* Header of a 4 KiB write, 1000 bytes of payload, then gone. */
	memset(partial, 0xee, sizeof(partial));
	CU_ASSERT_EQUAL(send_request(fd, NBD_CMD_WRITE, 0, 77, 8192, 4096), 0);
	CU_ASSERT_EQUAL(client_send(fd, partial, sizeof(partial)), 0);
	pump(20);
	close(fd);
	pump(50);
	CU_ASSERT_EQUAL(stats().connections_current, 0);
	CU_ASSERT_EQUAL(stats().writes, 1);
	CU_ASSERT_EQUAL(stats().errors, 1);
	/* The acknowledged write is on disk; the torn one was never applied. */
	CU_ASSERT_EQUAL(pread(fx.disk_fd, on_disk, sizeof(on_disk), 0), 4096);
	CU_ASSERT_EQUAL(memcmp(on_disk, first, sizeof(first)), 0);
	CU_ASSERT_EQUAL(pread(fx.disk_fd, on_disk, sizeof(on_disk), 8192), 4096);
	CU_ASSERT_EQUAL(memcmp(on_disk, zeros, sizeof(zeros)), 0);
	/* The export still accepts new clients. */
	fd = client_connect();
	CU_ASSERT_EQUAL(handshake(fd, "vm1"), 0);
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
	int fd = client_connect();
	CU_ASSERT_EQUAL_FATAL(handshake(fd, "vm1"), 0);
	fill_pattern(pattern, len, 4);
	CU_ASSERT_EQUAL(transact(fd, NBD_CMD_WRITE, 0, 0, len, pattern, NULL), 0);
	/* Three requests before reading any reply: the server must hold back. */
	for (int i = 0; i < 3; i++) {
		handles[i] = next_handle++;
		CU_ASSERT_EQUAL(send_request(fd, NBD_CMD_READ, 0, handles[i],
					     (uint64_t)i * 4096, len), 0);
	}
	for (int i = 0; i < 3; i++) {
		memset(in, 0, len);
		CU_ASSERT_EQUAL(recv_reply(fd, handles[i], in, len), 0);
		CU_ASSERT_EQUAL(memcmp(in, pattern + (size_t)i * 4096, len - (size_t)i * 4096), 0);
	}
	CU_ASSERT_EQUAL(stats().bytes_read, 3ULL * len);
	close(fd);
	teardown();
	free(pattern);
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
	    !CU_add_test(suite, "out of range gets an error reply", test_out_of_range_gets_error_reply) ||
	    !CU_add_test(suite, "bad magic closes only that connection", test_bad_magic_closes_only_that_connection) ||
	    !CU_add_test(suite, "peer vanishes mid-write", test_peer_vanishes_mid_write) ||
	    !CU_add_test(suite, "pipelined large reads, backpressure", test_pipelined_large_reads_with_backpressure))
		return -1;
	return 0;
}

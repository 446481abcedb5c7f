/* The unit tests' NBD client (nbd_test_client.h). */
#include "nbd_test_client.h"

#include <CUnit/CUnit.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/be.h"
#include "nbd/nbd_proto.h"
#include "nbd/nbd_server.h"

/* Without progress for this long, a client wait fails (valgrind is slow). */
#define WAIT_MS 10000

static event_loop *loop;
static const char *socket_path;
static uint64_t next_handle = 1;

int nbd_fixture_setup(struct nbd_fixture *fx, uint64_t disk_size)
{
	memset(fx, 0, sizeof(*fx));
	fx->disk_fd = -1;
	strcpy(fx->dir, "/tmp/remusdbd-nbd-test-XXXXXX");
	if (!mkdtemp(fx->dir))
		return -1;
	snprintf(fx->socket_path, sizeof(fx->socket_path), "%s/nbd.sock", fx->dir);
	snprintf(fx->disk_path, sizeof(fx->disk_path), "%s/disk.img", fx->dir);
	fx->disk_fd = open(fx->disk_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fx->disk_fd < 0 || ftruncate(fx->disk_fd, (off_t)disk_size) < 0)
		return -1;
	fx->loop = event_loop_create();
	fx->export = nbd_export_create(fx->loop, "vm1", fx->socket_path, fx->disk_path);
	nbd_client_use(fx->loop, fx->socket_path);
	return fx->export ? 0 : -1;
}

void nbd_fixture_teardown(struct nbd_fixture *fx)
{
	nbd_export_destroy(fx->export);
	event_loop_destroy(fx->loop);
	if (fx->disk_fd >= 0)
		close(fx->disk_fd);
	unlink(fx->disk_path);
	unlink(fx->socket_path);
	rmdir(fx->dir);
}

void nbd_client_use(event_loop *l, const char *path)
{
	loop = l;
	socket_path = path;
}

int nbd_client_connect(void)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	strcpy(addr.sun_path, socket_path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

int nbd_client_connect_tcp(uint16_t port)
{
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons(port),
				    .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	/* Blocking connect: the listener's backlog completes it at once. */
	if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
	    fcntl(fd, F_SETFL, O_NONBLOCK) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

void nbd_client_pump(int ms)
{
	int64_t end = monotonic_ms() + ms;

	do
		event_loop_run_once(loop, 1);
	while (monotonic_ms() < end);
}

int nbd_client_send(int fd, const void *data, size_t len)
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
		event_loop_run_once(loop, 10);
	}
	return 0;
}

int nbd_client_recv(int fd, void *out, size_t len)
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
		event_loop_run_once(loop, 10);
	}
	return 0;
}

int nbd_client_sees_eof(int fd)
{
	int64_t deadline = monotonic_ms() + WAIT_MS;
	uint8_t byte;

	while (monotonic_ms() < deadline) {
		ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN))
			return 1;
		event_loop_run_once(loop, 10);
	}
	return 0;
}

int nbd_client_send_option(int fd, uint32_t option, const void *data, uint32_t len)
{
	uint8_t header[NBD_OPTION_HEADER_SIZE];

	memcpy(header, "IHAVEOPT", 8);
	store_be32(header + 8, option);
	store_be32(header + 12, len);
	if (nbd_client_send(fd, header, sizeof(header)) < 0)
		return -1;
	return len ? nbd_client_send(fd, data, len) : 0;
}

uint32_t nbd_client_recv_option_reply(int fd, uint32_t option, uint8_t *data,
				      uint32_t cap, uint32_t *len)
{
	uint8_t header[NBD_OPTION_REPLY_HEADER_SIZE];

	if (nbd_client_recv(fd, header, sizeof(header)) < 0)
		return 0;
	CU_ASSERT_EQUAL(load_be64(header), NBD_MAGIC_OPTION_REPLY);
	CU_ASSERT_EQUAL(load_be32(header + 8), option);
	*len = load_be32(header + 16);
	if (*len > cap || nbd_client_recv(fd, data, *len) < 0)
		return 0;
	return load_be32(header + 12);
}

int nbd_client_send_go(int fd, const char *name)
{
	uint8_t data[64];
	uint32_t name_len = (uint32_t)strlen(name);

	store_be32(data, name_len);
	memcpy(data + 4, name, name_len);
	/* One info request: NBD_INFO_BLOCK_SIZE, as QEMU sends. */
	const uint8_t tail[] = { 0, 1, 0, NBD_INFO_BLOCK_SIZE };
	memcpy(data + 4 + name_len, tail, sizeof(tail));
	return nbd_client_send_option(fd, NBD_OPT_GO, data, 4 + name_len + sizeof(tail));
}

int nbd_client_handshake(int fd, const char *name, uint64_t disk_size)
{
	return nbd_client_handshake_flags(fd, name, disk_size,
					  NBD_SERVER_TRANSMISSION_FLAGS |
					  NBD_FLAG_CAN_MULTI_CONN);
}

static int nbd_client_go(int fd, const char *name, uint64_t disk_size,
			 uint16_t transmission_flags);

int nbd_client_handshake_flags(int fd, const char *name, uint64_t disk_size,
			       uint16_t transmission_flags)
{
	uint8_t greeting[NBD_GREETING_SIZE], expected[NBD_GREETING_SIZE];
	const uint8_t flags[] = { 0, 0, 0, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES };

	nbd_encode_greeting(expected);
	if (nbd_client_recv(fd, greeting, sizeof(greeting)) < 0 ||
	    memcmp(greeting, expected, sizeof(greeting)) != 0)
		return -1;
	if (nbd_client_send(fd, flags, sizeof(flags)) < 0)
		return -1;
	return nbd_client_go(fd, name, disk_size, transmission_flags);
}

uint32_t nbd_client_meta_payload(uint8_t *out, const char *name,
				 const char *const *queries, unsigned count)
{
	uint32_t n = (uint32_t)strlen(name), pos = 0;

	store_be32(out, n);
	memcpy(out + 4, name, n);
	pos = 4 + n;
	store_be32(out + pos, count);
	pos += 4;
	for (unsigned i = 0; i < count; i++) {
		uint32_t q = (uint32_t)strlen(queries[i]);
		store_be32(out + pos, q);
		memcpy(out + pos + 4, queries[i], q);
		pos += 4 + q;
	}
	return pos;
}

int nbd_client_handshake_structured(int fd, const char *name, uint64_t disk_size,
				    uint16_t transmission_flags, int meta)
{
	uint8_t greeting[NBD_GREETING_SIZE];
	const uint8_t flags[] = { 0, 0, 0, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES };
	const char *const query[] = { NBD_CONTEXT_BASE_ALLOCATION };
	uint8_t data[256];
	uint32_t len;

	if (nbd_client_recv(fd, greeting, sizeof(greeting)) < 0 ||
	    nbd_client_send(fd, flags, sizeof(flags)) < 0 ||
	    nbd_client_send_option(fd, NBD_OPT_STRUCTURED_REPLY, NULL, 0) < 0)
		return -1;
	if (nbd_client_recv_option_reply(fd, NBD_OPT_STRUCTURED_REPLY, data,
					 sizeof(data), &len) != NBD_REP_ACK)
		return -1;
	if (meta) {
		len = nbd_client_meta_payload(data, name, query, 1);
		if (nbd_client_send_option(fd, NBD_OPT_SET_META_CONTEXT, data, len) < 0)
			return -1;
		if (nbd_client_recv_option_reply(fd, NBD_OPT_SET_META_CONTEXT, data,
						 sizeof(data), &len) != NBD_REP_META_CONTEXT ||
		    len != 4 + strlen(query[0]) || load_be32(data) != 1 ||
		    memcmp(data + 4, query[0], len - 4) != 0)
			return -1;
		if (nbd_client_recv_option_reply(fd, NBD_OPT_SET_META_CONTEXT, data,
						 sizeof(data), &len) != NBD_REP_ACK)
			return -1;
	}
	return nbd_client_go(fd, name, disk_size, transmission_flags | NBD_FLAG_SEND_DF);
}

static int nbd_client_go(int fd, const char *name, uint64_t disk_size,
			 uint16_t transmission_flags)
{
	uint8_t data[256];
	uint32_t len;

	if (nbd_client_send_go(fd, name) < 0)
		return -1;
	/* INFO_EXPORT, INFO_BLOCK_SIZE (requested), then ACK. */
	if (nbd_client_recv_option_reply(fd, NBD_OPT_GO, data, sizeof(data), &len) != NBD_REP_INFO ||
	    len != NBD_INFO_EXPORT_SIZE || data[1] != NBD_INFO_EXPORT ||
	    load_be64(data + 2) != disk_size ||
	    load_be16(data + 10) != transmission_flags)
		return -1;
	if (nbd_client_recv_option_reply(fd, NBD_OPT_GO, data, sizeof(data), &len) != NBD_REP_INFO ||
	    len != NBD_INFO_BLOCK_SIZE_SIZE || data[1] != NBD_INFO_BLOCK_SIZE ||
	    load_be32(data + 2) != 1 || load_be32(data + 10) != NBD_MAX_PAYLOAD)
		return -1;
	if (nbd_client_recv_option_reply(fd, NBD_OPT_GO, data, sizeof(data), &len) != NBD_REP_ACK ||
	    len != 0)
		return -1;
	return 0;
}

uint64_t nbd_client_next_handle(void)
{
	return next_handle++;
}

int nbd_client_send_request(int fd, uint16_t type, uint16_t flags, uint64_t handle,
			    uint64_t offset, uint32_t length)
{
	uint8_t req[NBD_REQUEST_SIZE];

	store_be32(req, NBD_MAGIC_REQUEST);
	store_be16(req + 4, flags);
	store_be16(req + 6, type);
	store_be64(req + 8, handle);
	store_be64(req + 16, offset);
	store_be32(req + 24, length);
	return nbd_client_send(fd, req, sizeof(req));
}

int64_t nbd_client_recv_reply(int fd, uint64_t handle, void *data, uint32_t len)
{
	uint8_t reply[NBD_SIMPLE_REPLY_SIZE];

	if (nbd_client_recv(fd, reply, sizeof(reply)) < 0)
		return -1;
	CU_ASSERT_EQUAL(load_be32(reply), NBD_MAGIC_SIMPLE_REPLY);
	CU_ASSERT_EQUAL(load_be64(reply + 8), handle);
	uint32_t error = load_be32(reply + 4);
	if (error == 0 && data && nbd_client_recv(fd, data, len) < 0)
		return -1;
	return error;
}

int64_t nbd_client_transact(int fd, uint16_t type, uint16_t flags, uint64_t offset,
			    uint32_t length, const void *payload, void *read_out)
{
	uint64_t handle = next_handle++;

	if (nbd_client_send_request(fd, type, flags, handle, offset, length) < 0)
		return -1;
	if (payload && nbd_client_send(fd, payload, length) < 0)
		return -1;
	return nbd_client_recv_reply(fd, handle, read_out, length);
}

int nbd_client_recv_chunk(int fd, uint64_t handle, uint16_t *flags, uint16_t *type,
			  void *data, uint32_t cap, uint32_t *len)
{
	uint8_t header[NBD_STRUCTURED_REPLY_HEADER_SIZE];

	if (nbd_client_recv(fd, header, sizeof(header)) < 0 ||
	    load_be32(header) != NBD_MAGIC_STRUCTURED_REPLY ||
	    load_be64(header + 8) != handle)
		return -1;
	*flags = load_be16(header + 4);
	*type = load_be16(header + 6);
	*len = load_be32(header + 16);
	if (*len > cap)
		return -1;
	return *len ? nbd_client_recv(fd, data, *len) : 0;
}

int nbd_client_block_status(int fd, uint16_t flags, uint64_t offset, uint32_t length,
			    uint32_t *pairs, int max, uint32_t *error)
{
	static uint8_t data[4 + 1024 * 8]; /* the server's most */
	uint16_t cflags, type;
	uint32_t len;
	uint64_t h = nbd_client_next_handle();

	*error = 0;
	if (nbd_client_send_request(fd, NBD_CMD_BLOCK_STATUS, flags, h, offset, length) < 0 ||
	    nbd_client_recv_chunk(fd, h, &cflags, &type, data, sizeof(data), &len) < 0 ||
	    cflags != NBD_REPLY_FLAG_DONE)
		return -1;
	if (type == NBD_REPLY_TYPE_ERROR && len >= 4) {
		*error = load_be32(data);
		return 0;
	}
	if (type != NBD_REPLY_TYPE_BLOCK_STATUS || len < 4 ||
	    load_be32(data) != 1 /* the id the handshake accepted */ || (len - 4) % 8)
		return -1;
	int n = (int)((len - 4) / 8);
	for (int i = 0; i < n && i < max; i++) {
		pairs[2 * i] = load_be32(data + 4 + 8 * i);
		pairs[2 * i + 1] = load_be32(data + 8 + 8 * i);
	}
	return n;
}

void nbd_client_fill_pattern(uint8_t *p, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)(i * 7 + seed + (i >> 12));
}

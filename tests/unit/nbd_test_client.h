/*
 * A minimal NBD client for the unit tests that drive a real export over
 * its unix socket or TCP (test_nbd_server.c, test_read_index.c,
 * test_disk_snapshot.c).  Client and
 * server share the test's thread, so every client wait runs the event
 * loop step by step.
 */
#ifndef REMUSDB_NBD_TEST_CLIENT_H
#define REMUSDB_NBD_TEST_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "base/event_loop.h"

/* An export of a fresh sparse image in a temporary directory. */
struct nbd_fixture {
	event_loop *loop;
	char dir[64];
	char socket_path[128];
	char disk_path[128];
	int disk_fd; /* to check the image behind the server's back */
	struct nbd_export *export;
};

/*
 * Creates the image (disk_size bytes of zeros), the loop and the export
 * "vm1", and points the client at them.  0, or -1 (teardown still needed).
 */
int nbd_fixture_setup(struct nbd_fixture *fx, uint64_t disk_size);
void nbd_fixture_teardown(struct nbd_fixture *fx);

/* The loop every wait runs and the socket nbd_client_connect() dials. */
void nbd_client_use(event_loop *loop, const char *socket_path);
/* A non-blocking connection, or -1. */
int nbd_client_connect(void);
/* A non-blocking connection to 127.0.0.1:port, or -1. */
int nbd_client_connect_tcp(uint16_t port);
/* Runs the loop for ms milliseconds. */
void nbd_client_pump(int ms);
int nbd_client_send(int fd, const void *data, size_t len);
/* Receives exactly len bytes; -1 on EOF, error or timeout. */
int nbd_client_recv(int fd, void *out, size_t len);
/* 1 once the server has closed fd's peer, 0 if it stays open. */
int nbd_client_sees_eof(int fd);
int nbd_client_send_option(int fd, uint32_t option, const void *data, uint32_t len);
/* Reads one option reply; returns its type, payload copied to data. */
uint32_t nbd_client_recv_option_reply(int fd, uint32_t option, uint8_t *data,
				      uint32_t cap, uint32_t *len);
int nbd_client_send_go(int fd, const char *name);
/*
 * A simple-reply client's handshake: NBD_OPT_GO with NBD_INFO_BLOCK_SIZE,
 * as QEMU sends it, without NBD_OPT_STRUCTURED_REPLY.  Returns 0 with fd
 * in transmission.
 */
int nbd_client_handshake(int fd, const char *name, uint64_t disk_size);
/* The same, expecting these transmission flags (a read-only export's). */
int nbd_client_handshake_flags(int fd, const char *name, uint64_t disk_size,
			       uint16_t flags);
/*
 * The handshake of QEMU 7.2 and libnbd: NBD_OPT_STRUCTURED_REPLY, then,
 * with meta, NBD_OPT_SET_META_CONTEXT of base:allocation (expecting it
 * selected as id NBD_CONTEXT_ID_ALLOCATION), then NBD_OPT_GO expecting
 * flags plus NBD_FLAG_SEND_DF.  0 with fd in transmission.
 */
int nbd_client_handshake_structured(int fd, const char *name, uint64_t disk_size,
				    uint16_t flags, int meta);
/* A SET/LIST_META_CONTEXT payload for export name and the queries. */
uint32_t nbd_client_meta_payload(uint8_t *out, const char *name,
				 const char *const *queries, unsigned count);
uint64_t nbd_client_next_handle(void);
int nbd_client_send_request(int fd, uint16_t type, uint16_t flags, uint64_t handle,
			    uint64_t offset, uint32_t length);
/* Reads a simple reply for handle; returns its error, or -1 on failure. */
int64_t nbd_client_recv_reply(int fd, uint64_t handle, void *data, uint32_t len);
/* One request, one reply.  Returns the NBD error or -1. */
int64_t nbd_client_transact(int fd, uint16_t type, uint16_t flags, uint64_t offset,
			    uint32_t length, const void *payload, void *read_out);
/*
 * Reads one structured reply chunk for handle: its flags and type, and
 * its payload (at most cap bytes, the rest is an error) into data.
 * 0, or -1 on failure (wrong magic or handle included).
 */
int nbd_client_recv_chunk(int fd, uint64_t handle, uint16_t *flags, uint16_t *type,
			  void *data, uint32_t cap, uint32_t *len);
/*
 * One BLOCK_STATUS of the base:allocation context: fills up to max
 * (length, status) pairs and returns how many the reply held; 0 with
 * *error set for an error chunk; -1 for anything else (a chunk that is
 * not the last, another context, a malformed payload, a dead socket).
 */
int nbd_client_block_status(int fd, uint16_t flags, uint64_t offset, uint32_t length,
			    uint32_t *pairs, int max, uint32_t *error);
/* A deterministic byte pattern that differs from block to block. */
void nbd_client_fill_pattern(uint8_t *p, size_t len, unsigned seed);

#endif

/*
 * NBD transmission phase: requests, served in order.  Reads, writes,
 * trims and write-zeroes that arrive together go to the connection's
 * worker thread as a batch (nbd_io_batch.c); what is left, and every
 * request of a read-only export, is executed here on the loop.  Replies
 * are simple unless the client negotiated structured replies; then a
 * READ is answered with one OFFSET_DATA chunk (so NBD_CMD_FLAG_DF always
 * holds), BLOCK_STATUS with one BLOCK_STATUS chunk, every error with an
 * error chunk carrying a message, and the other successes with simple
 * replies, which the spec allows and which cost 16 bytes instead of 20.
 *
 * Durability: a write is acknowledged only after pwrite returned, so the
 * data sits in the kernel's page cache and survives a SIGKILL of the
 * daemon; FUA and FLUSH add fdatasync before the reply to survive a host
 * crash too.  That fdatasync runs on the connection's worker too
 * (nbd_conn.c), the connection taking no request until it replied,
 * because a busy VM's flushes on the loop would sit inside every other
 * VM's checkpoint pauses and acknowledgements.
 *
 * Read tracking (read_index.h), when the export has an index: a write,
 * trim or write-zeroes forgets the blocks it touches before the image
 * changes, and a read records its whole blocks from the very bytes it
 * returns, with a token taken before its pread.  The token keeps the
 * index right when a write on another connection lands between a read
 * and its recording: the read is then simply not recorded.
 * Recording a 4 KiB block costs about 0.2 us of XXH3 and, once the index
 * outgrows the CPU caches, up to about 1 us of cache misses more
 * (test_read_index.c prints both); the pread of that block alone takes
 * about 0.5 us on the lab host, so a guest reading 400 MB/s costs the
 * loop roughly a tenth of a core more.
 *
 * Copy-on-write (disk_snapshot.h): before a write, trim or write-zeroes
 * changes the image, the export's before-write hooks copy what a frozen
 * snapshot still needs; if that fails the request fails, untouched.  A
 * read-only export (a snapshot served to clones) refuses every change
 * with EPERM, as the NBD spec asks, and takes FLUSH as a no-op.
 */
#include <stdio.h>
#include <string.h>

#include "base/be.h"
#include "nbd/nbd_conn_internal.h"
#include "nbd/nbd_io_batch.h"
#include "nbd/nbd_proto.h"
#include "nbd/read_index.h"

int nbd_transmission_simple_reply(struct nbd_conn *c, uint32_t error, uint64_t handle)
{
	uint8_t reply[NBD_SIMPLE_REPLY_SIZE];

	nbd_encode_simple_reply(reply, error, handle);
	return nbd_conn_queue(c, reply, sizeof(reply));
}

/*
 * The error reply to a request.  With structured replies it must be a
 * chunk for READ (even an early EINVAL) and is better one for the rest:
 * the message reaches the user (libnbd and QEMU print it).
 */
static int request_error_reply(struct nbd_conn *c, uint64_t handle, uint32_t error,
			       const char *message)
{
	uint8_t chunk[NBD_STRUCTURED_REPLY_HEADER_SIZE + NBD_ERROR_CHUNK_FIXED_SIZE +
		      NBD_MAX_ERROR_MESSAGE];

	if (!c->structured)
		return nbd_transmission_simple_reply(c, error, handle);
	return nbd_conn_queue(c, chunk, nbd_encode_error_chunk(chunk, handle, error,
								 message));
}

int nbd_transmission_io_failed(struct nbd_conn *c, const struct nbd_request *req, int err)
{
	char message[NBD_MAX_ERROR_MESSAGE];

	c->export->stats.errors++;
	nbd_conn_log(c, LOG_ERROR, "%s at offset %llu length %u failed on %s: %s",
		     nbd_command_name(req->type), (unsigned long long)req->offset,
		     req->length, c->export->disk.path, strerror(-err));
	snprintf(message, sizeof(message), "remusdbd: %s failed: %s",
		 nbd_command_name(req->type), strerror(-err));
	return request_error_reply(c, req->handle, nbd_error_from_errno(err), message);
}

/* A READ's reply header: simple, or an OFFSET_DATA chunk's header and offset. */
static size_t read_reply_header_size(const struct nbd_conn *c)
{
	return c->structured ? NBD_STRUCTURED_REPLY_HEADER_SIZE + 8 : NBD_SIMPLE_REPLY_SIZE;
}

static void encode_read_reply_header(const struct nbd_conn *c, uint8_t *reply,
				     const struct nbd_request *req)
{
	if (c->structured) {
		nbd_encode_structured_header(reply, NBD_REPLY_FLAG_DONE,
					     NBD_REPLY_TYPE_OFFSET_DATA, req->handle,
					     8 + req->length);
		store_be64(reply + NBD_STRUCTURED_REPLY_HEADER_SIZE, req->offset);
	} else {
		nbd_encode_simple_reply(reply, 0, req->handle);
	}
}

/* Room for a READ's reply in c->out, or NULL with the error reply queued (*r). */
static uint8_t *reserve_read_reply(struct nbd_conn *c, const struct nbd_request *req,
				   int *r)
{
	uint8_t *reply = buffer_reserve(&c->out, read_reply_header_size(c) +
						 (size_t)req->length);

	if (!reply) {
		nbd_conn_log(c, LOG_ERROR, "out of memory for a %u-byte read", req->length);
		*r = request_error_reply(c, req->handle, NBD_ENOMEM,
					 "remusdbd: out of memory for the read");
	}
	return reply;
}

static void commit_read_reply(struct nbd_conn *c, uint8_t *reply,
			      const struct nbd_request *req)
{
	encode_read_reply_header(c, reply, req);
	buffer_commit(&c->out, read_reply_header_size(c) + (size_t)req->length);
	c->export->stats.reads++;
	c->export->stats.bytes_read += req->length;
}

int nbd_transmission_read_reply(struct nbd_conn *c, const struct nbd_request *req,
				const uint8_t *data)
{
	int r = 0;
	uint8_t *reply = reserve_read_reply(c, req, &r);

	if (!reply)
		return r;
	memcpy(reply + read_reply_header_size(c), data, req->length);
	commit_read_reply(c, reply, req);
	return 0;
}

/* A READ served on the loop: the data goes straight into the output buffer. */
static int do_read(struct nbd_conn *c, const struct nbd_request *req)
{
	struct nbd_export *export = c->export;
	int r = 0;
	uint8_t *reply = reserve_read_reply(c, req, &r);

	if (!reply)
		return r;
	uint8_t *data = reply + read_reply_header_size(c);
	uint64_t token = export->read_index ? read_index_read_begin(export->read_index) : 0;
	int err = nbd_export_read_image(export, data, req->length, req->offset);
	if (err)
		return nbd_transmission_io_failed(c, req, err);
	if (export->read_index)
		read_index_note_read(export->read_index, token, req->offset, data, req->length);
	commit_read_reply(c, reply, req);
	return 0;
}

/*
 * Extents per BLOCK_STATUS reply: bounds the reply (8 KiB) and the
 * lseek()s one request costs the loop.  A client asks again from where
 * the reply ended, as the spec expects.
 */
#define MAX_EXTENTS_PER_REPLY 1024

static int do_block_status(struct nbd_conn *c, const struct nbd_request *req)
{
	struct disk_extent extents[MAX_EXTENTS_PER_REPLY];
	size_t count;
	/* REQ_ONE: exactly one descriptor, no longer than the request. */
	size_t max = req->flags & NBD_CMD_FLAG_REQ_ONE ? 1 : MAX_EXTENTS_PER_REPLY;

	int err = nbd_export_extents(c->export, req->offset, req->length, extents, max,
				     &count);
	if (err)
		return nbd_transmission_io_failed(c, req, err);
	uint32_t payload = 4 + (uint32_t)count * NBD_BLOCK_DESCRIPTOR_SIZE;
	uint8_t *reply = buffer_reserve(&c->out, NBD_STRUCTURED_REPLY_HEADER_SIZE + payload);
	if (!reply) {
		nbd_conn_log(c, LOG_ERROR, "out of memory for a block status reply");
		return request_error_reply(c, req->handle, NBD_ENOMEM,
					   "remusdbd: out of memory for block status");
	}
	uint8_t *p = reply + nbd_encode_structured_header(reply, NBD_REPLY_FLAG_DONE,
							  NBD_REPLY_TYPE_BLOCK_STATUS,
							  req->handle, payload);
	store_be32(p, NBD_CONTEXT_ID_ALLOCATION);
	p += 4;
	for (size_t i = 0; i < count; i++) {
		/* Within the request, whose length is 32 bits: fits. */
		uint32_t status = extents[i].hole ? NBD_STATE_HOLE | NBD_STATE_ZERO : 0;
		p += nbd_encode_block_descriptor(p, (uint32_t)extents[i].length, status);
	}
	buffer_commit(&c->out, NBD_STRUCTURED_REPLY_HEADER_SIZE + payload);
	c->export->stats.block_status++;
	return 0;
}

int nbd_transmission_flushed(struct nbd_conn *c, const struct nbd_request *req, int err)
{
	if (err)
		return nbd_transmission_io_failed(c, req, err);
	c->export->stats.flushes++;
	return nbd_transmission_simple_reply(c, 0, req->handle);
}

static int refuse_change(struct nbd_conn *c, const struct nbd_request *req)
{
	c->export->stats.errors++;
	nbd_conn_log(c, LOG_WARN, "refusing %s at offset %llu length %u: the "
		     "export is read-only", nbd_command_name(req->type),
		     (unsigned long long)req->offset, req->length);
	return request_error_reply(c, req->handle, NBD_EPERM,
				   "remusdbd: this export is read-only");
}

static int execute(struct nbd_conn *c, const struct nbd_request *req,
		   const uint8_t *payload)
{
	struct nbd_export *export = c->export;
	int changes = req->type == NBD_CMD_WRITE || req->type == NBD_CMD_TRIM ||
		      req->type == NBD_CMD_WRITE_ZEROES;
	int err = 0;

	if (changes && export->read_only)
		return refuse_change(c, req);
	/* Snapshots copy what they still need; on failure nothing changes. */
	if (changes)
		err = nbd_export_before_write(export, req->offset, req->length);
	if (err)
		return nbd_transmission_io_failed(c, req, err);
	/*
	 * Forget before the image changes, and whether or not the change
	 * succeeds: a failed pwrite may still have written part of it.
	 */
	if (export->read_index && changes)
		read_index_invalidate_range(export->read_index, req->offset, req->length);

	switch (req->type) {
	case NBD_CMD_READ:
		return do_read(c, req);
	case NBD_CMD_BLOCK_STATUS:
		return do_block_status(c, req);
	case NBD_CMD_WRITE:
		err = disk_file_write(&export->disk, payload, req->length, req->offset);
		if (!err) {
			export->stats.writes++;
			export->stats.bytes_written += req->length;
			nbd_export_notify_write(export, NBD_WRITE_DATA, req->offset,
						payload, req->length);
		}
		break;
	case NBD_CMD_FLUSH:
		/* A read-only export has nothing of its own to make durable. */
		if (!export->read_only)
			return nbd_conn_flush_then_reply(c, req);
		export->stats.flushes++;
		break;
	case NBD_CMD_TRIM:
		err = disk_file_trim(&export->disk, req->offset, req->length);
		if (!err) {
			export->stats.trims++;
			nbd_export_notify_write(export, NBD_WRITE_TRIM, req->offset,
						NULL, req->length);
		}
		break;
	case NBD_CMD_WRITE_ZEROES:
		err = disk_file_write_zeroes(&export->disk, req->offset, req->length,
					     !(req->flags & NBD_CMD_FLAG_NO_HOLE));
		if (!err) {
			export->stats.write_zeroes++;
			nbd_export_notify_write(export, NBD_WRITE_ZEROES, req->offset,
						NULL, req->length);
		}
		break;
	}
	if (err)
		return nbd_transmission_io_failed(c, req, err);
	/* FUA: the change is durable before its reply, as FLUSH is. */
	if (changes && (req->flags & NBD_CMD_FLAG_FUA))
		return nbd_conn_flush_then_reply(c, req);
	return nbd_transmission_simple_reply(c, 0, req->handle);
}

int nbd_transmission_step(struct nbd_conn *c)
{
	struct nbd_request req;
	const char *reason;
	uint32_t error;
	char what[160];
	int r;

	/* Requests are served in order: none overtakes a job on the worker. */
	if (c->io_pending)
		return 0;
	r = nbd_io_batch_post(c);
	if (r < 0)
		return -1;
	if (r > 0)
		return c->io_pending ? 0 : 1;
	r = nbd_parse_request(buffer_head(&c->in), buffer_len(&c->in), &req, &reason);
	if (r == NBD_PARSE_NEED_MORE)
		return 0;
	if (r == NBD_PARSE_MALFORMED)
		return nbd_conn_protocol_error(c, reason);
	enum nbd_verdict verdict = nbd_validate_request(&req, c->export->disk.size,
							nbd_conn_negotiated(c),
							&error, &reason);
	snprintf(what, sizeof(what), "%s (type %u, flags 0x%x) offset %llu length %u",
		 nbd_command_name(req.type), req.type, req.flags,
		 (unsigned long long)req.offset, req.length);
	if (verdict == NBD_VERDICT_CLOSE) {
		char line[256];
		snprintf(line, sizeof(line), "%s: %s", what, reason);
		return nbd_conn_protocol_error(c, line);
	}
	size_t total = NBD_REQUEST_SIZE + (size_t)nbd_request_payload_length(&req);
	if (buffer_len(&c->in) < total)
		return 0;
	const uint8_t *payload = buffer_head(&c->in) + NBD_REQUEST_SIZE;
	if (verdict == NBD_VERDICT_ERROR) {
		/* Well-formed but refused: the spec wants an error reply. */
		c->export->stats.errors++;
		nbd_conn_log(c, LOG_WARN, "rejecting %s: %s (error %u)", what, reason, error);
		char message[NBD_MAX_ERROR_MESSAGE];
		snprintf(message, sizeof(message), "remusdbd: %s", reason);
		r = request_error_reply(c, req.handle, error, message);
	} else if (req.type == NBD_CMD_DISC) {
		nbd_conn_log(c, LOG_INFO, "client disconnected (NBD_CMD_DISC)");
		c->phase = PHASE_CLOSING;
		r = 0;
	} else {
		r = execute(c, &req, payload);
	}
	buffer_consume(&c->in, total);
	return r < 0 ? -1 : 1;
}


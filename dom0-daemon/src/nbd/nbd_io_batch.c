/*
 * An NBD connection's reads and writes, run on its worker thread in
 * batches, so that a busy VM's disk I/O does not hold the event loop
 * every VM of the host shares (issue 23: a pread that misses the page
 * cache, or a pwrite the kernel throttles under writeback, takes as
 * long as the disk does).
 *
 * A batch is the run of READ, WRITE, TRIM and WRITE_ZEROES requests at
 * the head of c->in that are whole and valid, up to BATCH_MAX_REQUESTS
 * and BATCH_MAX_READ_BYTES, ending early with a FLUSH or a FUA change,
 * whose fdatasync the worker runs right after the batch's writes.  QEMU
 * keeps up to 16 requests in flight, so one handoff to the worker and
 * one wakeup back usually serve several, and a database's commit (its
 * log write, then a flush or a FUA write) often takes one handoff, not
 * two.  Anything else (BLOCK_STATUS, DISC, a refused request) ends the
 * batch and is served on the loop by nbd_transmission.c once the batch
 * is done, in order.
 *
 * What stays on the loop, and why:
 * - before the post: the export's copy-on-write hooks (a fork's snapshot
 *   must copy a block before any write of the batch changes it; a change
 *   whose copy fails is refused, not run) and the read index's invalidation of every block a change touches (the index
 *   must forget a block before its data changes);
 * - at the end: the invalidation again (a read on another connection may
 *   have recorded the block while this write was half done; see
 *   read_index.h: a read whose token predates this invalidation is not
 *   recorded, and one recorded before it is removed by it), the write
 *   hooks (the protection's disk replication and change log, which must
 *   see each write before its reply leaves), the read index's recording
 *   of each read, the statistics and the replies.
 * The worker only does the system calls.  c->in is not read into while
 * the batch runs, so the writes' payloads stay where the batch points.
 *
 * Only an export with an image of its own is served this way; a
 * read-only export reads through its backend on the loop.
 */
#include "nbd/nbd_io_batch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "nbd/nbd_conn_internal.h"
#include "nbd/nbd_proto.h"
#include "nbd/read_index.h"

#define BATCH_MAX_REQUESTS 32
/* Reads' data held at once: the connection's output high-water mark. */
#define BATCH_MAX_READ_BYTES (4u * 1024 * 1024)

struct batch_item {
	struct nbd_request req;
	size_t payload_at; /* a WRITE's payload: offset in the batch's input */
	size_t data_at;    /* a READ's data: offset in data */
	uint64_t token;    /* a READ's read index token */
	int err;           /* 0 or -errno, set by the worker */
	int sync_err;      /* a FUA change's fdatasync: 0 or -errno */
};

struct nbd_io_batch {
	struct disk_file *disk;
	const uint8_t *in; /* c->in's head when posted */
	size_t in_bytes;   /* of c->in the batch's requests take */
	size_t count;
	struct batch_item items[BATCH_MAX_REQUESTS];
	uint8_t *data;     /* the reads' data */
	size_t data_len;
	size_t data_cap;
};

static bool batchable_type(uint16_t type)
{
	return type == NBD_CMD_READ || type == NBD_CMD_WRITE || type == NBD_CMD_TRIM ||
	       type == NBD_CMD_WRITE_ZEROES || type == NBD_CMD_FLUSH;
}

static bool changes(const struct nbd_request *req)
{
	return req->type != NBD_CMD_READ && req->type != NBD_CMD_FLUSH;
}

/* A FLUSH, or a FUA change: its fdatasync ends the batch. */
static bool syncs(const struct nbd_request *req)
{
	return req->type == NBD_CMD_FLUSH ||
	       (changes(req) && (req->flags & NBD_CMD_FLAG_FUA));
}

/* The worker's part: each request's system call, in order. */
static int run_batch(void *arg)
{
	struct nbd_io_batch *b = arg;

	for (size_t i = 0; i < b->count; i++) {
		struct batch_item *it = &b->items[i];
		const struct nbd_request *req = &it->req;

		if (it->err)
			continue; /* refused before the post */
		switch (req->type) {
		case NBD_CMD_READ:
			it->err = disk_file_read(b->disk, b->data + it->data_at, req->length,
						 req->offset);
			break;
		case NBD_CMD_WRITE:
			it->err = disk_file_write(b->disk, b->in + it->payload_at, req->length,
						  req->offset);
			break;
		case NBD_CMD_TRIM:
			it->err = disk_file_trim(b->disk, req->offset, req->length);
			break;
		case NBD_CMD_WRITE_ZEROES:
			it->err = disk_file_write_zeroes(b->disk, req->offset, req->length,
							 !(req->flags & NBD_CMD_FLAG_NO_HOLE));
			break;
		}
		/*
		 * Everything before it in the batch has been written: the one
		 * fdatasync makes a FLUSH, or a FUA change, durable.
		 */
		if (it->err || !syncs(req))
			continue;
		if (req->type == NBD_CMD_FLUSH)
			it->err = disk_file_flush(b->disk);
		else
			it->sync_err = disk_file_flush(b->disk);
	}
	return 0;
}

static int reserve_data(struct nbd_io_batch *b, size_t len)
{
	if (b->data_cap - b->data_len >= len)
		return 0;
	size_t cap = b->data_cap ? b->data_cap : 64 * 1024;
	while (cap - b->data_len < len)
		cap *= 2;
	uint8_t *grown = realloc(b->data, cap);
	if (!grown)
		return -1;
	b->data = grown;
	b->data_cap = cap;
	return 0;
}

/*
 * Takes the request at offset `at` of c->in into b if it may go: whole,
 * valid, of a batchable type, within the limits, and its copy-on-write
 * hooks done.  Returns its size in c->in, or 0 when the batch ends here.
 */
static size_t take(struct nbd_conn *c, struct nbd_io_batch *b, size_t at)
{
	struct nbd_export *export = c->export;
	const uint8_t *head = buffer_head(&c->in) + at;
	size_t have = buffer_len(&c->in) - at;
	struct nbd_request req;
	const char *reason;
	uint32_t error;

	if (b->count == BATCH_MAX_REQUESTS ||
	    nbd_parse_request(head, have, &req, &reason) != NBD_PARSE_OK ||
	    !batchable_type(req.type) ||
	    nbd_validate_request(&req, export->disk.size, nbd_conn_negotiated(c), &error,
				 &reason) != NBD_VERDICT_OK)
		return 0;
	size_t total = NBD_REQUEST_SIZE + (size_t)nbd_request_payload_length(&req);
	if (have < total)
		return 0;
	struct batch_item *it = &b->items[b->count];
	memset(it, 0, sizeof(*it));
	it->req = req;
	if (req.type == NBD_CMD_READ) {
		if (b->data_len + req.length > BATCH_MAX_READ_BYTES && b->count > 0)
			return 0; /* the next batch takes it */
		if (reserve_data(b, req.length) < 0)
			return 0; /* served on the loop, which says so */
		it->data_at = b->data_len;
		b->data_len += req.length;
		if (export->read_index)
			it->token = read_index_read_begin(export->read_index);
	} else {
		it->payload_at = at + NBD_REQUEST_SIZE;
		/* A hook that fails refuses the change: not run, its error replied. */
		it->err = nbd_export_before_write(export, req.offset, req.length);
		if (!it->err && export->read_index)
			read_index_invalidate_range(export->read_index, req.offset, req.length);
	}
	b->count++;
	return total;
}

/*
 * What a finished request leaves on the loop: the write hooks see a
 * change, the read index a read, the statistics both.  Run for every
 * request of the batch, whatever became of the replies: a change in the
 * image that the replication never saw would part the backup's disk from
 * ours.
 */
static void account(struct nbd_export *export, const struct batch_item *it,
		    const uint8_t *payload, const uint8_t *data)
{
	const struct nbd_request *req = &it->req;

	if (changes(req) && export->read_index)
		read_index_invalidate_range(export->read_index, req->offset, req->length);
	if (it->err)
		return;
	switch (req->type) {
	case NBD_CMD_READ:
		if (export->read_index)
			read_index_note_read(export->read_index, it->token, req->offset, data,
					     req->length);
		break;
	case NBD_CMD_WRITE:
		export->stats.writes++;
		export->stats.bytes_written += req->length;
		nbd_export_notify_write(export, NBD_WRITE_DATA, req->offset, payload,
					req->length);
		break;
	case NBD_CMD_TRIM:
		export->stats.trims++;
		nbd_export_notify_write(export, NBD_WRITE_TRIM, req->offset, NULL, req->length);
		break;
	case NBD_CMD_WRITE_ZEROES:
		export->stats.write_zeroes++;
		nbd_export_notify_write(export, NBD_WRITE_ZEROES, req->offset, NULL,
					req->length);
		break;
	}
}

static int reply(struct nbd_conn *c, const struct batch_item *it, const uint8_t *data)
{
	const struct nbd_request *req = &it->req;

	if (it->err)
		return nbd_transmission_io_failed(c, req, it->err);
	if (req->type == NBD_CMD_READ)
		return nbd_transmission_read_reply(c, req, data);
	/*
	 * A FLUSH, or a FUA change, is durable already: the worker flushed
	 * after it.  If a FUA change's flush failed, the change is in the
	 * image (and accounted) but its reply is the flush's error.
	 */
	if (req->type == NBD_CMD_FLUSH || (req->flags & NBD_CMD_FLAG_FUA))
		return nbd_transmission_flushed(c, req, it->sync_err);
	return nbd_transmission_simple_reply(c, 0, req->handle);
}

/* Called with the batch's requests still in c->in; consumes them. */
static int reply_all(struct nbd_conn *c, struct nbd_io_batch *b)
{
	int r = 0;

	for (size_t i = 0; i < b->count; i++) {
		const struct batch_item *it = &b->items[i];
		const uint8_t *data = it->req.type == NBD_CMD_READ ? b->data + it->data_at : NULL;

		account(c->export, it, b->in + it->payload_at, data);
		if (r == 0)
			r = reply(c, it, data); /* after a failure: none, c is closed */
	}
	buffer_consume(&c->in, b->in_bytes);
	b->count = 0;
	b->data_len = 0;
	return r;
}

static void batch_done(void *opaque, int result)
{
	struct nbd_conn *c = opaque;

	(void)result;
	c->io_pending = false;
	int r = reply_all(c, c->batch);
	if (c->closing)
		return; /* nbd_conn_close finishing the job: the hooks ran, nothing more */
	if (r < 0) {
		nbd_conn_close(c);
		return;
	}
	nbd_conn_serve_buffered(c);
}

int nbd_io_batch_post(struct nbd_conn *c)
{
	struct nbd_export *export = c->export;

	if (export->read_only || export->disk.fd < 0 || c->no_worker)
		return 0;
	if (!c->batch && !(c->batch = calloc(1, sizeof(*c->batch))))
		return 0; /* served on the loop */
	struct nbd_io_batch *b = c->batch;
	size_t at = 0, n;

	b->count = 0;
	b->data_len = 0;
	while ((n = take(c, b, at)) > 0) {
		at += n;
		if (syncs(&b->items[b->count - 1].req))
			break;
	}
	if (b->count == 0)
		return 0;
	struct loop_worker *w = nbd_conn_worker(c);
	b->disk = &export->disk;
	b->in = buffer_head(&c->in);
	b->in_bytes = at;
	if (w && loop_worker_post(w, run_batch, b, batch_done, c) == 0) {
		c->io_pending = true;
		return 1;
	}
	/* No worker: the same batch, run here. */
	run_batch(b);
	return reply_all(c, b) < 0 ? -1 : 1;
}

void nbd_io_batch_free(struct nbd_io_batch *b)
{
	if (!b)
		return;
	free(b->data);
	free(b);
}

/*
 * An NBD connection's reads and writes in batches on its worker thread
 * (nbd_io_batch.c says which requests go and what stays on the loop).
 */
#ifndef REMUSDB_NBD_IO_BATCH_H
#define REMUSDB_NBD_IO_BATCH_H

struct nbd_conn;
struct nbd_io_batch;

/*
 * Posts the batchable requests at the head of c->in to c's worker (then
 * c->io_pending until their replies are queued), or runs them here when
 * no worker can be had.  1 when it took requests, 0 when the request at
 * the head is for the loop (or not whole yet), -1 when c must be closed.
 */
int nbd_io_batch_post(struct nbd_conn *c);
void nbd_io_batch_free(struct nbd_io_batch *b);

#endif

/*
 * The eager restore of a takeover (eager_restore.c): the whole committed
 * image written into QEMU's -incoming before the VM may run.
 */
#ifndef REMUSDB_EAGER_RESTORE_H
#define REMUSDB_EAGER_RESTORE_H

#include <stdbool.h>

#include "base/buffer.h"

struct replica;
struct restore_stream;

struct replica_eager_restore {
	int incoming_fd;
	struct restore_stream *stream;
	struct buffer out;
	bool produced;
};

void eager_restore_init(struct replica *r);
/* fd: connected to QEMU's -incoming, ours from now on. */
void eager_restore_start(struct replica *r, int fd);
/* The stream is still being written. */
bool eager_restore_streaming(const struct replica *r);
void eager_restore_stop(struct replica *r);

#endif

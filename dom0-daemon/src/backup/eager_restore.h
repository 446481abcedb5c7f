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

/* The room the restore asks for in its socket's send buffer: one chunk. */
#define EAGER_RESTORE_CHUNK (4u << 20)

void eager_restore_init(struct replica *r);
/*
 * Gives the -incoming socket a send buffer of a whole chunk (0), so that
 * QEMU loads one chunk while the daemon produces the next; -1 with errno
 * when the kernel refused both SO_SNDBUFFORCE and SO_SNDBUF.
 */
int eager_restore_widen_send_buffer(int fd);
/* fd: connected to QEMU's -incoming, ours from now on. */
void eager_restore_start(struct replica *r, int fd);
/* The stream is still being written. */
bool eager_restore_streaming(const struct replica *r);
void eager_restore_stop(struct replica *r);

#endif

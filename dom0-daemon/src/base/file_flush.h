/*
 * fdatasync of a file (a disk image) on a worker thread, its end reported on the
 * event loop.  Why: flushing a busy guest's image can take as long as
 * its dirty data takes to reach the disk, and the loop that waits for it
 * is the one that checkpoints, acknowledges and answers heartbeats.  One
 * flush at a time per owner, on a worker thread started at its first
 * flush and kept until destroy.
 */
#ifndef REMUSDB_FILE_FLUSH_H
#define REMUSDB_FILE_FLUSH_H

#include <stdbool.h>
#include <stddef.h>

#include "base/event_loop.h"

/* err: 0 when everything written before the flush started is on disk, else an errno. */
typedef void (*file_flush_done)(void *opaque, int err);

struct file_flush;

/* NULL with err filled (no pipe, or out of memory). */
struct file_flush *file_flush_create(event_loop *loop, char *err, size_t errlen);
/* Waits for a running flush (without its callback), then frees.  NULL is a no-op. */
void file_flush_destroy(struct file_flush *f);
bool file_flush_busy(const struct file_flush *f);
/*
 * Waits for a running flush and runs its callback now, for an owner that
 * is going away and must not lose the result.  No-op when idle.
 */
void file_flush_finish(struct file_flush *f);
/* Starts flushing path; done runs on the loop.  -1 when busy or no thread could start. */
int file_flush_start(struct file_flush *f, const char *path, file_flush_done done,
		     void *opaque);
/*
 * The same for an open file: the worker flushes a duplicate of fd, so
 * the file flushed is the one the owner writes even if its path was
 * renamed or removed meanwhile.
 */
int file_flush_start_fd(struct file_flush *f, int fd, file_flush_done done, void *opaque);

#endif

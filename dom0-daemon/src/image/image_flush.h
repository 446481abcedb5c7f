/*
 * fdatasync of a disk image on a worker thread, its end reported on the
 * event loop.  Why: flushing a busy guest's image can take as long as
 * its dirty data takes to reach the disk, and the loop that waits for it
 * is the one that checkpoints, acknowledges and answers heartbeats.
 */
#ifndef REMUSDB_IMAGE_FLUSH_H
#define REMUSDB_IMAGE_FLUSH_H

#include <stdbool.h>
#include <stddef.h>

#include "base/event_loop.h"

/* err: 0 when everything written before the flush started is on disk, else an errno. */
typedef void (*image_flush_done)(void *opaque, int err);

struct image_flush;

/* NULL with err filled (no pipe, or out of memory). */
struct image_flush *image_flush_create(event_loop *loop, char *err, size_t errlen);
/* Waits for a running flush (without its callback), then frees.  NULL is a no-op. */
void image_flush_destroy(struct image_flush *f);
bool image_flush_busy(const struct image_flush *f);
/*
 * Waits for a running flush and runs its callback now, for an owner that
 * is going away and must not lose the result.  No-op when idle.
 */
void image_flush_finish(struct image_flush *f);
/* Starts flushing path; done runs on the loop.  -1 when busy or no thread could start. */
int image_flush_start(struct image_flush *f, const char *path, image_flush_done done,
		      void *opaque);

#endif

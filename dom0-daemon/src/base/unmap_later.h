/*
 * munmap (and close) off the event loop.  Unmapping a large mapping that
 * the daemon alone holds, a taken-over replica's image, frees every page
 * of it, and that takes time in proportion to its size
 * (`tools/remusdb-bench unmap`); on the loop, every other VM's
 * checkpoints, NBD requests and takeovers would wait for it.  A thread
 * of its own does it instead.
 */
#ifndef REMUSDB_UNMAP_LATER_H
#define REMUSDB_UNMAP_LATER_H

#include <stddef.h>

/* Below this a thread costs more than the unmap: done at once. */
#define UNMAP_LATER_MIN_BYTES (64u << 20)

/*
 * Unmaps [addr, addr + len) and closes fd (-1: none) on a thread of its
 * own; at once when the mapping is small or no thread can start.  The
 * caller forgets both at once.
 */
void unmap_later(void *addr, size_t len, int fd);
/* Waits for every unmap still running: the daemon's exit leaves no thread behind. */
void unmap_later_drain(void);
/* Unmaps still running (the unit tests). */
unsigned unmap_later_running(void);

#endif

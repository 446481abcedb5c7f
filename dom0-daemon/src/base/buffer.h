/*
 * Growable byte buffer with a read cursor: sockets append at the end,
 * parsers consume from the front.  Used for every non-blocking connection.
 */
#ifndef REMUSDB_BUFFER_H
#define REMUSDB_BUFFER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct buffer {
	uint8_t *data;
	size_t start; /* first unread byte */
	size_t end;   /* one past the last byte */
	size_t capacity;
};

void buffer_init(struct buffer *b);
void buffer_free(struct buffer *b);
static inline size_t buffer_len(const struct buffer *b) { return b->end - b->start; }
static inline uint8_t *buffer_head(const struct buffer *b) { return b->data + b->start; }
/* Makes room for n more bytes and returns where to write them. */
uint8_t *buffer_reserve(struct buffer *b, size_t n);
void buffer_commit(struct buffer *b, size_t n); /* after writing into reserve */
int buffer_append(struct buffer *b, const void *src, size_t n);
void buffer_consume(struct buffer *b, size_t n);
void buffer_clear(struct buffer *b);
/*
 * Reads what the fd has (up to max bytes).  Returns bytes read, 0 at EOF,
 * -1 with errno set (EAGAIN when nothing is ready).
 */
ssize_t buffer_read_fd(struct buffer *b, int fd, size_t max);
/*
 * Writes as much as the fd takes (never raising SIGPIPE on sockets);
 * returns -1 on a hard error, else 0.
 */
int buffer_write_fd(struct buffer *b, int fd);
/* The same, stopping once `max` bytes are written (the rest waits). */
int buffer_write_fd_upto(struct buffer *b, int fd, size_t max);

#endif

/* Growable byte buffers with a read cursor (buffer.h). */
#include "base/buffer.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void buffer_init(struct buffer *b)
{
	memset(b, 0, sizeof(*b));
}

void buffer_free(struct buffer *b)
{
	free(b->data);
	buffer_init(b);
}

uint8_t *buffer_reserve(struct buffer *b, size_t n)
{
	if (b->start == b->end)
		b->start = b->end = 0;
	if (b->capacity - b->end >= n)
		return b->data + b->end;
	/* Compact first: consumed bytes at the front are free space. */
	if (b->start > 0) {
		memmove(b->data, b->data + b->start, b->end - b->start);
		b->end -= b->start;
		b->start = 0;
		if (b->capacity - b->end >= n)
			return b->data + b->end;
	}
	size_t capacity = b->capacity ? b->capacity : 4096;
	while (capacity - b->end < n) {
		if (capacity > SIZE_MAX / 2)
			return NULL;
		capacity *= 2;
	}
	uint8_t *grown = realloc(b->data, capacity);
	if (!grown)
		return NULL;
	b->data = grown;
	b->capacity = capacity;
	return b->data + b->end;
}

void buffer_commit(struct buffer *b, size_t n)
{
	b->end += n;
}

int buffer_append(struct buffer *b, const void *src, size_t n)
{
	uint8_t *dst = buffer_reserve(b, n);

	if (!dst)
		return -1;
	if (n)
		memcpy(dst, src, n);
	b->end += n;
	return 0;
}

void buffer_consume(struct buffer *b, size_t n)
{
	b->start += n;
	if (b->start >= b->end)
		b->start = b->end = 0;
}

void buffer_clear(struct buffer *b)
{
	b->start = b->end = 0;
}

ssize_t buffer_read_fd(struct buffer *b, int fd, size_t max)
{
	uint8_t *dst = buffer_reserve(b, max);

	if (!dst) {
		errno = ENOMEM;
		return -1;
	}
	ssize_t n;
	do {
		n = read(fd, dst, max);
	} while (n < 0 && errno == EINTR);
	if (n > 0)
		b->end += (size_t)n;
	return n;
}

int buffer_write_fd(struct buffer *b, int fd)
{
	return buffer_write_fd_upto(b, fd, SIZE_MAX);
}

int buffer_write_fd_upto(struct buffer *b, int fd, size_t max)
{
	int is_socket = 1;

	while (buffer_len(b) > 0 && max > 0) {
		size_t len = buffer_len(b) < max ? buffer_len(b) : max;
		/*
		 * send() with MSG_NOSIGNAL so that a peer that went away gives
		 * EPIPE instead of killing the daemon with SIGPIPE; pipes and
		 * other fds (ENOTSOCK) fall back to write().
		 */
		ssize_t n = is_socket ? send(fd, buffer_head(b), len, MSG_NOSIGNAL)
				      : write(fd, buffer_head(b), len);
		if (n < 0) {
			if (errno == ENOTSOCK && is_socket) {
				is_socket = 0;
				continue;
			}
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return -1;
		}
		buffer_consume(b, (size_t)n);
		max -= (size_t)n;
	}
	return 0;
}

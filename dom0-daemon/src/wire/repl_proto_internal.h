/*
 * What the replication protocol's codec files (repl_frame.c, repl_text.c,
 * repl_fields.c, repl_msg_*.c, repl_coded.c) share and nobody else needs:
 * error reporting, the frame checks every decoder starts with, and the
 * text rules.  Private to wire/.
 */
#ifndef REMUSDB_REPL_PROTO_INTERNAL_H
#define REMUSDB_REPL_PROTO_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buffer.h"
#include "wire/repl_proto.h"

/*
 * An error message with numbers in it, in a thread-local buffer that the
 * next call in the same thread overwrites.
 */
__attribute__((format(printf, 1, 2)))
const char *repl_errf(const char *fmt, ...);
/* Sets *err (when err is not NULL) and returns -1. */
int repl_fail(const char **err, const char *msg);
/* Sets errno to EINVAL and returns -1: an encoder's refusal. */
int repl_invalid(void);

/* Commits a frame reserved with repl_begin_frame(). */
void repl_end_frame(struct buffer *b, size_t length);

/* Every decoder starts with one of these: right type, sane frame, size. */
int repl_expect_type(const struct repl_frame *f, uint16_t type, const char **err);
int repl_expect_length(const struct repl_frame *f, uint16_t type, uint32_t length,
		       const char **err);
int repl_expect_at_least(const struct repl_frame *f, uint16_t type, uint32_t length,
			 const char **err);

/*
 * Length of the longest prefix of s made of complete, well-formed UTF-8
 * characters.
 */
size_t repl_utf8_valid_prefix(const uint8_t *s, size_t n);
bool repl_is_printable_ascii(const uint8_t *s, size_t n);
/*
 * Wire length of an ERROR reason or BYE text: valid UTF-8 or -1, cut to
 * REPL_TEXT_MAX at a character boundary.
 */
int repl_text_wire_length(const char *text, size_t *len);
/* A string for a fixed char[cap] field: 1..cap-1 printable ASCII bytes. */
bool repl_field_string_ok(const char *s, size_t cap, size_t *len);
/* ERROR reason, BYE text, DISK_PLAN reason: <= REPL_TEXT_MAX bytes of UTF-8 without NUL. */
int repl_check_text(const uint8_t *s, size_t n, uint16_t type, const char **err);

/*
 * The fixed fields of a message, from its table (repl_fields.h).
 * repl_fields_check: 0, or -1 if a HOST field is out of range or a REF is
 * NULL (an encoder then refuses with EINVAL).  repl_fields_store writes
 * every field but the WIRE ones at p.  repl_fields_load checks the range
 * of each field at p (the payload has l->fixed bytes) and fills host: 0,
 * or -1 with *err naming the first field out of range.
 */
struct repl_layout;
int repl_fields_check(const struct repl_layout *l, const void *host);
void repl_fields_store(const struct repl_layout *l, uint8_t *p, const void *host);
int repl_fields_load(const struct repl_layout *l, const uint8_t *p, void *host,
		     const char **err);
/*
 * Reserves a frame of the fixed fields and tail_len more bytes, writes the
 * header and the fixed fields, and returns where the tail goes; the caller
 * fills it and calls repl_end_frame(b, l->fixed + tail_len).  NULL (errno
 * EINVAL, ENOMEM) leaves b unchanged.
 */
uint8_t *repl_begin_fields(struct buffer *b, const struct repl_layout *l, const void *host,
			   size_t tail_len);
/* A whole frame of fixed fields only. */
int repl_put_fields(struct buffer *b, const struct repl_layout *l, const void *host);
/* Decodes a frame of fixed fields only (its payload exactly l->fixed bytes). */
int repl_decode_fields(const struct repl_frame *f, const struct repl_layout *l, void *host,
		       const char **err);
/* Decodes the fixed fields of a frame that has more after them. */
int repl_decode_prefix(const struct repl_frame *f, const struct repl_layout *l, void *host,
		       const char **err);

#endif

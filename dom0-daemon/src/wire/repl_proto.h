/*
 * The replication wire protocol (versions 1 and 2) between a primary and a backup
 * remusdbd, as pure functions over byte buffers: framing, one encoder and
 * one decoder per message type, page encodings and the epoch checksum.
 * No sockets, no state beyond what the caller holds: repl_conn.c moves the
 * bytes, protection.c (primary) and replication_server.c (backup) run the
 * conversation.  docs/protocol.md is the byte-level reference.
 *
 * Why a framed binary protocol of our own: an epoch is megabytes of pages
 * that must reach the backup with as little copying and parsing as
 * possible, and the backup must be able to reject anything malformed
 * before it touches its replica.  Every frame is an 8-byte header
 * (be16 type, be16 flags, be32 payload length) and a payload of at most
 * REPL_MAX_PAYLOAD bytes, so a reader always knows how much to buffer and
 * can refuse a bad header before the payload arrives.
 *
 * Decoders validate a payload completely (every length, count, ordering
 * and string) so that callers can trust what they get; the structs they
 * fill point into the payload (except for short strings, copied into
 * fixed arrays so that they are NUL-terminated).  Encoders refuse to build
 * what the decoders would reject, so a bug on the primary shows up there
 * and not as a protocol error on the backup.
 *
 * Error messages (*err) are static strings or, when they carry numbers, a
 * thread-local buffer that the next call in the same thread overwrites.
 *
 * This header stays the protocol's one public face, while the code is split
 * by concern: repl_frame.c (framing), repl_text.c (text rules),
 * repl_fields.h/.c (each message's fixed fields, declared once, and their
 * one encoder, decoder and range check), repl_msg_session.c,
 * repl_msg_pages.c, repl_msg_disk.c (the messages), repl_coded.c
 * (PAGES_CODED records, builder, iterator) and repl_digest.c (the epoch
 * checksum).  Callers keep including this header alone.
 */
#ifndef REMUSDB_REPL_PROTO_H
#define REMUSDB_REPL_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <xxhash.h>

#include "base/buffer.h"

/*
 * The protocol versions this build speaks (docs/protocol.md, "Versions
 * and upgrades"): the primary offers the highest one the backup also
 * speaks (repl_version.h).  Version 2 is version 1 plus that negotiation;
 * version 3 is version 2 with the session's version bound into the AUTH
 * and AUTH_OK MACs (repl_auth.h); what follows the handshake is the same
 * in all three.  A test build overrides
 * the pair with -D (make remusdbd-proto) to play a daemon of other
 * versions.
 */
#ifndef REPL_PROTOCOL_MIN
#define REPL_PROTOCOL_MIN 1
#endif
#ifndef REPL_PROTOCOL_MAX
#define REPL_PROTOCOL_MAX 3
#endif
_Static_assert(REPL_PROTOCOL_MIN >= 1 && REPL_PROTOCOL_MIN <= REPL_PROTOCOL_MAX &&
	       REPL_PROTOCOL_MAX <= 0xffff, "the versions are a range within 1..65535");
#define REPL_HEADER_SIZE 8
#define REPL_MAX_PAYLOAD (16u << 20)
#define REPL_HELLO_MAGIC "RDBREPL" /* 8 bytes on the wire with its NUL */
#define REPL_HELLO_MAGIC_SIZE 8
#define REPL_NAME_MAX 64          /* HELLO host name */
#define REPL_TEXT_MAX 1024        /* ERROR reason, BYE text */
#define REPL_VM_CONFIG_MAX (1u << 20)
#define REPL_MAX_BLOCKS 64
#define REPL_PAGE_SIZE 4096
#define REPL_MAX_PAGES_PER_FRAME 4096
/*
 * A page index is a byte offset / 4096; anything above this would
 * overflow when turned back into an offset.
 */
#define REPL_MAX_PAGE_INDEX (UINT64_MAX / REPL_PAGE_SIZE)

enum repl_type {
	REPL_HELLO = 1,
	REPL_AUTH = 2,
	REPL_AUTH_OK = 3,
	REPL_ERROR = 4,
	REPL_VM_CONFIG = 5,
	REPL_RAM_LAYOUT = 6,
	REPL_PAGES = 7,
	REPL_DEVICE = 8,
	REPL_DISK_WRITE = 9,
	REPL_DISK_ZERO = 10,
	REPL_DISK_SYNC = 11,
	REPL_DISK_SYNC_DONE = 12,
	REPL_EPOCH_END = 13,
	REPL_EPOCH_ACK = 14,
	REPL_HEARTBEAT = 15,
	REPL_BYE = 16,
	/* Added at the end so that every frame above keeps its number. */
	REPL_PAGES_CODED = 17,
	REPL_PAGE_REQUEST = 18,
	REPL_PAGE_RESEND = 19,
	REPL_DEVICE_DELTA = 20,
	/* Commit protection's flow positions (cp_flow_msg.h). */
	REPL_FLOW_STATE = 21,
	REPL_FLOW_AHEAD = 22,
	/* The disk's base: what each side's image is, and what the copy sends. */
	REPL_DISK_BASE = 23,       /* primary -> backup, right after VM_CONFIG */
	REPL_DISK_PLAN = 24,       /* backup -> primary: full copy or resync */
};
#define REPL_TYPE_MIN REPL_HELLO
#define REPL_TYPE_MAX REPL_DISK_PLAN

enum repl_role { REPL_ROLE_PRIMARY = 1, REPL_ROLE_BACKUP = 2 };

enum repl_error_code {
	REPL_ERR_VERSION = 1,
	REPL_ERR_AUTH = 2,
	REPL_ERR_PROTOCOL = 3,
	REPL_ERR_BUSY = 4,     /* already protecting that VM */
	REPL_ERR_INTERNAL = 5,
	REPL_ERR_REFUSED = 6,
};

enum repl_bye_reason {
	REPL_BYE_UNPROTECT = 1,
	REPL_BYE_SHUTDOWN = 2,
	REPL_BYE_TAKEOVER = 3, /* the primary asks the backup to take over */
};

/*
 * How the data of a PAGES frame is encoded.  Adding one (XOR+RLE against
 * the previous version, LZ4) means: a value here, a case in the data
 * length check and in repl_pages_decode_page() (repl_msg_pages.c), and a
 * line in docs/protocol.md.  Callers never switch on encodings.
 */
enum repl_encoding {
	REPL_ENCODING_RAW = 0,  /* count * 4096 bytes, page after page */
	REPL_ENCODING_ZERO = 1, /* no data: every page is zero */
};

/*
 * How one page of a PAGES_CODED frame is coded.  Each kind has its own
 * data length rule (repl_coded_kind_length_ok), checked by the decoder,
 * so a handler of a kind never sees a length it cannot take.
 */
enum repl_page_kind {
	REPL_KIND_RAW = 0,      /* exactly 4096 bytes: the page */
	REPL_KIND_ZERO = 1,     /* no data: the page is all zeros */
	REPL_KIND_XOR_RLE = 2,  /* 0..REPL_CODED_MAX: delta against the committed page */
	REPL_KIND_LZ4 = 3,      /* 1..REPL_CODED_MAX: LZ4 of the page */
	REPL_KIND_DISK_REF = 4, /* 24 bytes: be64 disk offset, XXH3-128 (16 bytes, big-endian high||low) */
};
#define REPL_KIND_COUNT 5
/*
 * A coded page may exceed a page by this much (the codec's header), so
 * that a fully changed page never has to be refused.
 */
#define REPL_CODED_HEADER_MAX 64
#define REPL_CODED_MAX (REPL_PAGE_SIZE + REPL_CODED_HEADER_MAX)
#define REPL_DISK_REF_SIZE 24
/* be64 index, u8 kind, be64 checksum, be32 data length */
#define REPL_CODED_RECORD_HEADER 21
#define REPL_PAGES_CODED_FIXED 14 /* be64 epoch, be16 block, be32 count */

/* Why the backup asks for a page again (PAGE_REQUEST). */
enum repl_request_reason {
	REPL_REQ_CHECKSUM = 1,   /* decoded, but its XXH3-64 differs from the frame's */
	REPL_REQ_DISK_REF = 2,   /* the disk block's XXH3-128 did not match */
	REPL_REQ_UNDECODABLE = 3, /* a kind or data the backup cannot decode */
};

const char *repl_type_name(uint16_t type);
const char *repl_page_kind_name(uint8_t kind);
const char *repl_error_code_name(uint16_t code);

struct repl_frame {
	uint16_t type;
	uint16_t flags;
	uint32_t length;
	const uint8_t *payload;
};

/*
 * Parses one frame at the head of data: returns the bytes it takes (> 0)
 * with *out filled (payload points into data), 0 if more bytes are needed,
 * or -1 with *err set on a bad header (unknown type, flags != 0, length
 * over REPL_MAX_PAYLOAD).  A bad header is reported as soon as its 8 bytes
 * are there, without waiting for the payload.
 */
ssize_t repl_frame_parse(const uint8_t *data, size_t len, struct repl_frame *out,
			 const char **err);
/* The 8 header bytes of a frame (flags 0). */
void repl_encode_header(uint8_t header[REPL_HEADER_SIZE], uint16_t type, uint32_t length);
/*
 * Reserves a whole frame in b and writes its header; the caller fills the
 * payload and calls buffer_commit(b, REPL_HEADER_SIZE + length).  NULL
 * (errno EINVAL for a payload over REPL_MAX_PAYLOAD, ENOMEM) leaves b
 * unchanged.
 */
uint8_t *repl_begin_frame(struct buffer *b, uint16_t type, size_t length);

/* ---- messages ---------------------------------------------------------- */

struct repl_hello {
	/*
	 * Magic and version are the only fields that every version keeps in
	 * place.  Versions 1..REPL_PROTOCOL_MAX share the layout below; for a
	 * higher version the decoder fills only `version` (the rest is zero)
	 * and succeeds, so the caller can answer ERROR(REPL_ERR_VERSION):
	 * check it first.  A backup's HELLO carries the lowest version it
	 * speaks, a primary's the version it offers for the session.
	 */
	uint16_t version;
	uint8_t role; /* enum repl_role */
	uint8_t nonce[32];
	char name[REPL_NAME_MAX + 1]; /* 1..64 printable ASCII */
};

struct repl_error {
	uint16_t code;      /* enum repl_error_code */
	const char *reason; /* UTF-8, not NUL-terminated, no NUL inside */
	size_t reason_len;  /* 0..REPL_TEXT_MAX */
};

struct repl_ram_block {
	char name[256];  /* 1..255 bytes, no control characters */
	uint64_t length; /* bytes: a multiple of 4096, > 0 */
};

struct repl_ram_layout {
	uint32_t ram_section_id; /* != 0: docs/protocol.md, RAM_LAYOUT */
	char machine_type[256];  /* 1..255 bytes, no control characters */
	uint16_t block_count;    /* 1..REPL_MAX_BLOCKS */
	struct repl_ram_block blocks[REPL_MAX_BLOCKS]; /* distinct names */
};

struct repl_pages {
	uint64_t epoch;
	uint16_t block;   /* index into RAM_LAYOUT's blocks (< REPL_MAX_BLOCKS) */
	uint8_t encoding; /* enum repl_encoding */
	uint32_t count;   /* 1..REPL_MAX_PAGES_PER_FRAME */
	const uint8_t *page_indexes_be; /* count raw be64, strictly increasing */
	const uint8_t *data;            /* encoded page data */
	size_t data_len;
};

/*
 * A PAGES_CODED frame, validated: count records, each with its own kind,
 * indexes strictly increasing.  Read the records with repl_coded_iter.
 */
struct repl_pages_coded {
	uint64_t epoch;
	uint16_t block;  /* < REPL_MAX_BLOCKS */
	uint32_t count;  /* 1..REPL_MAX_PAGES_PER_FRAME */
	const uint8_t *records;
	size_t records_len;
};

struct repl_coded_page {
	uint64_t index;
	uint8_t kind;      /* enum repl_page_kind */
	uint64_t checksum; /* XXH3-64 of the page after decoding */
	const uint8_t *data;
	uint32_t len;      /* fits the kind's rule */
};

/* Walks the records of a decoded frame (already validated: no checks left). */
struct repl_coded_iter {
	const uint8_t *p;
	uint32_t left;
};

struct repl_page_request {
	uint64_t epoch;
	uint16_t block;
	uint64_t index;
	uint8_t reason; /* enum repl_request_reason */
};

struct repl_page_resend {
	uint64_t epoch;
	uint16_t block;
	uint64_t index;
	const uint8_t *data; /* REPL_PAGE_SIZE bytes */
};

struct repl_device {
	uint64_t epoch;
	uint64_t total;  /* length of the whole device blob (> 0) */
	uint64_t offset; /* of this chunk; offset + len <= total */
	const uint8_t *data;
	size_t len;      /* > 0 */
};

/*
 * The epoch's whole device blob, coded against the blob of the last epoch
 * the backup committed (device_delta.h has the records' format).  The
 * checksums make a wrong base or a wrong decode an error, never a wrong
 * device state.
 */
struct repl_device_delta {
	uint64_t epoch;
	uint64_t total;    /* the new blob's length (> 0) */
	uint64_t base_len; /* the base blob's length */
	uint64_t base_sum; /* XXH3-64 of the base blob */
	uint64_t sum;      /* XXH3-64 of the new blob */
	const uint8_t *records;
	size_t records_len;
};

struct repl_disk_write {
	uint64_t epoch;
	uint64_t offset;
	const uint8_t *data;
	size_t len; /* > 0; offset + len does not overflow */
};

struct repl_disk_zero {
	uint64_t epoch;
	uint64_t offset;
	uint64_t length; /* > 0; offset + length does not overflow */
};

struct repl_disk_sync {
	uint64_t offset;
	const uint8_t *data;
	size_t len; /* > 0; offset + len does not overflow */
};

/*
 * DISK_BASE: the primary's disk is generation base_generation's committed
 * state except for the marked extents (1 << REPL_DISK_EXTENT_SHIFT bytes
 * each); base_generation 0: it vouches for nothing.  The copy starts
 * generation `generation` (never 0).
 */
#define REPL_DISK_EXTENT_SHIFT 20
#define REPL_DISK_BASE_FULL_ASKED 1u /* the operator asked for a full copy */
struct repl_disk_base {
	uint64_t generation;
	uint64_t base_generation;
	uint32_t flags;
	uint64_t extent_count;
	const uint8_t *bits;       /* (extent_count + 7) / 8 bytes, bit i of byte i/8 */
};

/*
 * DISK_PLAN: the backup's answer.  resync: it holds the base generation
 * too, and the copy sends only the marked extents (the union of both
 * sides' marks); otherwise a full copy, and reason says why.
 */
struct repl_disk_plan {
	bool resync;
	uint64_t extent_count;
	const char *reason;        /* reason_len bytes of UTF-8 */
	size_t reason_len;
	const uint8_t *bits;       /* resync only: (extent_count + 7) / 8 bytes */
};

struct repl_epoch_end {
	uint64_t epoch;
	uint64_t pages;        /* pages sent in the epoch */
	uint64_t bytes;        /* repl_digest.bytes of the covered frames */
	uint64_t checksum;     /* repl_digest_value() of the covered frames */
	uint64_t timestamp_us; /* primary's CLOCK_MONOTONIC */
};

struct repl_heartbeat {
	uint64_t now_us; /* sender's CLOCK_MONOTONIC */
	uint64_t epoch;  /* primary: last epoch ended; backup: last committed */
};

struct repl_bye {
	uint8_t reason;   /* enum repl_bye_reason */
	const char *text; /* UTF-8, not NUL-terminated, no NUL inside */
	size_t text_len;  /* 0..REPL_TEXT_MAX */
};

/*
 * Encoders append one whole frame to b and return 0, or -1 with errno
 * EINVAL (arguments the decoder would reject) or ENOMEM, leaving b
 * unchanged.  Text that is too long for its field (ERROR reason, BYE
 * text) is cut at a UTF-8 character boundary rather than refused: an
 * error message must never fail to go out because it is long.
 */
int repl_put_hello(struct buffer *b, const struct repl_hello *h);
int repl_put_auth(struct buffer *b, uint16_t type /* AUTH or AUTH_OK */,
		  const uint8_t mac[32]);
int repl_put_error(struct buffer *b, uint16_t code, const char *reason);
int repl_put_vm_config(struct buffer *b, const char *json, size_t len);
int repl_put_ram_layout(struct buffer *b, const struct repl_ram_layout *l);
/* page_indexes: count host-order indexes, strictly increasing. */
int repl_put_pages(struct buffer *b, uint64_t epoch, uint16_t block, uint8_t encoding,
		   uint32_t count, const uint64_t *page_indexes, const uint8_t *data,
		   size_t data_len);
int repl_put_device(struct buffer *b, uint64_t epoch, uint64_t total, uint64_t offset,
		    const uint8_t *d, size_t n);
int repl_put_device_delta(struct buffer *b, const struct repl_device_delta *d);
int repl_put_disk_write(struct buffer *b, uint64_t epoch, uint64_t offset,
			const uint8_t *d, size_t n);
int repl_put_disk_zero(struct buffer *b, uint64_t epoch, uint64_t offset, uint64_t length);
int repl_put_disk_sync(struct buffer *b, uint64_t offset, const uint8_t *d, size_t n);
int repl_put_disk_sync_done(struct buffer *b, uint64_t size);
int repl_put_disk_base(struct buffer *b, const struct repl_disk_base *d);
/* reason is NUL-terminated text (cut to REPL_TEXT_MAX); bits NULL unless resync. */
int repl_put_disk_plan(struct buffer *b, const struct repl_disk_plan *p);
int repl_put_epoch_end(struct buffer *b, const struct repl_epoch_end *e);
int repl_put_epoch_ack(struct buffer *b, uint64_t epoch);
int repl_put_heartbeat(struct buffer *b, uint64_t now_us, uint64_t epoch);
int repl_put_bye(struct buffer *b, uint8_t reason, const char *text);
int repl_put_page_request(struct buffer *b, const struct repl_page_request *r);
int repl_put_page_resend(struct buffer *b, uint64_t epoch, uint16_t block, uint64_t index,
			 const uint8_t page[REPL_PAGE_SIZE]);

/*
 * PAGES_CODED is built one record at a time (the encoder decides each
 * page's kind as it goes): begin, then add records (repl_put_coded_page
 * appends one to the same buffer), then end, which writes the count and
 * the length.  Nothing else may be appended to b in between.
 */
struct repl_coded_builder {
	struct buffer *b;
	size_t frame_at; /* offset of the frame's header from buffer_head(b) */
	uint64_t epoch;
	uint16_t block;
	uint32_t count;
	uint64_t last_index;
};
/* 0, or -1 (EINVAL for a block >= REPL_MAX_BLOCKS, ENOMEM). */
int repl_coded_begin(struct repl_coded_builder *cb, struct buffer *b, uint64_t epoch,
		     uint16_t block);
/*
 * Appends one record to b (the pluggable page encoders call this): -1
 * with EINVAL when the kind's length rule or the index is wrong, ENOMEM.
 */
int repl_put_coded_page(struct buffer *b, uint64_t index, uint8_t kind, uint64_t checksum,
			const uint8_t *data, uint32_t len);
/*
 * Takes note of the record just appended since `before` (checks it is
 * one whole, valid record with an index above the previous one).
 * 0, or -1 (EINVAL) and the bytes are removed again.
 */
int repl_coded_note(struct repl_coded_builder *cb, size_t before);
/* Payload bytes so far. */
size_t repl_coded_payload_len(const struct repl_coded_builder *cb);
/* Finishes the frame; a frame without records is removed instead. */
void repl_coded_end(struct repl_coded_builder *cb);
/* Whether len bytes of data are allowed for kind. */
bool repl_coded_kind_length_ok(uint8_t kind, uint32_t len);

/*
 * Decoders check that f is of their type and its payload is valid in
 * every respect, then fill *out.  Return 0, or -1 with *err explaining
 * ("PAGES: count 0", ...).  Pointers in *out point into f->payload.
 */
int repl_decode_hello(const struct repl_frame *f, struct repl_hello *out, const char **err);
/* AUTH or AUTH_OK: *mac points at the 32 bytes in the payload. */
int repl_decode_auth(const struct repl_frame *f, const uint8_t **mac, const char **err);
int repl_decode_error(const struct repl_frame *f, struct repl_error *out, const char **err);
/* Checks size and UTF-8 only: the JSON is the caller's business. */
int repl_decode_vm_config(const struct repl_frame *f, const char **json, size_t *len,
			  const char **err);
int repl_decode_ram_layout(const struct repl_frame *f, struct repl_ram_layout *out,
			   const char **err);
int repl_decode_pages(const struct repl_frame *f, struct repl_pages *out, const char **err);
int repl_decode_device(const struct repl_frame *f, struct repl_device *out, const char **err);
int repl_decode_device_delta(const struct repl_frame *f, struct repl_device_delta *out,
			     const char **err);
int repl_decode_disk_write(const struct repl_frame *f, struct repl_disk_write *out,
			   const char **err);
int repl_decode_disk_zero(const struct repl_frame *f, struct repl_disk_zero *out,
			  const char **err);
int repl_decode_disk_sync(const struct repl_frame *f, struct repl_disk_sync *out,
			  const char **err);
int repl_decode_disk_sync_done(const struct repl_frame *f, uint64_t *size, const char **err);
int repl_decode_disk_base(const struct repl_frame *f, struct repl_disk_base *out,
			  const char **err);
int repl_decode_disk_plan(const struct repl_frame *f, struct repl_disk_plan *out,
			  const char **err);
int repl_decode_epoch_end(const struct repl_frame *f, struct repl_epoch_end *out,
			  const char **err);
int repl_decode_epoch_ack(const struct repl_frame *f, uint64_t *epoch, const char **err);
int repl_decode_heartbeat(const struct repl_frame *f, struct repl_heartbeat *out,
			  const char **err);
int repl_decode_bye(const struct repl_frame *f, struct repl_bye *out, const char **err);
int repl_decode_pages_coded(const struct repl_frame *f, struct repl_pages_coded *out,
			    const char **err);
void repl_coded_iter_init(struct repl_coded_iter *it, const struct repl_pages_coded *pc);
/* The next record; false after the last. */
bool repl_coded_iter_next(struct repl_coded_iter *it, struct repl_coded_page *out);
int repl_decode_page_request(const struct repl_frame *f, struct repl_page_request *out,
			     const char **err);
int repl_decode_page_resend(const struct repl_frame *f, struct repl_page_resend *out,
			    const char **err);

/* ---- page encodings ---------------------------------------------------- */

/* Page index i (0 <= i < count) of a decoded PAGES message. */
uint64_t repl_pages_index(const struct repl_pages *p, uint32_t i);
/*
 * Writes the content of page i of a decoded PAGES message to out, whatever
 * the encoding.  Returns 0, or -1 if i is out of range or the page does
 * not decode (possible with the compressed encodings to come).
 */
int repl_pages_decode_page(const struct repl_pages *p, uint32_t i,
			   uint8_t out[REPL_PAGE_SIZE]);

/* ---- epoch checksum ---------------------------------------------------- */

/*
 * XXH3-64 (seed 0) over the header and payload of each covered frame of
 * an epoch, in stream order, plus byte and frame counts.  Both sides feed
 * it the same bytes: the primary what it just encoded, the backup what it
 * parsed (header re-encoded, which gives the same 8 bytes since v1 flags
 * are always 0).
 */
struct repl_digest {
	XXH3_state_t *state;
	uint64_t bytes;  /* headers included */
	uint64_t frames;
};

/* Frames of these types count towards the epoch checksum. */
bool repl_type_is_covered(uint16_t type);
/* 0, or -1 (ENOMEM).  Starts reset. */
int repl_digest_init(struct repl_digest *d);
/* Safe on a zeroed struct and twice. */
void repl_digest_free(struct repl_digest *d);
/* Starts the next epoch. */
void repl_digest_reset(struct repl_digest *d);
/* Adds one frame unconditionally (the caller checked that it is covered). */
void repl_digest_add(struct repl_digest *d, const uint8_t *header8, const uint8_t *payload,
		     uint32_t len);
/* Backup side: adds a parsed frame if its type is covered; returns whether it did. */
bool repl_digest_add_frame(struct repl_digest *d, const struct repl_frame *f);
/*
 * Primary side: adds the covered frames among those appended to b after
 * its first `start` unread bytes, i.e. call with start = buffer_len(b)
 * taken before the repl_put_*().  Returns 0, or -1 (nothing added) if the
 * bytes from there are not whole, valid frames.
 */
int repl_digest_add_buffered(struct repl_digest *d, const struct buffer *b, size_t start);
uint64_t repl_digest_value(const struct repl_digest *d);

#endif

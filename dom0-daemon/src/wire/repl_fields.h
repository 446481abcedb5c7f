/*
 * The fixed fields of the replication messages (protocol v1 and v2), declared
 * once: each message's byte layout is a list below, and the encoders, the
 * decoders, their range checks and the test that holds docs/protocol.md to
 * the code all read it.  Formats only, no code (repl_fields.c turns the
 * lists into tables and reads and writes them).
 *
 * Why lists of macros rather than hand-written tables: one row gives the
 * wire offset and size, the host struct member it maps to (the compiler
 * fills in offsetof and sizeof, so a member renamed or resized cannot go
 * out of step) and the range the decoder accepts and the encoder refuses
 * to leave; the same row also yields an offset constant for the few
 * places that read a field by hand on a hot path (the PAGES_CODED
 * records).
 *
 * A row is F(S, bind, name, offset, size, min, max, range_error):
 *   S        the host struct, passed through from the list's caller
 *   bind     HOST   an integer member `name` of S (1..8 bytes, any width
 *                   that holds max); big-endian of `size` bytes on the wire
 *            BYTES  a uint8_t[size] member, copied as it is
 *            REF    a `const uint8_t *` member: the decoder points it into
 *                   the payload (no copy), the encoder copies size bytes
 *                   from it
 *            WIRE   not in S: the message's own code reads and writes it
 *                   (a length, the magic); the decoder still checks its
 *                   range
 *            CONST  not in S: always `min` (== max) on the wire
 *   min, max the accepted values (HOST, WIRE, CONST)
 *   range_error  printf format of the message for a value outside
 *            min..max, given (value, min, max) as unsigned long long; NULL
 *            when every value is accepted
 * Rows are in wire order and back to back; the list's FIXED is where the
 * last one ends (the unit tests check both).  Variable parts (strings,
 * page data, bitmaps) follow FIXED and stay hand-written.
 */
#ifndef REMUSDB_REPL_FIELDS_H
#define REMUSDB_REPL_FIELDS_H

#include <stdint.h>

#include "wire/cp_flow_msg.h"
#include "wire/repl_proto.h"

#define REPL_ANY 0, UINT64_MAX, NULL
#define REPL_STR(x) REPL_STR_(x)
#define REPL_STR_(x) #x
#define REPL_BLOCK_ERROR \
	"block index %llu is beyond the " REPL_STR(REPL_MAX_BLOCKS) " blocks a RAM_LAYOUT can have"
#define REPL_EXTENT_SHIFT_ERROR "extents of 2^%llu bytes, not 2^%llu"

/* ---- session -------------------------------------------------------- */

#define REPL_HELLO_FIELDS(F, S) \
	F(S, WIRE, magic, 0, REPL_HELLO_MAGIC_SIZE, REPL_ANY) \
	F(S, HOST, version, 8, 2, 1, REPL_PROTOCOL_MAX, "protocol version %llu is not %llu..%llu") \
	F(S, HOST, role, 10, 1, REPL_ROLE_PRIMARY, REPL_ROLE_BACKUP, "unknown role %llu") \
	F(S, BYTES, nonce, 11, 32, REPL_ANY) \
	F(S, WIRE, name_len, 43, 1, 1, REPL_NAME_MAX, "host name length %llu is not %llu..%llu")
#define REPL_HELLO_FIXED 44 /* then the host name */

/*
 * The messages of one field (AUTH, EPOCH_ACK, DISK_SYNC_DONE) have a
 * one-member host struct so that the row can name its member; it is laid
 * out as that member alone, so the codecs pass the member's address.
 */

/* AUTH and AUTH_OK: the MAC alone. */
struct repl_auth_fields {
	const uint8_t *mac;
};
#define REPL_AUTH_FIELDS(F, S) \
	F(S, REF, mac, 0, 32, REPL_ANY)
#define REPL_AUTH_FIXED 32

#define REPL_ERROR_FIELDS(F, S) \
	F(S, HOST, code, 0, 2, REPL_ERR_VERSION, REPL_ERR_REFUSED, "unknown error code %llu")
#define REPL_ERROR_FIXED 2 /* then the reason */

#define REPL_RAM_LAYOUT_FIELDS(F, S) \
	F(S, HOST, ram_section_id, 0, 4, 1, UINT32_MAX, \
	  "ram section id %llu (QEMU would match it to another section on restore)")
#define REPL_RAM_LAYOUT_FIXED 4 /* then the machine type and the blocks */

#define REPL_EPOCH_END_FIELDS(F, S) \
	F(S, HOST, epoch, 0, 8, REPL_ANY) \
	F(S, HOST, pages, 8, 8, REPL_ANY) \
	F(S, HOST, bytes, 16, 8, REPL_ANY) \
	F(S, HOST, checksum, 24, 8, REPL_ANY) \
	F(S, HOST, timestamp_us, 32, 8, REPL_ANY)
#define REPL_EPOCH_END_FIXED 40

struct repl_epoch_ack_fields {
	uint64_t epoch;
};
#define REPL_EPOCH_ACK_FIELDS(F, S) \
	F(S, HOST, epoch, 0, 8, REPL_ANY)
#define REPL_EPOCH_ACK_FIXED 8

#define REPL_HEARTBEAT_FIELDS(F, S) \
	F(S, HOST, now_us, 0, 8, REPL_ANY) \
	F(S, HOST, epoch, 8, 8, REPL_ANY)
#define REPL_HEARTBEAT_FIXED 16

#define REPL_BYE_FIELDS(F, S) \
	F(S, HOST, reason, 0, 1, REPL_BYE_UNPROTECT, REPL_BYE_TAKEOVER, "unknown reason %llu")
#define REPL_BYE_FIXED 1 /* then the text */

/* ---- pages and device state ----------------------------------------- */

#define REPL_PAGES_FIELDS(F, S) \
	F(S, HOST, epoch, 0, 8, REPL_ANY) \
	F(S, HOST, block, 8, 2, 0, REPL_MAX_BLOCKS - 1, REPL_BLOCK_ERROR) \
	F(S, HOST, encoding, 10, 1, REPL_ANY) \
	F(S, HOST, count, 11, 4, 1, REPL_MAX_PAGES_PER_FRAME, "count %llu is not %llu..%llu")
#define REPL_PAGES_FIXED 15 /* then the indexes and the data */

#define REPL_PAGES_CODED_FIELDS(F, S) \
	F(S, HOST, epoch, 0, 8, REPL_ANY) \
	F(S, HOST, block, 8, 2, 0, REPL_MAX_BLOCKS - 1, REPL_BLOCK_ERROR) \
	F(S, HOST, count, 10, 4, 1, REPL_MAX_PAGES_PER_FRAME, "count %llu is not %llu..%llu")
/* REPL_PAGES_CODED_FIXED (repl_proto.h) is where it ends: 14, then the records. */

/* One PAGES_CODED record; read by hand on the page path (repl_coded.c). */
#define REPL_CODED_RECORD_FIELDS(F, S) \
	F(S, HOST, index, 0, 8, 0, REPL_MAX_PAGE_INDEX, "page index %llu is out of range") \
	F(S, HOST, kind, 8, 1, REPL_ANY) \
	F(S, HOST, checksum, 9, 8, REPL_ANY) \
	F(S, HOST, len, 17, 4, REPL_ANY)
/* REPL_CODED_RECORD_HEADER (repl_proto.h) is where it ends: 21, then the data. */

#define REPL_PAGE_REQUEST_FIELDS(F, S) \
	F(S, HOST, epoch, 0, 8, REPL_ANY) \
	F(S, HOST, block, 8, 2, 0, REPL_MAX_BLOCKS - 1, "block index %llu is out of range") \
	F(S, HOST, index, 10, 8, 0, REPL_MAX_PAGE_INDEX, "page index %llu is out of range") \
	F(S, HOST, reason, 18, 1, REPL_REQ_CHECKSUM, REPL_REQ_UNDECODABLE, "unknown reason %llu")
#define REPL_PAGE_REQUEST_FIXED 19

#define REPL_PAGE_RESEND_FIELDS(F, S) \
	F(S, HOST, epoch, 0, 8, REPL_ANY) \
	F(S, HOST, block, 8, 2, 0, REPL_MAX_BLOCKS - 1, "block index %llu is out of range") \
	F(S, HOST, index, 10, 8, 0, REPL_MAX_PAGE_INDEX, "page index %llu is out of range") \
	F(S, REF, data, 18, REPL_PAGE_SIZE, REPL_ANY)
#define REPL_PAGE_RESEND_FIXED (18 + REPL_PAGE_SIZE)

#define REPL_DEVICE_FIELDS(F, S) \
	F(S, HOST, epoch, 0, 8, REPL_ANY) \
	F(S, HOST, total, 8, 8, REPL_ANY) \
	F(S, HOST, offset, 16, 8, REPL_ANY)
#define REPL_DEVICE_FIXED 24 /* then the chunk */

#define REPL_DEVICE_DELTA_FIELDS(F, S) \
	F(S, HOST, epoch, 0, 8, REPL_ANY) \
	F(S, HOST, total, 8, 8, 1, UINT64_MAX, "empty blob") \
	F(S, HOST, base_len, 16, 8, REPL_ANY) \
	F(S, HOST, base_sum, 24, 8, REPL_ANY) \
	F(S, HOST, sum, 32, 8, REPL_ANY)
#define REPL_DEVICE_DELTA_FIXED 40 /* then the records */

/* ---- disk ------------------------------------------------------------- */

#define REPL_DISK_WRITE_FIELDS(F, S) \
	F(S, HOST, epoch, 0, 8, REPL_ANY) \
	F(S, HOST, offset, 8, 8, REPL_ANY)
#define REPL_DISK_WRITE_FIXED 16 /* then the data */

#define REPL_DISK_ZERO_FIELDS(F, S) \
	F(S, HOST, epoch, 0, 8, REPL_ANY) \
	F(S, HOST, offset, 8, 8, REPL_ANY) \
	F(S, HOST, length, 16, 8, 1, UINT64_MAX, "length %llu")
#define REPL_DISK_ZERO_FIXED 24

#define REPL_DISK_SYNC_FIELDS(F, S) \
	F(S, HOST, offset, 0, 8, REPL_ANY)
#define REPL_DISK_SYNC_FIXED 8 /* then the data */

struct repl_disk_sync_done_fields {
	uint64_t size;
};
#define REPL_DISK_SYNC_DONE_FIELDS(F, S) \
	F(S, HOST, size, 0, 8, REPL_ANY)
#define REPL_DISK_SYNC_DONE_FIXED 8

#define REPL_DISK_BASE_FIELDS(F, S) \
	F(S, HOST, generation, 0, 8, 1, UINT64_MAX, "generation %llu") \
	F(S, HOST, base_generation, 8, 8, REPL_ANY) \
	F(S, CONST, extent_shift, 16, 4, REPL_DISK_EXTENT_SHIFT, REPL_DISK_EXTENT_SHIFT, \
	  REPL_EXTENT_SHIFT_ERROR) \
	F(S, HOST, flags, 20, 4, 0, REPL_DISK_BASE_FULL_ASKED, "unknown flags 0x%llx") \
	F(S, HOST, extent_count, 24, 8, REPL_ANY)
#define REPL_DISK_BASE_FIXED 32 /* then the bitmap */
/* A bitmap that fits one frame: 16 MiB of bits is a 128 TiB disk at 1 MiB. */
#define REPL_DISK_MAX_EXTENTS \
	((uint64_t)(REPL_MAX_PAYLOAD - REPL_DISK_BASE_FIXED - REPL_TEXT_MAX) * 8)

#define REPL_DISK_PLAN_FIELDS(F, S) \
	F(S, WIRE, mode, 0, 1, 0, 1, "unknown mode %llu") \
	F(S, CONST, pad, 1, 1, 0, 0, "padding byte %llu is not 0") \
	F(S, WIRE, reason_len, 2, 2, REPL_ANY) \
	F(S, CONST, extent_shift, 4, 4, REPL_DISK_EXTENT_SHIFT, REPL_DISK_EXTENT_SHIFT, \
	  REPL_EXTENT_SHIFT_ERROR) \
	F(S, HOST, extent_count, 8, 8, 1, REPL_DISK_MAX_EXTENTS, "%llu extents")
#define REPL_DISK_PLAN_FIXED 16 /* then the reason and the bitmap */

/* ---- commit protection's flows (cp_flow_msg.h) ------------------------ */

/* A flow key, as FLOW_STATE's records and FLOW_AHEAD carry it, from `at`. */
#define REPL_FLOW_KEY_FIELDS(F, S, at) \
	F(S, HOST, key.family, (at), 1, REPL_ANY) \
	F(S, BYTES, key.src, (at) + 1, 16, REPL_ANY) \
	F(S, BYTES, key.dst, (at) + 17, 16, REPL_ANY) \
	F(S, HOST, key.sport, (at) + 33, 2, REPL_ANY) \
	F(S, HOST, key.dport, (at) + 35, 2, REPL_ANY)

#define REPL_FLOW_STATE_FIELDS(F, S) \
	F(S, HOST, epoch, 0, 8, REPL_ANY) \
	F(S, HOST, count, 8, 4, 1, CP_FLOW_MSG_STATE_MAX_RECORDS, \
	  "record count 0 or over " REPL_STR(CP_FLOW_MSG_STATE_MAX_RECORDS))
/* CP_FLOW_MSG_STATE_FIXED (cp_flow_msg.h) is where it ends: 12, then the records. */

#define REPL_FLOW_RECORD_FIELDS(F, S) \
	REPL_FLOW_KEY_FIELDS(F, S, 0) \
	F(S, HOST, sent_end, 37, 4, REPL_ANY) \
	F(S, HOST, ack, 41, 4, REPL_ANY) \
	F(S, BYTES, guest_mac, 45, 6, REPL_ANY) \
	F(S, BYTES, peer_mac, 51, 6, REPL_ANY) \
	F(S, HOST, flags, 57, 1, 0, CP_FLOW_MSG_FORGET, "a record has unknown flags")
/* CP_FLOW_MSG_RECORD_SIZE (cp_flow_msg.h): 58. */

#define REPL_FLOW_AHEAD_FIELDS(F, S) \
	F(S, HOST, epoch, 0, 8, REPL_ANY) \
	REPL_FLOW_KEY_FIELDS(F, S, 8) \
	F(S, HOST, released_end, 45, 4, REPL_ANY) \
	F(S, BYTES, guest_mac, 49, 6, REPL_ANY) \
	F(S, BYTES, peer_mac, 55, 6, REPL_ANY)
/* CP_FLOW_MSG_AHEAD_SIZE (cp_flow_msg.h): 61. */

/* ---- offsets for the code that reads a field by hand ------------------ */

#define REPL_FIELD_AT(S, bind, name, offset, ...) S##_AT_##name = (offset),
enum repl_hello_at { REPL_HELLO_FIELDS(REPL_FIELD_AT, REPL_HELLO) };
enum repl_coded_record_at { REPL_CODED_RECORD_FIELDS(REPL_FIELD_AT, REPL_CODED) };
enum repl_pages_coded_at { REPL_PAGES_CODED_FIELDS(REPL_FIELD_AT, REPL_PAGES_CODED) };
enum repl_disk_plan_at { REPL_DISK_PLAN_FIELDS(REPL_FIELD_AT, REPL_DISK_PLAN) };

/* ---- the tables (repl_fields.c) --------------------------------------- */

enum repl_field_bind {
	REPL_BIND_HOST,
	REPL_BIND_BYTES,
	REPL_BIND_REF,
	REPL_BIND_WIRE,
	REPL_BIND_CONST,
};

struct repl_field {
	const char *name;
	uint8_t bind;           /* enum repl_field_bind */
	uint16_t offset;        /* on the wire, from the payload's start */
	uint16_t size;          /* on the wire */
	uint16_t host_offset;   /* HOST, BYTES, REF: the member in the host struct */
	uint16_t host_size;
	uint64_t min, max;
	const char *range_error;
};

struct repl_layout {
	/*
	 * The message's name as its heading in docs/protocol.md says it
	 * ("### 18 PAGE_REQUEST"), and which of the offset tables under that
	 * heading (0: the first) is this one's.
	 */
	const char *doc_name;
	unsigned doc_table;
	uint16_t type;          /* enum repl_type; a record's: the frame it is in */
	uint16_t fixed;         /* bytes of fixed fields */
	const struct repl_field *fields;
	unsigned count;
};

extern const struct repl_layout repl_hello_layout, repl_auth_layout, repl_error_layout,
	repl_ram_layout_layout, repl_epoch_end_layout, repl_epoch_ack_layout,
	repl_heartbeat_layout, repl_bye_layout, repl_pages_layout, repl_pages_coded_layout,
	repl_coded_record_layout, repl_page_request_layout, repl_page_resend_layout,
	repl_device_layout, repl_device_delta_layout, repl_disk_write_layout,
	repl_disk_zero_layout, repl_disk_sync_layout, repl_disk_sync_done_layout,
	repl_disk_base_layout, repl_disk_plan_layout, repl_flow_state_layout,
	repl_flow_record_layout, repl_flow_ahead_layout;

/* Every layout above, for the tests that hold them to the documentation. */
extern const struct repl_layout *const repl_layouts[];
extern const unsigned repl_layout_count;

#endif

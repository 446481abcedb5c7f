/*
 * The NBD wire protocol (fixed newstyle handshake, simple and structured
 * replies, the base:allocation metadata context),
 * as pure functions over byte buffers: no sockets, no state.  Keeping it
 * free of I/O lets the unit tests and the fuzzer drive every parser with
 * arbitrary bytes.  Reference: doc/proto.md of the NetworkBlockDevice
 * project.  All integers on the wire are big-endian.
 */
#ifndef REMUSDB_NBD_PROTO_H
#define REMUSDB_NBD_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define NBD_MAGIC_NBDMAGIC 0x4e42444d41474943ULL /* "NBDMAGIC" */
#define NBD_MAGIC_IHAVEOPT 0x49484156454f5054ULL /* "IHAVEOPT" */
#define NBD_MAGIC_OPTION_REPLY 0x0003e889045565a9ULL
#define NBD_MAGIC_REQUEST 0x25609513U
#define NBD_MAGIC_SIMPLE_REPLY 0x67446698U
#define NBD_MAGIC_STRUCTURED_REPLY 0x668e33efU

/* Handshake flags (server) and client flags (same bit meanings). */
#define NBD_FLAG_FIXED_NEWSTYLE (1U << 0)
#define NBD_FLAG_NO_ZEROES (1U << 1)
#define NBD_FLAG_C_FIXED_NEWSTYLE NBD_FLAG_FIXED_NEWSTYLE
#define NBD_FLAG_C_NO_ZEROES NBD_FLAG_NO_ZEROES
#define NBD_SERVER_HANDSHAKE_FLAGS (NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES)

/* Transmission flags. */
#define NBD_FLAG_HAS_FLAGS (1U << 0)
#define NBD_FLAG_READ_ONLY (1U << 1)
#define NBD_FLAG_SEND_FLUSH (1U << 2)
#define NBD_FLAG_SEND_FUA (1U << 3)
#define NBD_FLAG_ROTATIONAL (1U << 4)
#define NBD_FLAG_SEND_TRIM (1U << 5)
#define NBD_FLAG_SEND_WRITE_ZEROES (1U << 6)
#define NBD_FLAG_SEND_DF (1U << 7)
#define NBD_FLAG_CAN_MULTI_CONN (1U << 8)
#define NBD_SERVER_TRANSMISSION_FLAGS                                        \
	(NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA |      \
	 NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES)

/* Options. */
#define NBD_OPT_EXPORT_NAME 1U
#define NBD_OPT_ABORT 2U
#define NBD_OPT_LIST 3U
#define NBD_OPT_PEEK_EXPORT 4U
#define NBD_OPT_STARTTLS 5U
#define NBD_OPT_INFO 6U
#define NBD_OPT_GO 7U
#define NBD_OPT_STRUCTURED_REPLY 8U
#define NBD_OPT_LIST_META_CONTEXT 9U
#define NBD_OPT_SET_META_CONTEXT 10U

/* Option reply types. */
#define NBD_REP_ACK 1U
#define NBD_REP_SERVER 2U
#define NBD_REP_INFO 3U
#define NBD_REP_META_CONTEXT 4U
#define NBD_REP_FLAG_ERROR (1U << 31)
#define NBD_REP_ERR_UNSUP (NBD_REP_FLAG_ERROR | 1U)
#define NBD_REP_ERR_POLICY (NBD_REP_FLAG_ERROR | 2U)
#define NBD_REP_ERR_INVALID (NBD_REP_FLAG_ERROR | 3U)
#define NBD_REP_ERR_PLATFORM (NBD_REP_FLAG_ERROR | 4U)
#define NBD_REP_ERR_TLS_REQD (NBD_REP_FLAG_ERROR | 5U)
#define NBD_REP_ERR_UNKNOWN (NBD_REP_FLAG_ERROR | 6U)
#define NBD_REP_ERR_SHUTDOWN (NBD_REP_FLAG_ERROR | 7U)
#define NBD_REP_ERR_BLOCK_SIZE_REQD (NBD_REP_FLAG_ERROR | 8U)
#define NBD_REP_ERR_TOO_BIG (NBD_REP_FLAG_ERROR | 9U)

/* Information types of NBD_OPT_INFO / NBD_OPT_GO. */
#define NBD_INFO_EXPORT 0U
#define NBD_INFO_NAME 1U
#define NBD_INFO_DESCRIPTION 2U
#define NBD_INFO_BLOCK_SIZE 3U

/* Commands and command flags. */
#define NBD_CMD_READ 0U
#define NBD_CMD_WRITE 1U
#define NBD_CMD_DISC 2U
#define NBD_CMD_FLUSH 3U
#define NBD_CMD_TRIM 4U
#define NBD_CMD_CACHE 5U
#define NBD_CMD_WRITE_ZEROES 6U
#define NBD_CMD_BLOCK_STATUS 7U
#define NBD_CMD_RESIZE 8U
#define NBD_CMD_FLAG_FUA (1U << 0)
#define NBD_CMD_FLAG_NO_HOLE (1U << 1)
#define NBD_CMD_FLAG_DF (1U << 2)
#define NBD_CMD_FLAG_REQ_ONE (1U << 3)
#define NBD_CMD_FLAG_FAST_ZERO (1U << 4)

/* Structured reply chunks: flags and types. */
#define NBD_REPLY_FLAG_DONE (1U << 0)
#define NBD_REPLY_TYPE_NONE 0U
#define NBD_REPLY_TYPE_OFFSET_DATA 1U
#define NBD_REPLY_TYPE_OFFSET_HOLE 2U
#define NBD_REPLY_TYPE_BLOCK_STATUS 5U
#define NBD_REPLY_TYPE_ERROR ((1U << 15) + 1)
#define NBD_REPLY_TYPE_ERROR_OFFSET ((1U << 15) + 2)

/* The one metadata context we offer, and its status flags. */
#define NBD_CONTEXT_BASE_ALLOCATION "base:allocation"
#define NBD_STATE_HOLE (1U << 0)
#define NBD_STATE_ZERO (1U << 1)

/* Error values of replies (not the host's errno numbers). */
#define NBD_EPERM 1U
#define NBD_EIO 5U
#define NBD_ENOMEM 12U
#define NBD_EINVAL 22U
#define NBD_ENOSPC 28U
#define NBD_EOVERFLOW 75U
#define NBD_ENOTSUP 95U
#define NBD_ESHUTDOWN 108U

/* Sizes on the wire. */
#define NBD_GREETING_SIZE 18          /* NBDMAGIC, IHAVEOPT, flags */
#define NBD_CLIENT_FLAGS_SIZE 4
#define NBD_OPTION_HEADER_SIZE 16     /* IHAVEOPT, option, length */
#define NBD_OPTION_REPLY_HEADER_SIZE 20
#define NBD_REQUEST_SIZE 28
#define NBD_SIMPLE_REPLY_SIZE 16
#define NBD_EXPORT_NAME_REPLY_SIZE 134 /* size, flags, 124 zeros */
#define NBD_INFO_EXPORT_SIZE 12
#define NBD_INFO_BLOCK_SIZE_SIZE 14
#define NBD_STRUCTURED_REPLY_HEADER_SIZE 20 /* magic, flags, type, cookie, length */
#define NBD_BLOCK_DESCRIPTOR_SIZE 8          /* extent length, status flags */
#define NBD_ERROR_CHUNK_FIXED_SIZE 6         /* error, message length */

/*
 * Limits we impose.  32 MiB is the payload size every NBD client assumes
 * when no NBD_INFO_BLOCK_SIZE was exchanged, and the maximum we advertise.
 * Option payloads carry at most a 4 KiB name plus a few info requests.
 */
#define NBD_MAX_PAYLOAD (32U * 1024 * 1024)
#define NBD_MAX_OPTION_LENGTH 8192U
#define NBD_MAX_NAME_LENGTH 4096U
#define NBD_PREFERRED_BLOCK_SIZE 4096U
/* Error messages in error chunks are cut to this (the spec allows 4096). */
#define NBD_MAX_ERROR_MESSAGE 256U

enum nbd_parse_result {
	NBD_PARSE_MALFORMED = -1, /* close the connection; *reason says why */
	NBD_PARSE_NEED_MORE = 0,  /* wait for more bytes */
	NBD_PARSE_OK = 1,         /* *out filled, the returned size consumed */
};

struct nbd_option_header {
	uint32_t option;
	uint32_t length; /* payload bytes that follow the header */
};

struct nbd_request {
	uint16_t flags;
	uint16_t type;
	uint64_t handle; /* "cookie": echoed back unchanged */
	uint64_t offset;
	uint32_t length;
};

/* Payload of NBD_OPT_INFO / NBD_OPT_GO; pointers borrow the input. */
struct nbd_info_request {
	const uint8_t *name; /* not NUL-terminated */
	uint32_t name_length;
	uint16_t info_count;
	const uint8_t *info_types; /* info_count big-endian u16s */
};

/* Reads the client's 4-byte flags; unknown bits are malformed. */
int nbd_parse_client_flags(const uint8_t *buf, size_t len, uint32_t *flags,
			   const char **reason);
int nbd_parse_option_header(const uint8_t *buf, size_t len,
			    struct nbd_option_header *out, const char **reason);
/* data/len is a complete option payload; NEED_MORE is never returned. */
int nbd_parse_info_request(const uint8_t *data, uint32_t len,
			   struct nbd_info_request *out, const char **reason);
int nbd_info_requested(const struct nbd_info_request *req, uint16_t info_type);

/*
 * Payload of NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT: export
 * name, query count, then each query as a 32-bit length and its bytes.
 * The parser checks every query's framing, so that walking them with
 * nbd_meta_request_next() cannot run past the payload.
 */
struct nbd_meta_request {
	const uint8_t *name; /* not NUL-terminated */
	uint32_t name_length;
	uint32_t query_count;
	const uint8_t *queries; /* query_count (be32 length, bytes) pairs */
	uint32_t queries_length;
};

/* data/len is a complete option payload; NEED_MORE is never returned. */
int nbd_parse_meta_request(const uint8_t *data, uint32_t len,
			   struct nbd_meta_request *out, const char **reason);
/*
 * Walks a parsed request's queries.  *pos starts at 0.  Returns 1 with
 * the next query in *query and *length, 0 after the last one.
 */
int nbd_meta_request_next(const struct nbd_meta_request *req, uint32_t *pos,
			  const uint8_t **query, uint32_t *length);
/*
 * Whether a query names base:allocation: exactly that name, or, when
 * listing (not when selecting, as the spec asks), the "base:" wildcard.
 */
int nbd_meta_query_selects_allocation(const uint8_t *query, uint32_t length,
				      int listing);
/* Checks only the framing (magic); nbd_validate_request checks meaning. */
int nbd_parse_request(const uint8_t *buf, size_t len, struct nbd_request *out,
		      const char **reason);

/*
 * What the connection negotiated, for nbd_validate_request: commands and
 * flags that depend on an option are refused without it.
 */
#define NBD_NEGOTIATED_STRUCTURED (1U << 0)   /* NBD_OPT_STRUCTURED_REPLY */
#define NBD_NEGOTIATED_BLOCK_STATUS (1U << 1) /* base:allocation selected */

enum nbd_verdict {
	NBD_VERDICT_OK,    /* execute it */
	NBD_VERDICT_ERROR, /* well-formed but refused: reply with *error */
	NBD_VERDICT_CLOSE, /* framing cannot be trusted: close the connection */
};

/* Bytes of payload that follow the request header (WRITE only). */
uint32_t nbd_request_payload_length(const struct nbd_request *req);
/*
 * Judges a request against an export of export_size bytes on a
 * connection that negotiated `negotiated` (NBD_NEGOTIATED_*).  A verdict
 * of ERROR still requires consuming the payload before replying.
 */
enum nbd_verdict nbd_validate_request(const struct nbd_request *req,
				      uint64_t export_size, unsigned negotiated,
				      uint32_t *error, const char **reason);

const char *nbd_command_name(uint16_t type);
const char *nbd_option_name(uint32_t option);

/* Encoders: write exactly the returned number of bytes into out. */
size_t nbd_encode_greeting(uint8_t out[NBD_GREETING_SIZE]);
/* The 20-byte header; the caller appends `length` bytes of payload. */
size_t nbd_encode_option_reply_header(uint8_t out[NBD_OPTION_REPLY_HEADER_SIZE],
				      uint32_t option, uint32_t reply_type,
				      uint32_t length);
/* NBD_REP_SERVER payload: name length + name.  Needs 4 + name_length bytes. */
size_t nbd_encode_rep_server(uint8_t *out, const char *name, uint32_t name_length);
size_t nbd_encode_info_export(uint8_t out[NBD_INFO_EXPORT_SIZE], uint64_t size,
			      uint16_t transmission_flags);
size_t nbd_encode_info_block_size(uint8_t out[NBD_INFO_BLOCK_SIZE_SIZE],
				  uint32_t minimum, uint32_t preferred,
				  uint32_t maximum);
/* Reply to NBD_OPT_EXPORT_NAME: 10 bytes, or 134 without NO_ZEROES. */
size_t nbd_encode_export_name_reply(uint8_t out[NBD_EXPORT_NAME_REPLY_SIZE],
				    uint64_t size, uint16_t transmission_flags,
				    int no_zeroes);
size_t nbd_encode_simple_reply(uint8_t out[NBD_SIMPLE_REPLY_SIZE], uint32_t error,
			       uint64_t handle);
/* The 20-byte chunk header; `length` bytes of payload follow it. */
size_t nbd_encode_structured_header(uint8_t out[NBD_STRUCTURED_REPLY_HEADER_SIZE],
				    uint16_t flags, uint16_t type, uint64_t handle,
				    uint32_t length);
/*
 * A whole final NBD_REPLY_TYPE_ERROR chunk: header, error, message (cut
 * to NBD_MAX_ERROR_MESSAGE).  out needs NBD_STRUCTURED_REPLY_HEADER_SIZE +
 * NBD_ERROR_CHUNK_FIXED_SIZE + NBD_MAX_ERROR_MESSAGE bytes.
 */
size_t nbd_encode_error_chunk(uint8_t *out, uint64_t handle, uint32_t error,
			      const char *message);
/* One block status descriptor. */
size_t nbd_encode_block_descriptor(uint8_t out[NBD_BLOCK_DESCRIPTOR_SIZE],
				   uint32_t length, uint32_t status);
/* NBD_REP_META_CONTEXT payload: id + name.  Needs 4 + name_length bytes. */
size_t nbd_encode_meta_context(uint8_t *out, uint32_t context_id,
			       const char *name, uint32_t name_length);
/* Maps a host errno value to the NBD error sent to the client. */
uint32_t nbd_error_from_errno(int err);

#endif

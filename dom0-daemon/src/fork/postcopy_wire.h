/*
 * The bytes of a postcopy migration source, for a clone QEMU started with
 * `-incoming defer` and the `postcopy-ram` capability (docs/fork.md):
 *
 *   preamble: header, CONFIGURATION, OPEN_RETURN_PATH, POSTCOPY_ADVISE
 *     (be64 page-size summary, be64 target page size), ram START section
 *     (MEM_SIZE + block list, EOS, footer), one RAM_DISCARD per block
 *     covering all of it, PACKAGED (LISTEN, the device blob without its
 *     EOF byte, RUN);
 *   then ram PART sections of pages, in any order, as requested or pushed;
 *   finally a ram END section (EOS, footer) and EOF.
 *
 * The clone answers on the same socket (QEMU's return path): be16 type,
 * be16 length, payload.  REQ_PAGES_ID names a block, REQ_PAGES reuses the
 * last named one; SHUT ends the return path (be32 error, 0 = fine).
 *
 * Checked against QEMU 7.2's savevm.c (loadvm_postcopy_handle_advise,
 * loadvm_postcopy_ram_handle_discard, loadvm_handle_cmd_packaged) and
 * migration.c (source_return_path_thread, rp_cmd_args).
 */
#ifndef REMUSDB_POSTCOPY_WIRE_H
#define REMUSDB_POSTCOPY_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "base/buffer.h"
#include "image/ram_image.h"

/* savevm.c enum qemu_vm_cmd */
#define MIG_CMD_OPEN_RETURN_PATH 1
#define MIG_CMD_POSTCOPY_ADVISE 3
#define MIG_CMD_POSTCOPY_LISTEN 4
#define MIG_CMD_POSTCOPY_RUN 5
#define MIG_CMD_POSTCOPY_RAM_DISCARD 6
#define MIG_CMD_PACKAGED 7

/* migration.h enum mig_rp_message_type */
enum pcw_rp_type {
	PCW_RP_SHUT = 1,
	PCW_RP_PONG = 2,
	PCW_RP_REQ_PAGES_ID = 3,
	PCW_RP_REQ_PAGES = 4,
	PCW_RP_RECV_BITMAP = 5,
	PCW_RP_RESUME_ACK = 6,
};

/*
 * Appends the preamble.  -1 with a reason in err: an image without a
 * device blob (nothing to resume from), a blob that does not end with the
 * EOF byte, or one larger than QEMU's packaged limit; or out of memory.
 */
int pcw_preamble(struct buffer *b, const struct ram_image *img, char *err,
		 size_t errlen);
/*
 * Appends a ram PART section carrying pages [first, first + count) of
 * block `block`: PAGE records for written non-zero pages, ZERO records
 * for the rest (never-written pages cost no memory read).  -1 when out of
 * memory or out of range.
 */
int pcw_pages(struct buffer *b, const struct ram_image *img, unsigned block,
	      uint64_t first, uint64_t count);
/* Appends the ram END section and EOF: nothing more will be sent. */
int pcw_finish(struct buffer *b, const struct ram_image *img);

/* ---- the return path ---------------------------------------------------- */

struct pcw_rp_callbacks {
	void *opaque;
	/* block is the last block named; start/len in bytes.  Nonzero stops. */
	int (*on_request)(void *opaque, const char *block, uint64_t start,
			  uint32_t len);
	int (*on_shut)(void *opaque, uint32_t error);
};

struct pcw_rp_parser {
	struct pcw_rp_callbacks cb;
	uint8_t msg[4 + 0xffff];
	size_t have;
	char block[256]; /* "" until a REQ_PAGES_ID named one */
	char error[160]; /* sticky */
};

void pcw_rp_init(struct pcw_rp_parser *p, const struct pcw_rp_callbacks *cb);
/*
 * Consumes all of data; 0, or -1 with a message in p->error (unknown or
 * malformed message, REQ_PAGES before any block was named, a callback that
 * refused).  Errors are sticky.
 */
int pcw_rp_feed(struct pcw_rp_parser *p, const uint8_t *data, size_t len);

#endif

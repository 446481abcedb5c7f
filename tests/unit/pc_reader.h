/*
 * Test helper: the clone's side of a postcopy migration (postcopy_wire.h).
 *
 * A bounds-checked cursor over received bytes, and a reader that parses
 * what remusdbd sends a clone QEMU item by item (header, CONFIGURATION,
 * COMMANDs with PACKAGED, ram sections of PAGE/ZERO records, EOF),
 * checking every page against the image being served and recording the
 * order pages arrived in.  Incremental: an item not yet complete is left
 * for the next call.  Independent of colo_stream, which refuses the
 * postcopy commands.
 */
#ifndef REMUSDB_TEST_PC_READER_H
#define REMUSDB_TEST_PC_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buffer.h"
#include "image/ram_image.h"
#include "fork/snapshot_capture.h"

struct cur {
	const uint8_t *p;
	size_t len, pos;
	bool short_read; /* a read went past len; reads then return 0 */
};

uint8_t cur_u8(struct cur *c);
uint16_t cur_be16(struct cur *c);
uint32_t cur_be32(struct cur *c);
uint64_t cur_be64(struct cur *c);
/* NULL (and short_read) when fewer than n bytes are left. */
const uint8_t *cur_bytes(struct cur *c, size_t n);
/* u8 length + name into out (NUL-terminated). */
void cur_name(struct cur *c, char out[256]);

struct pc_reader {
	const struct ram_image *img; /* the snapshot served (borrowed) */
	struct buffer in;            /* received, not parsed yet */
	bool header, preamble_done, end_section, eof;
	unsigned commands[16];       /* COMMAND items by number */
	char block[256];             /* the CONTINUE block */
	uint64_t *arrival;           /* per page (all blocks): 1-based order, 0 = not yet */
	struct page_ref *order;      /* pages in arrival order */
	uint64_t received, pages_total;
	char error[256];             /* first problem; parsing stops there */
};

void pc_reader_init(struct pc_reader *r, const struct ram_image *img);
void pc_reader_free(struct pc_reader *r);
/* Appends what fd has (non-blocking); returns the read's result (0 = EOF). */
ssize_t pc_reader_read(struct pc_reader *r, int fd);
/* Parses every complete item in r->in; false once r->error is set. */
bool pc_reader_parse(struct pc_reader *r);
/* 1-based arrival index of a page, 0 when it has not arrived. */
uint64_t pc_reader_arrival(const struct pc_reader *r, unsigned block, uint64_t page);

/*
 * An image for the postcopy tests: blocks "pc.ram" and "vga.vram" of the
 * given sizes, machine "pc-i440fx-7.2", ram section id 3.  Page p of each
 * block: p % 3 == 0 written with data (never all zero), 1 written with
 * zero bytes (its written bit set), 2 never written.  With a blob: a device state ending in EOF.
 */
struct ram_image *pc_test_image(uint64_t pages0, uint64_t pages1, bool blob);
void pc_test_fill(uint8_t *page, unsigned block, uint64_t index);
extern const uint8_t pc_test_blob[];
extern const size_t pc_test_blob_len;

#endif

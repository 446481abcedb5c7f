/* The clone's side of a postcopy migration, for tests; see pc_reader.h. */
#include "pc_reader.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/be.h"
#include "qemu/migration_writer.h"
#include "fork/postcopy_wire.h"

/* ---- cursor ---------------------------------------------------------------- */

const uint8_t *cur_bytes(struct cur *c, size_t n)
{
	if (c->short_read || c->len - c->pos < n) {
		c->short_read = true;
		return NULL;
	}
	c->pos += n;
	return c->p + c->pos - n;
}

uint8_t cur_u8(struct cur *c)
{
	const uint8_t *p = cur_bytes(c, 1);

	return p ? p[0] : 0;
}

uint16_t cur_be16(struct cur *c)
{
	const uint8_t *p = cur_bytes(c, 2);

	return p ? load_be16(p) : 0;
}

uint32_t cur_be32(struct cur *c)
{
	const uint8_t *p = cur_bytes(c, 4);

	return p ? load_be32(p) : 0;
}

uint64_t cur_be64(struct cur *c)
{
	const uint8_t *p = cur_bytes(c, 8);

	return p ? load_be64(p) : 0;
}

void cur_name(struct cur *c, char out[256])
{
	uint8_t n = cur_u8(c);
	const uint8_t *p = cur_bytes(c, n);

	out[0] = 0;
	if (p) {
		memcpy(out, p, n);
		out[n] = 0;
	}
}

/* ---- reader ---------------------------------------------------------------- */

void pc_reader_init(struct pc_reader *r, const struct ram_image *img)
{
	memset(r, 0, sizeof(*r));
	r->img = img;
	buffer_init(&r->in);
	r->pages_total = ram_image_pages_total(img);
	r->arrival = calloc(r->pages_total, sizeof(*r->arrival));
	r->order = calloc(r->pages_total, sizeof(*r->order));
	if (!r->arrival || !r->order)
		snprintf(r->error, sizeof(r->error), "out of memory");
}

void pc_reader_free(struct pc_reader *r)
{
	buffer_free(&r->in);
	free(r->arrival);
	free(r->order);
}

ssize_t pc_reader_read(struct pc_reader *r, int fd)
{
	ssize_t n = buffer_read_fd(&r->in, fd, 1 << 20);

	return n < 0 && errno == EAGAIN ? -1 : n;
}

static bool fail(struct pc_reader *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static bool fail(struct pc_reader *r, const char *fmt, ...)
{
	va_list ap;

	if (!r->error[0]) {
		va_start(ap, fmt);
		vsnprintf(r->error, sizeof(r->error), fmt, ap);
		va_end(ap);
	}
	return false;
}

/* Global page number of (block, page) in r->arrival; -1 if none. */
static int64_t global_page(const struct pc_reader *r, unsigned block, uint64_t page)
{
	uint64_t base = 0;

	for (unsigned i = 0; i < block; i++)
		base += ram_image_block(r->img, i)->length / MIG_PAGE_SIZE;
	const struct ram_image_block *b = ram_image_block(r->img, block);
	if (!b || page >= b->length / MIG_PAGE_SIZE)
		return -1;
	return (int64_t)(base + page);
}

uint64_t pc_reader_arrival(const struct pc_reader *r, unsigned block, uint64_t page)
{
	int64_t g = global_page(r, block, page);

	return g < 0 ? 0 : r->arrival[g];
}

static int block_index(const struct ram_image *img, const char *name)
{
	for (size_t i = 0; i < ram_image_block_count(img); i++)
		if (!strcmp(ram_image_block(img, i)->name, name))
			return (int)i;
	return -1;
}

static bool is_zero(const uint8_t *p)
{
	for (size_t i = 0; i < MIG_PAGE_SIZE; i++)
		if (p[i])
			return false;
	return true;
}

static bool take_page(struct pc_reader *r, const char *name, uint64_t offset,
		      const uint8_t *data, int fill)
{
	int b = block_index(r->img, name);
	int64_t g = b < 0 || offset % MIG_PAGE_SIZE ? -1 :
		    global_page(r, (unsigned)b, offset / MIG_PAGE_SIZE);

	if (g < 0)
		return fail(r, "page %s+0x%llx is not in the image", name,
			    (unsigned long long)offset);
	if (r->arrival[g])
		return fail(r, "page %s+0x%llx sent twice", name, (unsigned long long)offset);
	const uint8_t *want = ram_image_block(r->img, (size_t)b)->mem + offset;
	if (data && (memcmp(data, want, MIG_PAGE_SIZE) || is_zero(data)))
		return fail(r, "PAGE %s+0x%llx: wrong or zero content", name,
			    (unsigned long long)offset);
	if (!data && (fill != 0 || !is_zero(want)))
		return fail(r, "ZERO %s+0x%llx (fill %d) for a non-zero page", name,
			    (unsigned long long)offset, fill);
	r->order[r->received] = (struct page_ref){ (uint32_t)b, offset / MIG_PAGE_SIZE };
	r->arrival[g] = ++r->received;
	return true;
}

static bool mem_size(struct pc_reader *r, struct cur *c, uint64_t total)
{
	uint64_t sum = 0;
	size_t i = 0;
	char name[256];

	while (!c->short_read && sum < total) {
		const struct ram_image_block *b = ram_image_block(r->img, i++);

		cur_name(c, name);
		uint64_t len = cur_be64(c);
		if (c->short_read)
			break;
		if (!b || strcmp(b->name, name) || b->length != len)
			return fail(r, "MEM_SIZE block %s/%llu is not the image's", name,
				    (unsigned long long)len);
		sum += len;
	}
	if (!c->short_read && (sum != total || i != ram_image_block_count(r->img)))
		return fail(r, "MEM_SIZE total %llu does not match", (unsigned long long)total);
	return true;
}

/* RAM records through EOS, then the footer.  apply: take the pages. */
static bool ram_records(struct pc_reader *r, struct cur *c, uint32_t id, bool apply)
{
	char block[256];

	memcpy(block, r->block, sizeof(block));
	for (;;) {
		uint64_t v = cur_be64(c);
		uint64_t flags = v & MIG_RAM_FLAG_MASK, addr = v & ~(uint64_t)MIG_RAM_FLAG_MASK;

		if (c->short_read)
			return true;
		if (flags == RAM_FLAG_EOS)
			break;
		if (flags == RAM_FLAG_MEM_SIZE) {
			if (!mem_size(r, c, addr))
				return false;
			continue;
		}
		if ((flags & ~(uint64_t)RAM_FLAG_CONTINUE) != RAM_FLAG_PAGE &&
		    (flags & ~(uint64_t)RAM_FLAG_CONTINUE) != RAM_FLAG_ZERO)
			return fail(r, "unexpected ram record flags 0x%llx",
				    (unsigned long long)flags);
		if (!(flags & RAM_FLAG_CONTINUE))
			cur_name(c, block);
		else if (!block[0])
			return fail(r, "CONTINUE before any block was named");
		const uint8_t *data = flags & RAM_FLAG_PAGE ? cur_bytes(c, MIG_PAGE_SIZE) : NULL;
		int fill = flags & RAM_FLAG_ZERO ? cur_u8(c) : 0;
		if (c->short_read)
			return true;
		if (apply && !take_page(r, block, addr, data, fill))
			return false;
	}
	if (cur_u8(c) != MIG_SECTION_FOOTER && !c->short_read)
		return fail(r, "a ram section without its footer");
	if (cur_be32(c) != id && !c->short_read)
		return fail(r, "footer of the wrong section");
	if (apply)
		memcpy(r->block, block, sizeof(block));
	return true;
}

static bool command(struct pc_reader *r, struct cur *c, bool apply)
{
	uint16_t cmd = cur_be16(c), len = cur_be16(c);
	const uint8_t *data = cur_bytes(c, len);

	if (c->short_read)
		return true;
	if (cmd == MIG_CMD_PACKAGED) {
		if (len != 4)
			return fail(r, "PACKAGED with length %u", len);
		if (!cur_bytes(c, load_be32(data)))
			return true;
	}
	if (!apply)
		return true;
	if (cmd < sizeof(r->commands) / sizeof(r->commands[0]))
		r->commands[cmd]++;
	if (cmd == MIG_CMD_PACKAGED)
		r->preamble_done = true;
	return true;
}

static bool section(struct pc_reader *r, struct cur *c, uint8_t type, bool apply)
{
	uint32_t id = cur_be32(c);
	char idstr[256];

	if (type == MIG_SECTION_START) {
		cur_name(c, idstr);
		uint32_t instance = cur_be32(c), version = cur_be32(c);
		if (!c->short_read && (strcmp(idstr, "ram") || instance || version != 4))
			return fail(r, "START of %s/%u/%u", idstr, instance, version);
	}
	if (!c->short_read && id != ram_image_ram_section_id(r->img))
		return fail(r, "section id %u is not the ram section's", id);
	return ram_records(r, c, id, apply);
}

/* One top-level item; apply false only checks it is complete. */
static bool item(struct pc_reader *r, struct cur *c, bool apply)
{
	uint8_t type = cur_u8(c);
	char machine[256];

	if (c->short_read)
		return true;
	if (r->eof)
		return fail(r, "bytes after the final EOF");
	switch (type) {
	case MIG_EOF:
		if (apply)
			r->eof = true;
		return true;
	case MIG_CONFIGURATION: {
		uint32_t len = cur_be32(c);
		const uint8_t *p = cur_bytes(c, len);

		if (!p)
			return true;
		snprintf(machine, sizeof(machine), "%.*s", (int)len, (const char *)p);
		if (strcmp(machine, ram_image_machine_type(r->img)))
			return fail(r, "CONFIGURATION names %s", machine);
		return true;
	}
	case MIG_COMMAND:
		return command(r, c, apply);
	case MIG_SECTION_START:
	case MIG_SECTION_PART:
	case MIG_SECTION_END:
		if (!section(r, c, type, apply))
			return false;
		if (apply && type == MIG_SECTION_END)
			r->end_section = true;
		return true;
	default:
		return fail(r, "unexpected item type 0x%02x", type);
	}
}

bool pc_reader_parse(struct pc_reader *r)
{
	while (!r->error[0]) {
		struct cur c = { buffer_head(&r->in), buffer_len(&r->in), 0, false };

		if (!r->header) {
			if (c.len < 8)
				break;
			if (cur_be32(&c) != MIG_FILE_MAGIC || cur_be32(&c) != MIG_FILE_VERSION)
				return fail(r, "bad header");
			r->header = true;
			buffer_consume(&r->in, 8);
			continue;
		}
		if (!c.len || !item(r, &c, false) || c.short_read)
			break;
		c.pos = 0;
		if (!item(r, &c, true))
			break;
		buffer_consume(&r->in, c.pos);
	}
	return !r->error[0];
}

/* ---- the image served ------------------------------------------------------ */

/* Two device sections and the EOF, as a snapshot's device state ends. */
const uint8_t pc_test_blob[] = {
	MIG_SECTION_FULL, 0, 0, 0, 5, 5, 't', 'i', 'm', 'e', 'r', 0, 0, 0, 0,
	0, 0, 0, 2, 1, 2, 3, 0, 0x06, 0, 0, 0, 9, MIG_SECTION_FOOTER, 0, 0, 0, 5,
	MIG_SECTION_FULL, 0, 0, 0, 6, 3, 'c', 'p', 'u', 0, 0, 0, 0, 0, 0, 0, 20,
	0xaa, 0x55, 0, 0, 0, 0, MIG_SECTION_FOOTER, 0, 0, 0, 6, MIG_EOF,
};
const size_t pc_test_blob_len = sizeof(pc_test_blob);

void pc_test_fill(uint8_t *page, unsigned block, uint64_t index)
{
	for (size_t i = 0; i < MIG_PAGE_SIZE; i++)
		page[i] = (uint8_t)(i * 7 + index * 13 + block * 101);
	page[0] = (uint8_t)(index | 1);
}

struct ram_image *pc_test_image(uint64_t pages0, uint64_t pages1, bool blob)
{
	const char *names[] = { "pc.ram", "vga.vram" };
	uint64_t lengths[] = { pages0 * MIG_PAGE_SIZE, pages1 * MIG_PAGE_SIZE };
	char err[256];
	struct ram_image *img = ram_image_create("pc-i440fx-7.2", 3, names, lengths,
						 2, err, sizeof(err));
	uint8_t page[MIG_PAGE_SIZE];

	if (!img)
		return NULL;
	for (unsigned b = 0; b < 2; b++)
		for (uint64_t p = 0; p < lengths[b] / MIG_PAGE_SIZE; p++) {
			/* p % 3 == 1: zero bytes stored as data, so the written
			 * bit is set over a zero page. */
			if (p % 3 == 0)
				pc_test_fill(page, b, p);
			else
				memset(page, 0, sizeof(page));
			if (p % 3 != 2 && ram_image_store_page(img, b, p, page) < 0)
				goto fail;
		}
	if (blob && ram_image_set_device_blob(img, pc_test_blob, pc_test_blob_len) < 0)
		goto fail;
	return img;
fail:
	ram_image_destroy(img);
	return NULL;
}

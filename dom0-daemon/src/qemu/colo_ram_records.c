/*
 * The records inside the ram section: the MEM_SIZE block list (START
 * only), pages and zero pages addressed by block name or CONTINUE, and
 * the EOS that ends each section.  Records that need a capability
 * remusdbd does not enable (xbzrle, compress, rdma) are refused.
 */
#include "qemu/colo_stream_internal.h"

#include <string.h>

static int find_block(const struct colo_stream *s, const char *name)
{
	for (size_t i = 0; i < s->block_count; i++)
		if (strcmp(s->blocks[i].name, name) == 0)
			return (int)i;
	return -1;
}

/* The block is known: check the offset, then read the payload. */
static int page_target(struct colo_stream *s)
{
	const struct colo_ram_block *b = &s->blocks[s->cur_block];

	if (s->rec_offset >= b->length)
		return fail(s, "page offset 0x%llx beyond block %s (length "
			       "0x%llx) at offset %llu",
			    (unsigned long long)s->rec_offset, b->name,
			    (unsigned long long)b->length,
			    (unsigned long long)s->record_off);
	if (s->rec_flags == RAM_FLAG_PAGE)
		expect(s, ST_RAM_PAGE, MIG_PAGE_SIZE);
	else
		expect(s, ST_RAM_FILL, 1);
	return 0;
}

static int ram_record(struct colo_stream *s, uint64_t word)
{
	uint32_t flags = (uint32_t)(word & MIG_RAM_FLAG_MASK);
	uint64_t addr = word & ~(uint64_t)MIG_RAM_FLAG_MASK;
	unsigned long long at = (unsigned long long)s->field_off;

	s->record_off = s->field_off;
	if (flags & RAM_FLAG_XBZRLE)
		return fail(s, "XBZRLE page at offset %llu: the xbzrle "
			       "capability is not supported", at);
	if (flags & RAM_FLAG_COMPRESS_PAGE)
		return fail(s, "compressed page at offset %llu: the compress "
			       "capability is not supported", at);
	if (flags & RAM_FLAG_HOOK)
		return fail(s, "RDMA hook record at offset %llu: rdma is not "
			       "supported", at);
	switch (flags & ~(uint32_t)RAM_FLAG_CONTINUE) {
	case RAM_FLAG_MEM_SIZE:
		if (flags != RAM_FLAG_MEM_SIZE || s->blocks_seen ||
		    s->section_type != MIG_SECTION_START)
			return fail(s, "unexpected MEM_SIZE record at offset %llu",
				    at);
		s->blocks_seen = true;
		s->mem_size_left = addr;
		if (addr)
			expect(s, ST_MEMSZ_NAME_LEN, 1);
		else
			expect(s, ST_RAM_RECORD, 8);
		return 0;
	case RAM_FLAG_EOS:
		if (word != RAM_FLAG_EOS)
			return fail(s, "malformed EOS record 0x%llx at offset %llu",
				    (unsigned long long)word, at);
		s->footer_ok = true;
		s->footer_id = s->ram_id;
		colo_section_done(s);
		return 0;
	case RAM_FLAG_ZERO:
	case RAM_FLAG_PAGE:
		s->rec_flags = flags & ~(uint32_t)RAM_FLAG_CONTINUE;
		s->rec_offset = addr;
		if (!(flags & RAM_FLAG_CONTINUE)) {
			expect(s, ST_RAM_NAME_LEN, 1);
			return 0;
		}
		if (s->cur_block < 0)
			return fail(s, "unknown RAM block: CONTINUE record at "
				       "offset %llu before any block name", at);
		return page_target(s);
	default:
		return fail(s, "unknown RAM record flags 0x%x at offset %llu",
			    flags, at);
	}
}

static int mem_size_block(struct colo_stream *s, const uint8_t *f)
{
	struct colo_ram_block *b = &s->blocks[s->block_count];

	memcpy(b->name, f, s->name_len);
	b->name[s->name_len] = '\0';
	b->length = load_be64(f + s->name_len);
	b->index = (unsigned)s->block_count;
	if (find_block(s, b->name) >= 0)
		return fail(s, "duplicate RAM block '%s' in MEM_SIZE", b->name);
	if (b->length == 0 || b->length % MIG_PAGE_SIZE)
		return fail(s, "RAM block %s length 0x%llx is not a positive "
			       "multiple of the page size", b->name,
			    (unsigned long long)b->length);
	if (b->length > s->mem_size_left)
		return fail(s, "RAM block sizes exceed the MEM_SIZE total at "
			       "block %s", b->name);
	s->block_count++;
	s->mem_size_left -= b->length;
	if (s->mem_size_left)
		expect(s, ST_MEMSZ_NAME_LEN, 1);
	else
		expect(s, ST_RAM_RECORD, 8);
	return CALLBACK(s, on_ram_block, b);
}

int colo_ram_field(struct colo_stream *s, const uint8_t *f)
{
	char name[256];

	switch (s->state) {
	case ST_RAM_RECORD:
		return ram_record(s, load_be64(f));
	case ST_RAM_NAME_LEN:
		if (f[0] == 0)
			return fail(s, "empty RAM block name at offset %llu",
				    (unsigned long long)s->record_off);
		expect(s, ST_RAM_NAME, f[0]);
		return 0;
	case ST_RAM_NAME:
		memcpy(name, f, s->want);
		name[s->want] = '\0';
		s->cur_block = find_block(s, name);
		if (s->cur_block < 0)
			return fail(s, "unknown RAM block '%s' at offset %llu",
				    name, (unsigned long long)s->record_off);
		return page_target(s);
	case ST_RAM_FILL:
		expect(s, ST_RAM_RECORD, 8);
		return CALLBACK(s, on_zero_page, &s->blocks[s->cur_block],
				s->rec_offset, f[0]);
	case ST_RAM_PAGE:
		expect(s, ST_RAM_RECORD, 8);
		return CALLBACK(s, on_page, &s->blocks[s->cur_block],
				s->rec_offset, f);
	case ST_MEMSZ_NAME_LEN:
		if (f[0] == 0)
			return fail(s, "empty RAM block name in MEM_SIZE at "
				       "offset %llu",
				    (unsigned long long)s->field_off);
		if (s->block_count == COLO_STREAM_MAX_BLOCKS)
			return fail(s, "more than %d RAM blocks",
				    COLO_STREAM_MAX_BLOCKS);
		s->name_len = f[0];
		expect(s, ST_MEMSZ_NAME, f[0] + 8u);
		return 0;
	case ST_MEMSZ_NAME:
		return mem_size_block(s, f);
	default:
		return fail(s, "internal error: state %d", (int)s->state);
	}
}

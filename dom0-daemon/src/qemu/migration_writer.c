/* Encoders of QEMU 7.2 migration stream pieces (migration_writer.h). */
#include "qemu/migration_writer.h"

#include <errno.h>
#include <string.h>

const char *colo_message_name(uint32_t msg)
{
	static const char *const names[COLO_MSG_COUNT] = {
		"checkpoint-ready", "checkpoint-request", "checkpoint-reply",
		"vmstate-send",     "vmstate-size",       "vmstate-received",
		"vmstate-loaded",
	};

	return msg < COLO_MSG_COUNT ? names[msg] : "unknown";
}

/*
 * Every encoder reserves its whole record first and commits at the end, so
 * a failed call never leaves half a record in the stream.
 */
static uint8_t *reserve(struct buffer *b, size_t n)
{
	uint8_t *p = buffer_reserve(b, n);

	if (!p)
		errno = ENOMEM;
	return p;
}

/* Names travel as u8 length + bytes; QEMU never sends an empty one. */
static int name_len(const char *name, size_t *len)
{
	*len = strlen(name);
	if (*len == 0 || *len > 255) {
		errno = EINVAL;
		return -1;
	}
	return 0;
}

int migw_header(struct buffer *b)
{
	uint8_t *p = reserve(b, 8);

	if (!p)
		return -1;
	store_be32(p, MIG_FILE_MAGIC);
	store_be32(p + 4, MIG_FILE_VERSION);
	buffer_commit(b, 8);
	return 0;
}

int migw_configuration(struct buffer *b, const char *machine_type)
{
	size_t len;

	if (name_len(machine_type, &len) < 0)
		return -1;
	uint8_t *p = reserve(b, 5 + len);
	if (!p)
		return -1;
	p[0] = MIG_CONFIGURATION;
	store_be32(p + 1, (uint32_t)len);
	memcpy(p + 5, machine_type, len);
	buffer_commit(b, 5 + len);
	return 0;
}

int migw_command(struct buffer *b, uint16_t cmd, const void *data,
		 uint16_t len)
{
	uint8_t *p = reserve(b, 5 + (size_t)len);

	if (!p)
		return -1;
	p[0] = MIG_COMMAND;
	p[1] = (uint8_t)(cmd >> 8);
	p[2] = (uint8_t)cmd;
	p[3] = (uint8_t)(len >> 8);
	p[4] = (uint8_t)len;
	if (len)
		memcpy(p + 5, data, len);
	buffer_commit(b, 5 + (size_t)len);
	return 0;
}

int migw_section_start(struct buffer *b, uint8_t type, uint32_t section_id,
		       const char *idstr, uint32_t instance, uint32_t version)
{
	size_t len;

	if (type != MIG_SECTION_START && type != MIG_SECTION_FULL) {
		errno = EINVAL;
		return -1;
	}
	if (name_len(idstr, &len) < 0)
		return -1;
	uint8_t *p = reserve(b, 14 + len);
	if (!p)
		return -1;
	p[0] = type;
	store_be32(p + 1, section_id);
	p[5] = (uint8_t)len;
	memcpy(p + 6, idstr, len);
	store_be32(p + 6 + len, instance);
	store_be32(p + 10 + len, version);
	buffer_commit(b, 14 + len);
	return 0;
}

int migw_section_part(struct buffer *b, uint8_t type, uint32_t section_id)
{
	if (type != MIG_SECTION_PART && type != MIG_SECTION_END) {
		errno = EINVAL;
		return -1;
	}
	uint8_t *p = reserve(b, 5);
	if (!p)
		return -1;
	p[0] = type;
	store_be32(p + 1, section_id);
	buffer_commit(b, 5);
	return 0;
}

int migw_section_footer(struct buffer *b, uint32_t section_id)
{
	uint8_t *p = reserve(b, 5);

	if (!p)
		return -1;
	p[0] = MIG_SECTION_FOOTER;
	store_be32(p + 1, section_id);
	buffer_commit(b, 5);
	return 0;
}

int migw_eof(struct buffer *b)
{
	uint8_t *p = reserve(b, 1);

	if (!p)
		return -1;
	*p = MIG_EOF;
	buffer_commit(b, 1);
	return 0;
}

int migw_ram_mem_size(struct buffer *b, const struct migw_ram_block *blocks,
		      size_t count)
{
	uint64_t total = 0;
	size_t bytes = 8;

	for (size_t i = 0; i < count; i++) {
		size_t len;

		if (name_len(blocks[i].name, &len) < 0)
			return -1;
		if (blocks[i].length % MIG_PAGE_SIZE ||
		    blocks[i].length > UINT64_MAX - total) {
			errno = EINVAL;
			return -1;
		}
		total += blocks[i].length;
		bytes += 1 + len + 8;
	}
	uint8_t *p = reserve(b, bytes);
	if (!p)
		return -1;
	store_be64(p, total | RAM_FLAG_MEM_SIZE);
	size_t at = 8;
	for (size_t i = 0; i < count; i++) {
		size_t len = strlen(blocks[i].name);

		p[at++] = (uint8_t)len;
		memcpy(p + at, blocks[i].name, len);
		at += len;
		store_be64(p + at, blocks[i].length);
		at += 8;
	}
	buffer_commit(b, bytes);
	return 0;
}

/* Record header: be64 offset|flags, then u8 len + name unless CONTINUE. */
static uint8_t *ram_record(struct buffer *b, const char *block,
			   uint64_t offset, uint32_t flags, size_t body,
			   size_t *total)
{
	size_t len = 0;

	if (offset & MIG_RAM_FLAG_MASK) {
		errno = EINVAL;
		return NULL;
	}
	if (block && name_len(block, &len) < 0)
		return NULL;
	*total = 8 + (block ? 1 + len : 0) + body;
	uint8_t *p = reserve(b, *total);
	if (!p)
		return NULL;
	store_be64(p, offset | flags | (block ? 0 : RAM_FLAG_CONTINUE));
	if (block) {
		p[8] = (uint8_t)len;
		memcpy(p + 9, block, len);
		return p + 9 + len;
	}
	return p + 8;
}

int migw_ram_page(struct buffer *b, const char *block, uint64_t offset,
		  const uint8_t *data)
{
	size_t total;
	uint8_t *p = ram_record(b, block, offset, RAM_FLAG_PAGE, MIG_PAGE_SIZE,
				&total);

	if (!p)
		return -1;
	memcpy(p, data, MIG_PAGE_SIZE);
	buffer_commit(b, total);
	return 0;
}

int migw_ram_zero(struct buffer *b, const char *block, uint64_t offset,
		  uint8_t fill)
{
	size_t total;
	uint8_t *p = ram_record(b, block, offset, RAM_FLAG_ZERO, 1, &total);

	if (!p)
		return -1;
	*p = fill;
	buffer_commit(b, total);
	return 0;
}

int migw_ram_eos(struct buffer *b)
{
	uint8_t *p = reserve(b, 8);

	if (!p)
		return -1;
	store_be64(p, RAM_FLAG_EOS);
	buffer_commit(b, 8);
	return 0;
}

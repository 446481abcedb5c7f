/*
 * The byte format of QEMU 7.2's migration stream (docs/architecture.md)
 * and encoders for the pieces remusdbd writes itself.
 *
 * The encoders exist for restore: the backup synthesizes a stream into
 * `qemu -incoming` (header, CONFIGURATION, a ram START section with the
 * block list, a ram END section with every page, then the device blob of
 * the last checkpoint verbatim).  They are pure: each appends to a struct
 * buffer and returns 0, or -1 (errno ENOMEM or EINVAL) leaving the buffer
 * as it was.  The constants are shared with the parser in colo_stream.c.
 */
#ifndef REMUSDB_MIGRATION_WRITER_H
#define REMUSDB_MIGRATION_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "base/be.h"
#include "base/buffer.h"

#define MIG_FILE_MAGIC 0x5145564du /* "QEVM" */
#define MIG_FILE_VERSION 3u

/* Top-level item types (one byte each). */
#define MIG_EOF 0x00
#define MIG_SECTION_START 0x01
#define MIG_SECTION_PART 0x02
#define MIG_SECTION_END 0x03
#define MIG_SECTION_FULL 0x04
#define MIG_SUBSECTION 0x05
#define MIG_VMDESCRIPTION 0x06
#define MIG_CONFIGURATION 0x07
#define MIG_COMMAND 0x08
#define MIG_SECTION_FOOTER 0x7e

/* MIG_COMMAND numbers we meet (savevm.c enum qemu_vm_cmd). */
#define MIG_CMD_PING 2
#define MIG_CMD_ENABLE_COLO 8

/*
 * RAM records: a be64 whose low 12 bits (below the target page) are flags
 * and whose upper bits are a page offset inside a block, or the total RAM
 * size for MEM_SIZE.
 */
#define MIG_PAGE_SIZE 4096u
#define MIG_RAM_FLAG_MASK 0xfffu
#define RAM_FLAG_FULL 0x01 /* obsolete */
#define RAM_FLAG_ZERO 0x02
#define RAM_FLAG_MEM_SIZE 0x04
#define RAM_FLAG_PAGE 0x08
#define RAM_FLAG_EOS 0x10
#define RAM_FLAG_CONTINUE 0x20
#define RAM_FLAG_XBZRLE 0x40
#define RAM_FLAG_HOOK 0x80 /* RDMA */
#define RAM_FLAG_COMPRESS_PAGE 0x100
#define MIG_RAM_SECTION_VERSION 4u

/* COLO messages: be32 on the wire (qapi COLOMessage). */
enum colo_message {
	COLO_MSG_CHECKPOINT_READY = 0,
	COLO_MSG_CHECKPOINT_REQUEST = 1,
	COLO_MSG_CHECKPOINT_REPLY = 2,
	COLO_MSG_VMSTATE_SEND = 3,
	COLO_MSG_VMSTATE_SIZE = 4,
	COLO_MSG_VMSTATE_RECEIVED = 5,
	COLO_MSG_VMSTATE_LOADED = 6,
	COLO_MSG_COUNT
};
const char *colo_message_name(uint32_t msg);

/* be32 magic + be32 version. */
int migw_header(struct buffer *b);
/* CONFIGURATION: be32 length + machine type, no subsections. */
int migw_configuration(struct buffer *b, const char *machine_type);
int migw_command(struct buffer *b, uint16_t cmd, const void *data,
		 uint16_t len);
/* START or FULL: type, be32 id, u8 len + idstr, be32 instance, be32 version. */
int migw_section_start(struct buffer *b, uint8_t type, uint32_t section_id,
		       const char *idstr, uint32_t instance, uint32_t version);
/* PART or END: type, be32 id. */
int migw_section_part(struct buffer *b, uint8_t type, uint32_t section_id);
int migw_section_footer(struct buffer *b, uint32_t section_id);
int migw_eof(struct buffer *b);

struct migw_ram_block {
	const char *name;
	uint64_t length; /* bytes, a multiple of MIG_PAGE_SIZE */
};
/* MEM_SIZE record: the total, then u8 len + name + be64 length per block. */
int migw_ram_mem_size(struct buffer *b, const struct migw_ram_block *blocks,
		      size_t count);
/*
 * A full page (4096 bytes of data) or a zero page at `offset` (page-aligned)
 * of a block.  block NULL sets CONTINUE and omits the name: the receiver
 * uses the block of the previous record, even one from an earlier section.
 */
int migw_ram_page(struct buffer *b, const char *block, uint64_t offset,
		  const uint8_t *data);
int migw_ram_zero(struct buffer *b, const char *block, uint64_t offset,
		  uint8_t fill);
int migw_ram_eos(struct buffer *b);

#endif

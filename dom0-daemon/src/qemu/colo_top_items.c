/*
 * The COLO stream's top level: the item type byte and what it announces,
 * COMMAND items, and the headers and footers of the ram section (the only
 * iterable section a COLO source with our capabilities sends).  The
 * records inside the ram section are colo_ram_records.c's; the device
 * sections that follow it are passed on whole by colo_bulk_blob.c.
 */
#include "qemu/colo_stream_internal.h"

#include <string.h>

void colo_section_done(struct colo_stream *s)
{
	expect(s, s->in_checkpoint ? ST_CKPT_TOP : ST_TOP, 1);
}

/* The first byte of the bulk device blob was read as an item type. */
static int begin_device_blob(struct colo_stream *s, uint8_t type)
{
	if (!s->ram_done)
		return fail(s, "device state at offset %llu before the ram END "
			       "section", (unsigned long long)s->field_off);
	return colo_bulk_blob_begin(s, type);
}

int colo_top_item(struct colo_stream *s, uint8_t type, bool checkpoint)
{
	bool subsection_ok = s->subsection_ok, footer_ok = s->footer_ok;

	s->subsection_ok = s->footer_ok = false;
	if (type == MIG_SECTION_FOOTER) {
		if (!footer_ok)
			return fail(s, "unexpected section footer at offset %llu",
				    (unsigned long long)s->field_off);
		expect(s, ST_FOOTER_ID, 4);
		return 0;
	}
	if (checkpoint) {
		if (type == MIG_SECTION_END && !s->checkpoint_ram) {
			s->section_type = type;
			expect(s, ST_PART_ID, 4);
		} else if (type == MIG_EOF && s->checkpoint_ram) {
			s->in_checkpoint = false;
			s->expect_msg = COLO_MSG_VMSTATE_SIZE;
			expect(s, ST_COLO_MSG, 4);
		} else {
			return fail(s, "unexpected section type 0x%02x in checkpoint "
				       "at offset %llu", type,
				    (unsigned long long)s->field_off);
		}
		return 0;
	}
	switch (type) {
	case MIG_CONFIGURATION:
		if (s->config_seen)
			return fail(s, "second CONFIGURATION at offset %llu",
				    (unsigned long long)s->field_off);
		s->config_seen = true;
		expect(s, ST_CONFIG_LEN, 4);
		return 0;
	case MIG_SUBSECTION:
		if (!subsection_ok)
			return fail(s, "unexpected subsection at offset %llu",
				    (unsigned long long)s->field_off);
		expect(s, ST_SUB_NAME_LEN, 1);
		return 0;
	case MIG_COMMAND:
		expect(s, ST_CMD_HDR, 4);
		return 0;
	case MIG_SECTION_START:
		expect(s, ST_START_HDR, 5);
		return 0;
	case MIG_SECTION_PART:
	case MIG_SECTION_END:
		s->section_type = type;
		expect(s, ST_PART_ID, 4);
		return 0;
	case MIG_SECTION_FULL:
	case MIG_EOF:
		return begin_device_blob(s, type);
	case MIG_VMDESCRIPTION:
		return fail(s, "VMDESCRIPTION without EOF at offset %llu",
			    (unsigned long long)s->field_off);
	default:
		return fail(s, "unknown section type 0x%02x at offset %llu", type,
			    (unsigned long long)s->field_off);
	}
}

static int ram_section(struct colo_stream *s, uint32_t id, uint32_t instance,
		       uint32_t version)
{
	struct colo_section section = {
		.type = s->section_type,
		.id = id,
		.idstr = "ram",
		.instance = instance,
		.version = version,
		.checkpoint = s->in_checkpoint,
	};

	expect(s, ST_RAM_RECORD, 8);
	return CALLBACK(s, on_section, &section);
}

static int start_section(struct colo_stream *s, const uint8_t *f)
{
	uint32_t id = s->section_id;
	char idstr[256];

	memcpy(idstr, f, s->name_len);
	idstr[s->name_len] = '\0';
	uint32_t instance = load_be32(f + s->name_len);
	uint32_t version = load_be32(f + s->name_len + 4);
	if (strcmp(idstr, "ram") != 0)
		return fail(s, "unsupported iterable section '%s' at offset %llu "
			       "(only ram is walked)", idstr,
			    (unsigned long long)s->field_off);
	if (s->ram_seen)
		return fail(s, "second ram START section at offset %llu",
			    (unsigned long long)s->field_off);
	if (version != MIG_RAM_SECTION_VERSION)
		return fail(s, "ram section version %u unsupported (need 4)",
			    version);
	s->ram_seen = true;
	s->ram_id = id;
	s->section_type = MIG_SECTION_START;
	return ram_section(s, id, instance, version);
}

static int part_section(struct colo_stream *s, uint32_t id)
{
	const char *what = s->section_type == MIG_SECTION_END ? "END" : "PART";

	if (!s->ram_seen || id != s->ram_id)
		return fail(s, "%s for section %u at offset %llu, which is not "
			       "the ram section", what, id,
			    (unsigned long long)s->field_off - 1);
	if (s->ram_done && !s->in_checkpoint)
		return fail(s, "ram %s after the ram END section at offset %llu",
			    what, (unsigned long long)s->field_off - 1);
	if (s->in_checkpoint)
		s->checkpoint_ram = true;
	else if (s->section_type == MIG_SECTION_END)
		s->ram_done = true;
	return ram_section(s, id, 0, MIG_RAM_SECTION_VERSION);
}

static int command(struct colo_stream *s, const uint8_t *f)
{
	s->cmd = load_be16(f);
	uint16_t len = load_be16(f + 2);

	/*
	 * Postcopy and packaged commands change the stream's shape; the
	 * capabilities behind them are not enabled by remusdbd.
	 */
	if (s->cmd != MIG_CMD_ENABLE_COLO && s->cmd != MIG_CMD_PING &&
	    s->cmd != 1 /* open return path */)
		return fail(s, "unsupported command %u at offset %llu", s->cmd,
			    (unsigned long long)s->field_off - 1);
	if (len > COLO_STREAM_MAX_COMMAND)
		return fail(s, "command %u too long (%u bytes)", s->cmd, len);
	expect(s, ST_CMD_DATA, len);
	return 0;
}

int colo_top_item_field(struct colo_stream *s, const uint8_t *f)
{
	uint32_t v;

	switch (s->state) {
	case ST_CMD_HDR:
		return command(s, f);
	case ST_CMD_DATA:
		v = (uint32_t)s->want;
		expect(s, ST_TOP, 1);
		return CALLBACK(s, on_command, s->cmd, f, (uint16_t)v);
	case ST_START_HDR:
		if (f[4] == 0)
			return fail(s, "empty section name at offset %llu",
				    (unsigned long long)s->field_off);
		s->name_len = f[4];
		s->section_id = load_be32(f);
		expect(s, ST_START_IDSTR, f[4] + 8u);
		return 0;
	case ST_START_IDSTR:
		return start_section(s, f);
	case ST_PART_ID:
		return part_section(s, load_be32(f));
	case ST_FOOTER_ID:
		if (load_be32(f) != s->footer_id)
			return fail(s, "footer for section %u at offset %llu, "
				       "expected %u", load_be32(f),
				    (unsigned long long)s->field_off - 1,
				    s->footer_id);
		colo_section_done(s);
		return 0;
	default:
		return fail(s, "internal error: state %d", (int)s->state);
	}
}

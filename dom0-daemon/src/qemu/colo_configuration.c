/*
 * The CONFIGURATION item at the start of the bulk stream: the machine
 * type, then subsections for the target page size, the migration
 * capabilities and the VM's UUID.  It refuses what would change the
 * stream's shape under the parser (another page size, x-ignore-shared).
 */
#include "qemu/colo_stream_internal.h"

#include <string.h>

/* Far more than QEMU 7.2 defines: a larger count is corruption. */
#define MAX_CAPABILITIES 64

static void subsection_done(struct colo_stream *s)
{
	s->subsection_ok = true;
	expect(s, ST_TOP, 1);
}

static int config_subsection(struct colo_stream *s, const uint8_t *f)
{
	char name[256];

	memcpy(name, f, s->name_len);
	name[s->name_len] = '\0';
	uint32_t version = load_be32(f + s->name_len);
	if (version != 1)
		return fail(s, "configuration subsection %s version %u", name,
			    version);
	if (strcmp(name, "configuration/target-page-bits") == 0)
		expect(s, ST_SUB_PAGE_BITS, 4);
	else if (strcmp(name, "configuration/capabilities") == 0)
		expect(s, ST_SUB_CAPS_COUNT, 4);
	else if (strcmp(name, "configuration/uuid") == 0)
		expect(s, ST_SUB_UUID, 16);
	else
		return fail(s, "unknown configuration subsection '%s' at offset "
			       "%llu", name, (unsigned long long)s->field_off);
	return 0;
}

static int capability(struct colo_stream *s, const uint8_t *f)
{
	char name[256];

	memcpy(name, f, s->want);
	name[s->want] = '\0';
	/* It adds a be64 address per block to MEM_SIZE, which we do not read. */
	if (strcmp(name, "x-ignore-shared") == 0)
		return fail(s, "capability x-ignore-shared is not supported");
	if (--s->caps_left)
		expect(s, ST_SUB_CAP_LEN, 1);
	else
		subsection_done(s);
	return 0;
}

int colo_configuration_field(struct colo_stream *s, const uint8_t *f)
{
	char name[256];
	uint32_t v;

	switch (s->state) {
	case ST_CONFIG_LEN:
		v = load_be32(f);
		if (v == 0 || v > 255)
			return fail(s, "machine type length %u out of range", v);
		expect(s, ST_CONFIG_NAME, v);
		return 0;
	case ST_CONFIG_NAME:
		memcpy(name, f, s->want);
		name[s->want] = '\0';
		subsection_done(s);
		return CALLBACK(s, on_configuration, name);
	case ST_SUB_NAME_LEN:
		if (f[0] == 0)
			return fail(s, "empty subsection name at offset %llu",
				    (unsigned long long)s->field_off);
		s->name_len = f[0];
		expect(s, ST_SUB_NAME, f[0] + 4u);
		return 0;
	case ST_SUB_NAME:
		return config_subsection(s, f);
	case ST_SUB_PAGE_BITS:
		if (load_be32(f) != 12)
			return fail(s, "target page bits %u unsupported (need 12)",
				    load_be32(f));
		subsection_done(s);
		return 0;
	case ST_SUB_CAPS_COUNT:
		s->caps_left = load_be32(f);
		if (s->caps_left > MAX_CAPABILITIES)
			return fail(s, "%u capabilities in configuration",
				    s->caps_left);
		if (s->caps_left)
			expect(s, ST_SUB_CAP_LEN, 1);
		else
			subsection_done(s);
		return 0;
	case ST_SUB_CAP_LEN:
		expect(s, ST_SUB_CAP_NAME, f[0]);
		return 0;
	case ST_SUB_CAP_NAME:
		return capability(s, f);
	case ST_SUB_UUID:
		subsection_done(s);
		return 0;
	default:
		return fail(s, "internal error: state %d", (int)s->state);
	}
}

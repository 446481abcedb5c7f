/*
 * The field tables of the fixed-field messages, made from the lists in
 * repl_fields.h, and the one reader and writer of such fields: the
 * encoders' range check, the store into a payload and the decoders' load
 * and check.  Every message that has a list encodes and decodes its fixed
 * part here, so the range checks of put and decode cannot drift apart.
 */
#include "wire/repl_fields.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "base/be.h"
#include "wire/repl_proto_internal.h"

/* Where a row's member is in its host struct; nowhere for WIRE and CONST. */
#define MEMBER_OF_HOST(S, name) offsetof(S, name), sizeof(((S *)0)->name)
#define MEMBER_OF_BYTES(S, name) offsetof(S, name), sizeof(((S *)0)->name)
#define MEMBER_OF_REF(S, name) offsetof(S, name), sizeof(((S *)0)->name)
#define MEMBER_OF_WIRE(S, name) 0, 0
#define MEMBER_OF_CONST(S, name) 0, 0

#define FIELD_ROW(S, bind, name, offset, size, ...) \
	{ #name, REPL_BIND_##bind, offset, size, MEMBER_OF_##bind(S, name), __VA_ARGS__ },

#define LAYOUT(var, doc, table, type_, fixed_, LIST, S) \
	static const struct repl_field var##_fields[] = { LIST(FIELD_ROW, S) }; \
	const struct repl_layout var = { \
		doc, table, type_, fixed_, var##_fields, \
		sizeof(var##_fields) / sizeof(var##_fields[0]) \
	};

LAYOUT(repl_hello_layout, "HELLO", 0, REPL_HELLO, REPL_HELLO_FIXED, REPL_HELLO_FIELDS,
       struct repl_hello)
LAYOUT(repl_auth_layout, "AUTH", 0, REPL_AUTH, REPL_AUTH_FIXED, REPL_AUTH_FIELDS,
       struct repl_auth_fields)
LAYOUT(repl_error_layout, "ERROR", 0, REPL_ERROR, REPL_ERROR_FIXED, REPL_ERROR_FIELDS,
       struct repl_error)
LAYOUT(repl_ram_layout_layout, "RAM_LAYOUT", 0, REPL_RAM_LAYOUT, REPL_RAM_LAYOUT_FIXED,
       REPL_RAM_LAYOUT_FIELDS, struct repl_ram_layout)
LAYOUT(repl_epoch_end_layout, "EPOCH_END", 0, REPL_EPOCH_END, REPL_EPOCH_END_FIXED,
       REPL_EPOCH_END_FIELDS, struct repl_epoch_end)
LAYOUT(repl_epoch_ack_layout, "EPOCH_ACK", 0, REPL_EPOCH_ACK, REPL_EPOCH_ACK_FIXED,
       REPL_EPOCH_ACK_FIELDS, struct repl_epoch_ack_fields)
LAYOUT(repl_heartbeat_layout, "HEARTBEAT", 0, REPL_HEARTBEAT, REPL_HEARTBEAT_FIXED,
       REPL_HEARTBEAT_FIELDS, struct repl_heartbeat)
LAYOUT(repl_bye_layout, "BYE", 0, REPL_BYE, REPL_BYE_FIXED, REPL_BYE_FIELDS, struct repl_bye)
LAYOUT(repl_pages_layout, "PAGES", 0, REPL_PAGES, REPL_PAGES_FIXED, REPL_PAGES_FIELDS,
       struct repl_pages)
LAYOUT(repl_pages_coded_layout, "PAGES_CODED", 0, REPL_PAGES_CODED, REPL_PAGES_CODED_FIXED,
       REPL_PAGES_CODED_FIELDS, struct repl_pages_coded)
LAYOUT(repl_coded_record_layout, "PAGES_CODED", 1, REPL_PAGES_CODED, REPL_CODED_RECORD_HEADER,
       REPL_CODED_RECORD_FIELDS, struct repl_coded_page)
LAYOUT(repl_page_request_layout, "PAGE_REQUEST", 0, REPL_PAGE_REQUEST, REPL_PAGE_REQUEST_FIXED,
       REPL_PAGE_REQUEST_FIELDS, struct repl_page_request)
LAYOUT(repl_page_resend_layout, "PAGE_RESEND", 0, REPL_PAGE_RESEND, REPL_PAGE_RESEND_FIXED,
       REPL_PAGE_RESEND_FIELDS, struct repl_page_resend)
LAYOUT(repl_device_layout, "DEVICE", 0, REPL_DEVICE, REPL_DEVICE_FIXED, REPL_DEVICE_FIELDS,
       struct repl_device)
LAYOUT(repl_device_delta_layout, "DEVICE_DELTA", 0, REPL_DEVICE_DELTA, REPL_DEVICE_DELTA_FIXED,
       REPL_DEVICE_DELTA_FIELDS, struct repl_device_delta)
LAYOUT(repl_disk_write_layout, "DISK_WRITE", 0, REPL_DISK_WRITE, REPL_DISK_WRITE_FIXED,
       REPL_DISK_WRITE_FIELDS, struct repl_disk_write)
LAYOUT(repl_disk_zero_layout, "DISK_ZERO", 0, REPL_DISK_ZERO, REPL_DISK_ZERO_FIXED,
       REPL_DISK_ZERO_FIELDS, struct repl_disk_zero)
LAYOUT(repl_disk_sync_layout, "DISK_SYNC", 0, REPL_DISK_SYNC, REPL_DISK_SYNC_FIXED,
       REPL_DISK_SYNC_FIELDS, struct repl_disk_sync)
LAYOUT(repl_disk_sync_done_layout, "DISK_SYNC_DONE", 0, REPL_DISK_SYNC_DONE,
       REPL_DISK_SYNC_DONE_FIXED, REPL_DISK_SYNC_DONE_FIELDS, struct repl_disk_sync_done_fields)
LAYOUT(repl_disk_base_layout, "DISK_BASE", 0, REPL_DISK_BASE, REPL_DISK_BASE_FIXED,
       REPL_DISK_BASE_FIELDS, struct repl_disk_base)
LAYOUT(repl_disk_plan_layout, "DISK_PLAN", 0, REPL_DISK_PLAN, REPL_DISK_PLAN_FIXED,
       REPL_DISK_PLAN_FIELDS, struct repl_disk_plan)
LAYOUT(repl_flow_state_layout, "FLOW_STATE", 0, REPL_FLOW_STATE, CP_FLOW_MSG_STATE_FIXED,
       REPL_FLOW_STATE_FIELDS, struct cp_flow_msg_state)
LAYOUT(repl_flow_record_layout, "FLOW_STATE", 1, REPL_FLOW_STATE, CP_FLOW_MSG_RECORD_SIZE,
       REPL_FLOW_RECORD_FIELDS, struct cp_flow_msg_record)
LAYOUT(repl_flow_ahead_layout, "FLOW_AHEAD", 0, REPL_FLOW_AHEAD, CP_FLOW_MSG_AHEAD_SIZE,
       REPL_FLOW_AHEAD_FIELDS, struct cp_flow_msg_ahead)

const struct repl_layout *const repl_layouts[] = {
	&repl_hello_layout, &repl_auth_layout, &repl_error_layout, &repl_ram_layout_layout,
	&repl_epoch_end_layout, &repl_epoch_ack_layout, &repl_heartbeat_layout,
	&repl_bye_layout, &repl_pages_layout, &repl_pages_coded_layout,
	&repl_coded_record_layout, &repl_page_request_layout, &repl_page_resend_layout,
	&repl_device_layout, &repl_device_delta_layout, &repl_disk_write_layout,
	&repl_disk_zero_layout, &repl_disk_sync_layout, &repl_disk_sync_done_layout,
	&repl_disk_base_layout, &repl_disk_plan_layout, &repl_flow_state_layout,
	&repl_flow_record_layout, &repl_flow_ahead_layout,
};
const unsigned repl_layout_count = sizeof(repl_layouts) / sizeof(repl_layouts[0]);

/* ---- integers in both representations ----------------------------------- */

static uint64_t host_get(const struct repl_field *fd, const void *host)
{
	const uint8_t *m = (const uint8_t *)host + fd->host_offset;

	switch (fd->host_size) {
	case 1: { uint8_t v; memcpy(&v, m, 1); return v; }
	case 2: { uint16_t v; memcpy(&v, m, 2); return v; }
	case 4: { uint32_t v; memcpy(&v, m, 4); return v; }
	default: { uint64_t v; memcpy(&v, m, 8); return v; }
	}
}

static void host_set(const struct repl_field *fd, void *host, uint64_t v)
{
	uint8_t *m = (uint8_t *)host + fd->host_offset;

	switch (fd->host_size) {
	case 1: { uint8_t n = (uint8_t)v; memcpy(m, &n, 1); return; }
	case 2: { uint16_t n = (uint16_t)v; memcpy(m, &n, 2); return; }
	case 4: { uint32_t n = (uint32_t)v; memcpy(m, &n, 4); return; }
	default: memcpy(m, &v, 8); return;
	}
}

static uint64_t wire_get(const uint8_t *p, unsigned size)
{
	switch (size) {
	case 1: return p[0];
	case 2: return load_be16(p);
	case 4: return load_be32(p);
	default: return load_be64(p);
	}
}

static void wire_set(uint8_t *p, unsigned size, uint64_t v)
{
	switch (size) {
	case 1: p[0] = (uint8_t)v; return;
	case 2: store_be16(p, (uint16_t)v); return;
	case 4: store_be32(p, (uint32_t)v); return;
	default: store_be64(p, v); return;
	}
}

static const uint8_t *ref_get(const struct repl_field *fd, const void *host)
{
	const uint8_t *r;

	memcpy(&r, (const uint8_t *)host + fd->host_offset, sizeof(r));
	return r;
}

/* ---- the encoders' and decoders' common part ------------------------------ */

int repl_fields_check(const struct repl_layout *l, const void *host)
{
	for (unsigned i = 0; i < l->count; i++) {
		const struct repl_field *fd = &l->fields[i];

		if (fd->bind == REPL_BIND_REF && !ref_get(fd, host))
			return -1;
		if (fd->bind != REPL_BIND_HOST || !fd->range_error)
			continue;
		uint64_t v = host_get(fd, host);
		if (v < fd->min || v > fd->max)
			return -1;
	}
	return 0;
}

void repl_fields_store(const struct repl_layout *l, uint8_t *p, const void *host)
{
	for (unsigned i = 0; i < l->count; i++) {
		const struct repl_field *fd = &l->fields[i];
		uint8_t *at = p + fd->offset;

		switch (fd->bind) {
		case REPL_BIND_HOST:
			wire_set(at, fd->size, host_get(fd, host));
			break;
		case REPL_BIND_BYTES:
			memcpy(at, (const uint8_t *)host + fd->host_offset, fd->size);
			break;
		case REPL_BIND_REF:
			memcpy(at, ref_get(fd, host), fd->size);
			break;
		case REPL_BIND_CONST:
			wire_set(at, fd->size, fd->min);
			break;
		default: /* WIRE: the message's own code writes it */
			break;
		}
	}
}

int repl_fields_load(const struct repl_layout *l, const uint8_t *p, void *host,
		     const char **err)
{
	for (unsigned i = 0; i < l->count; i++) {
		const struct repl_field *fd = &l->fields[i];
		const uint8_t *at = p + fd->offset;

		if (fd->bind == REPL_BIND_BYTES) {
			memcpy((uint8_t *)host + fd->host_offset, at, fd->size);
			continue;
		}
		if (fd->bind == REPL_BIND_REF) {
			memcpy((uint8_t *)host + fd->host_offset, &at, sizeof(at));
			continue;
		}
		uint64_t v = wire_get(at, fd->size);
		if (fd->range_error && (v < fd->min || v > fd->max)) {
			char what[160];

			snprintf(what, sizeof(what), fd->range_error, (unsigned long long)v,
				 (unsigned long long)fd->min, (unsigned long long)fd->max);
			return repl_fail(err, repl_errf("%s: %s", repl_type_name(l->type), what));
		}
		if (fd->bind == REPL_BIND_HOST)
			host_set(fd, host, v);
	}
	return 0;
}

uint8_t *repl_begin_fields(struct buffer *b, const struct repl_layout *l, const void *host,
			   size_t tail_len)
{
	if (repl_fields_check(l, host) < 0 || tail_len > REPL_MAX_PAYLOAD - l->fixed) {
		errno = EINVAL;
		return NULL;
	}
	uint8_t *p = repl_begin_frame(b, l->type, l->fixed + tail_len);
	if (!p)
		return NULL;
	repl_fields_store(l, p, host);
	return p + l->fixed;
}

int repl_put_fields(struct buffer *b, const struct repl_layout *l, const void *host)
{
	if (!repl_begin_fields(b, l, host, 0))
		return -1;
	repl_end_frame(b, l->fixed);
	return 0;
}

int repl_decode_fields(const struct repl_frame *f, const struct repl_layout *l, void *host,
		       const char **err)
{
	if (repl_expect_length(f, l->type, l->fixed, err) < 0)
		return -1;
	return repl_fields_load(l, f->payload, host, err);
}

int repl_decode_prefix(const struct repl_frame *f, const struct repl_layout *l, void *host,
		       const char **err)
{
	if (repl_expect_at_least(f, l->type, l->fixed, err) < 0)
		return -1;
	return repl_fields_load(l, f->payload, host, err);
}

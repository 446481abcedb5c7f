/*
 * Page trace files (see page_trace.h): one stdio stream, written or read
 * record by record.
 */
#include "codec/page_trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/be.h"

/* Big enough that a record costs no more than a memcpy between flushes. */
#define TRACE_BUFFER (1u << 20)

struct page_trace {
	FILE *f;
	char *buffer;
};

static struct page_trace *trace_new(const char *path, const char *mode, const char **err)
{
	struct page_trace *t = calloc(1, sizeof(*t));

	if (!t || !(t->buffer = malloc(TRACE_BUFFER))) {
		free(t);
		*err = "out of memory";
		return NULL;
	}
	t->f = fopen(path, mode);
	if (!t->f) {
		*err = "cannot open the trace file";
		free(t->buffer);
		free(t);
		return NULL;
	}
	setvbuf(t->f, t->buffer, _IOFBF, TRACE_BUFFER);
	return t;
}

struct page_trace *page_trace_create(const char *path, const char **err)
{
	struct page_trace *t = trace_new(path, "wb", err);
	uint8_t header[PAGE_TRACE_HEADER];

	if (!t)
		return NULL;
	memcpy(header, PAGE_TRACE_MAGIC, 8);
	store_be32(header + 8, PAGE_TRACE_VERSION);
	store_be32(header + 12, PAGE_TRACE_PAGE);
	if (fwrite(header, sizeof(header), 1, t->f) != 1) {
		*err = "cannot write the trace header";
		page_trace_close(t, err);
		return NULL;
	}
	return t;
}

int page_trace_append(struct page_trace *t, uint16_t block, uint64_t page,
		      const uint8_t prev[PAGE_TRACE_PAGE], const uint8_t cur[PAGE_TRACE_PAGE],
		      const char **err)
{
	uint8_t key[10];

	store_be16(key, block);
	store_be64(key + 2, page);
	if (fwrite(key, sizeof(key), 1, t->f) != 1 ||
	    fwrite(prev, PAGE_TRACE_PAGE, 1, t->f) != 1 ||
	    fwrite(cur, PAGE_TRACE_PAGE, 1, t->f) != 1) {
		*err = "cannot write a trace record";
		return -1;
	}
	return 0;
}

struct page_trace *page_trace_open(const char *path, const char **err)
{
	struct page_trace *t = trace_new(path, "rb", err);
	uint8_t header[PAGE_TRACE_HEADER];

	if (!t)
		return NULL;
	const char *why = NULL;

	if (fread(header, sizeof(header), 1, t->f) != 1 || memcmp(header, PAGE_TRACE_MAGIC, 8))
		why = "not a page trace (no RDBTRACE header)";
	else if (load_be32(header + 8) != PAGE_TRACE_VERSION)
		why = "unknown page trace version";
	else if (load_be32(header + 12) != PAGE_TRACE_PAGE)
		why = "page trace of another page size";
	if (why) {
		page_trace_close(t, err);
		*err = why;
		return NULL;
	}
	return t;
}

int page_trace_next(struct page_trace *t, struct page_trace_record *rec, const char **err)
{
	uint8_t key[10];
	size_t got = fread(key, 1, sizeof(key), t->f);

	if (got == 0 && feof(t->f))
		return 0;
	if (got != sizeof(key) || fread(rec->prev, PAGE_TRACE_PAGE, 1, t->f) != 1 ||
	    fread(rec->cur, PAGE_TRACE_PAGE, 1, t->f) != 1) {
		*err = "truncated page trace record";
		return -1;
	}
	rec->block = load_be16(key);
	rec->page = load_be64(key + 2);
	return 1;
}

int page_trace_close(struct page_trace *t, const char **err)
{
	int bad = ferror(t->f);

	if (fclose(t->f) != 0)
		bad = 1;
	free(t->buffer);
	free(t);
	if (bad && err)
		*err = "I/O error on the trace file";
	return bad ? -1 : 0;
}

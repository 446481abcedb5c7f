/*
 * The replication messages' field tables (wire/repl_fields.h) against
 * docs/protocol.md: every offset table in the document, under its
 * message's heading, must list the same offsets and sizes as the table
 * the code encodes and decodes with, so that the document cannot describe
 * a layout that is not on the wire.  Also the tables' own shape (fields
 * back to back, host members wide enough), and a negative control: a
 * mutated copy of a table must be caught by the same comparison.
 */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/repl_fields.h"
#include "suites.h"

#ifndef DOCS_DIR
#error "DOCS_DIR must name the docs/ directory (the Makefile passes it)"
#endif

static char *read_doc(void)
{
	FILE *f = fopen(DOCS_DIR "/protocol.md", "r");
	char *text = NULL;
	long n;

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0) {
		text = malloc((size_t)n + 1);
		if (text && fread(text, 1, (size_t)n, f) == (size_t)n)
			text[n] = '\0';
		else {
			free(text);
			text = NULL;
		}
	}
	fclose(f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	return text;
}

/* The line after the one at p, or NULL at the end. */
static const char *next_line(const char *p)
{
	const char *nl = strchr(p, '\n');

	return nl ? nl + 1 : NULL;
}

/*
 * The section of the message named name: the line after its "### N NAME"
 * heading; *end is where the next heading starts.  NULL if none.
 */
static const char *find_section(const char *doc, const char *name, const char **end)
{
	size_t len = strlen(name);
	const char *start = NULL;

	for (const char *p = doc; p; p = next_line(p)) {
		if (start && p[0] == '#') {
			*end = p;
			return start;
		}
		if (start || strncmp(p, "### ", 4) != 0)
			continue;
		const char *q = p + 4;
		while (*q >= '0' && *q <= '9')
			q++;
		if (q > p + 4 && *q == ' ' && strncmp(q + 1, name, len) == 0 &&
		    (q[1 + len] == ' ' || q[1 + len] == ',' || q[1 + len] == '\n'))
			start = next_line(p);
	}
	*end = start ? start + strlen(start) : NULL;
	return start;
}

/* The first row (after the header and the |---| line) of table `which` in [s, end). */
static const char *find_table(const char *s, const char *end, unsigned which)
{
	bool in_table = false;

	for (const char *p = s; p && p < end; p = next_line(p)) {
		bool row = p[0] == '|';
		if (row && !in_table && strncmp(p, "| offset", 8) == 0 && which-- == 0) {
			const char *sep = next_line(p);
			return sep ? next_line(sep) : NULL;
		}
		in_table = row;
	}
	return NULL;
}

/* A cell that is a plain decimal number; false for "rest", "n", "8 x count"... */
static bool cell_number(const char *cell, size_t n, unsigned *out)
{
	char buf[32];
	char *stop;

	while (n && *cell == ' ')
		cell++, n--;
	while (n && cell[n - 1] == ' ')
		n--;
	if (n == 0 || n >= sizeof(buf) || strspn(cell, "0123456789") < n)
		return false;
	memcpy(buf, cell, n);
	buf[n] = '\0';
	*out = (unsigned)strtoul(buf, &stop, 10);
	return true;
}

/* A table row's offset and size, when both are numbers. */
static bool row_offset_size(const char *row, unsigned *offset, unsigned *size)
{
	const char *a = strchr(row, '|'), *b = a ? strchr(a + 1, '|') : NULL;
	const char *c = b ? strchr(b + 1, '|') : NULL;

	return c && cell_number(a + 1, (size_t)(b - a - 1), offset) &&
	       cell_number(b + 1, (size_t)(c - b - 1), size);
}

/*
 * Holds one layout to its table in the document: every row with a numeric
 * offset and size must be one of the layout's fields, and every field must
 * be such a row.  Returns the number of mismatches, each printed.
 */
static unsigned compare_with_doc(const struct repl_layout *l, const char *doc)
{
	const char *end, *s = find_section(doc, l->doc_name, &end);
	unsigned bad = 0;

	if (!s) {
		fprintf(stderr, "\n  %s: no \"### N %s\" heading in protocol.md\n", l->doc_name,
			l->doc_name);
		return 1;
	}
	const char *rows = find_table(s, end, l->doc_table);
	if (!rows) {
		fprintf(stderr, "\n  %s: no offset table %u under its heading\n", l->doc_name,
			l->doc_table);
		return 1;
	}
	bool seen[64] = { false };
	CU_ASSERT_FATAL(l->count <= 64);
	for (const char *p = rows; p && p < end && p[0] == '|'; p = next_line(p)) {
		unsigned offset, size, i;

		if (!row_offset_size(p, &offset, &size))
			continue; /* a variable part: hand-written code */
		for (i = 0; i < l->count; i++)
			if (l->fields[i].offset == offset && l->fields[i].size == size)
				break;
		if (i == l->count) {
			fprintf(stderr, "\n  %s: the document's field at %u (%u bytes) is not in "
				"the code's table\n", l->doc_name, offset, size);
			bad++;
		} else {
			seen[i] = true;
		}
	}
	for (unsigned i = 0; i < l->count; i++) {
		if (seen[i])
			continue;
		fprintf(stderr, "\n  %s: the code's field %s at %u (%u bytes) is not in the "
			"document\n", l->doc_name, l->fields[i].name, l->fields[i].offset,
			l->fields[i].size);
		bad++;
	}
	return bad;
}

static void test_tables_match_the_document(void)
{
	char *doc = read_doc();

	for (unsigned i = 0; i < repl_layout_count; i++)
		CU_ASSERT_EQUAL(compare_with_doc(repl_layouts[i], doc), 0);
	free(doc);
}

/* The layout documented as table `which` under the heading `name`, or NULL. */
static const struct repl_layout *layout_for(const char *name, size_t len, unsigned which)
{
	for (unsigned i = 0; i < repl_layout_count; i++) {
		const struct repl_layout *l = repl_layouts[i];

		if (strlen(l->doc_name) == len && !strncmp(l->doc_name, name, len) &&
		    l->doc_table == which)
			return l;
	}
	return NULL;
}

/* The other way round: every offset table under a message's heading has a code table. */
static void test_every_documented_table_has_one_in_the_code(void)
{
	char *doc = read_doc();
	const char *name = NULL;
	size_t len = 0;
	unsigned tables = 0, missing = 0;
	bool in_table = false;

	for (const char *p = doc; p; p = next_line(p)) {
		if (p[0] == '#') {
			/* "### N NAME ...": a message; any other heading ends one. */
			const char *q = p + 4;
			name = NULL;
			if (!strncmp(p, "### ", 4)) {
				while (*q >= '0' && *q <= '9')
					q++;
				if (q > p + 4 && *q == ' ') {
					name = q + 1;
					len = strcspn(name, " ,\n");
				}
			}
			tables = 0;
		}
		bool row = p[0] == '|';
		if (name && row && !in_table && !strncmp(p, "| offset", 8)) {
			if (!layout_for(name, len, tables)) {
				fprintf(stderr, "\n  %.*s: offset table %u has no table in "
					"repl_fields.h\n", (int)len, name, tables);
				missing++;
			}
			tables++;
		}
		in_table = row;
	}
	CU_ASSERT_EQUAL(missing, 0);
	free(doc);
}

/* The comparison must see a wrong offset and a wrong size: a check that passes all fails here. */
static void test_a_mutated_table_is_caught(void)
{
	const struct repl_layout *orig = &repl_page_request_layout;
	struct repl_field fields[8];
	struct repl_layout copy = *orig;
	char *doc = read_doc();

	CU_ASSERT_FATAL(orig->count <= 8 && orig->count >= 3);
	memcpy(fields, orig->fields, orig->count * sizeof(fields[0]));
	copy.fields = fields;
	CU_ASSERT_EQUAL(compare_with_doc(&copy, doc), 0);

	fprintf(stderr, "\n  (two planted mismatches follow)");
	fields[2].offset++;
	CU_ASSERT(compare_with_doc(&copy, doc) > 0);
	fields[2].offset--;
	fields[1].size = 4;
	CU_ASSERT(compare_with_doc(&copy, doc) > 0);
	free(doc);
}

static void test_tables_are_well_formed(void)
{
	for (unsigned i = 0; i < repl_layout_count; i++) {
		const struct repl_layout *l = repl_layouts[i];
		unsigned at = 0;

		for (unsigned k = 0; k < l->count; k++) {
			const struct repl_field *fd = &l->fields[k];

			/* back to back, in wire order */
			CU_ASSERT_EQUAL(fd->offset, at);
			at = fd->offset + fd->size;
			CU_ASSERT(fd->min <= fd->max);
			switch (fd->bind) {
			case REPL_BIND_HOST:
				CU_ASSERT(fd->size == 1 || fd->size == 2 || fd->size == 4 ||
					  fd->size == 8);
				CU_ASSERT(fd->host_size >= fd->size && fd->host_size <= 8);
				break;
			case REPL_BIND_BYTES:
				CU_ASSERT_EQUAL(fd->host_size, fd->size);
				break;
			case REPL_BIND_REF:
				CU_ASSERT_EQUAL(fd->host_size, sizeof(const uint8_t *));
				break;
			case REPL_BIND_CONST:
				CU_ASSERT_EQUAL(fd->min, fd->max);
				CU_ASSERT_PTR_NOT_NULL(fd->range_error);
				break;
			default:
				CU_ASSERT_EQUAL(fd->bind, REPL_BIND_WIRE);
			}
		}
		if (at != l->fixed)
			fprintf(stderr, "\n  %s: fields end at %u, fixed part %u\n", l->doc_name,
				at, l->fixed);
		CU_ASSERT_EQUAL(at, l->fixed);
	}
}

int register_repl_fields_tests(void)
{
	CU_pSuite s = CU_add_suite("repl_fields", NULL, NULL);

	if (!s ||
	    !CU_add_test(s, "tables match docs/protocol.md", test_tables_match_the_document) ||
	    !CU_add_test(s, "every documented table has one in the code",
			 test_every_documented_table_has_one_in_the_code) ||
	    !CU_add_test(s, "a mutated table is caught", test_a_mutated_table_is_caught) ||
	    !CU_add_test(s, "tables are well formed", test_tables_are_well_formed))
		return -1;
	return 0;
}

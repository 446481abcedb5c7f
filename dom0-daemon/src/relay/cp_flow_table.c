/* Per-flow held counts and sequence positions for commit protection (cp_flow_table.h). */
#include "relay/cp_flow_table.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* A power of two; flows with held frames are few (the guest's connections). */
#define BUCKETS 1024u

/*
 * A flow is known while frames of it are held (held > 0) or while its
 * sequence state is tracked (tracked); output commit forgets tracked
 * flows itself (cp_flow_table_each) once they have been idle for long.
 */
struct flow_entry {
	struct cp_flow_key key;
	uint32_t held;
	bool tracked;
	struct cp_flow_seq seq;
	struct flow_entry *next;
};

struct cp_flow_table {
	struct flow_entry *bucket[BUCKETS];
	size_t count;  /* entries with held > 0 */
	size_t known;  /* entries */
};

static unsigned bucket_of(const struct cp_flow_key *k)
{
	return (unsigned)(XXH3_64bits(k, sizeof(*k)) & (BUCKETS - 1));
}

static struct flow_entry **find(const struct cp_flow_table *t, const struct cp_flow_key *k)
{
	struct flow_entry **e = (struct flow_entry **)&t->bucket[bucket_of(k)];

	while (*e && memcmp(&(*e)->key, k, sizeof(*k)) != 0)
		e = &(*e)->next;
	return e;
}

struct cp_flow_table *cp_flow_table_create(void)
{
	return calloc(1, sizeof(struct cp_flow_table));
}

void cp_flow_table_clear(struct cp_flow_table *t)
{
	for (unsigned i = 0; i < BUCKETS; i++) {
		while (t->bucket[i]) {
			struct flow_entry *e = t->bucket[i];
			t->bucket[i] = e->next;
			free(e);
		}
	}
	t->count = 0;
	t->known = 0;
}

void cp_flow_table_destroy(struct cp_flow_table *t)
{
	if (!t)
		return;
	cp_flow_table_clear(t);
	free(t);
}

uint32_t cp_flow_table_held(const struct cp_flow_table *t, const struct cp_flow_key *k)
{
	struct flow_entry *e = *find(t, k);

	return e ? e->held : 0;
}

/* The flow's entry, created if new; NULL when out of memory. */
static struct flow_entry *get(struct cp_flow_table *t, const struct cp_flow_key *k)
{
	struct flow_entry **slot = find(t, k);

	if (!*slot) {
		struct flow_entry *e = calloc(1, sizeof(*e));
		if (!e)
			return NULL;
		e->key = *k;
		*slot = e;
		t->known++;
	}
	return *slot;
}

/* Frees *slot's entry if nothing keeps it. */
static void maybe_forget(struct cp_flow_table *t, struct flow_entry **slot)
{
	struct flow_entry *e = *slot;

	if (e->held || e->tracked)
		return;
	*slot = e->next;
	free(e);
	t->known--;
}

int cp_flow_table_add(struct cp_flow_table *t, const struct cp_flow_key *k)
{
	struct flow_entry *e = get(t, k);

	if (!e)
		return -1;
	if (e->held++ == 0)
		t->count++;
	return 0;
}

void cp_flow_table_remove(struct cp_flow_table *t, const struct cp_flow_key *k)
{
	struct flow_entry **slot = find(t, k), *e = *slot;

	if (!e || e->held == 0)
		return;
	if (--e->held == 0) {
		t->count--;
		maybe_forget(t, slot);
	}
}

size_t cp_flow_table_count(const struct cp_flow_table *t)
{
	return t->count;
}

size_t cp_flow_table_known(const struct cp_flow_table *t)
{
	return t->known;
}

struct cp_flow_seq *cp_flow_table_seq(struct cp_flow_table *t, const struct cp_flow_key *k)
{
	struct flow_entry *e = get(t, k);

	if (!e)
		return NULL;
	e->tracked = true;
	return &e->seq;
}

struct cp_flow_seq *cp_flow_table_find_seq(const struct cp_flow_table *t,
					   const struct cp_flow_key *k)
{
	struct flow_entry *e = *find(t, k);

	return e && e->tracked ? &e->seq : NULL;
}

void cp_flow_table_each(struct cp_flow_table *t, cp_flow_table_visit fn, void *opaque)
{
	for (unsigned i = 0; i < BUCKETS; i++) {
		struct flow_entry **slot = &t->bucket[i];
		while (*slot) {
			struct flow_entry *e = *slot;
			if (e->tracked && fn(opaque, &e->key, &e->seq)) {
				e->tracked = false;
				memset(&e->seq, 0, sizeof(e->seq));
				maybe_forget(t, slot);
				if (*slot != e)
					continue; /* freed: *slot is the next one */
			}
			slot = &e->next;
		}
	}
}

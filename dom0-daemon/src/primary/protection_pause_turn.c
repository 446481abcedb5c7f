/*
 * A protected VM's turn to pause for a checkpoint (--pause-turns, the
 * daemon-wide turnstile of base/turnstile.h).  QEMU stops the guest only
 * once we answer its CHECKPOINT_REQUEST, so a VM whose turn has not come
 * waits with its guest running, and every pause reads one VM's stream.
 *
 * The turn is taken when the request is answered (may_checkpoint) and
 * given back when the checkpoint ends (LOADED sent, or the VM held for a
 * consistency check), or when the source goes: failure, abandon, destroy.
 */
#include "primary/protection_internal.h"

#include "base/turnstile.h"
#include "qemu/checkpoint_source.h"

/* A pause this long is broken already; the other VMs go on without waiting for it. */
#define PAUSE_TURN_MAX_HOLD_MS 2000

static const char *holder_name(void *holder)
{
	static char line[96];
	const struct protection *p = holder;

	snprintf(line, sizeof(line), "vm %s", p->name);
	return line;
}

struct turnstile *protection_pause_turns_create(event_loop *loop, unsigned turns)
{
	return turnstile_create(loop, turns, PAUSE_TURN_MAX_HOLD_MS, holder_name);
}

static void turn_came(void *holder)
{
	struct protection *p = holder;

	/* Asks may_checkpoint again, which takes the turn (or lets it go on). */
	if (p->source)
		checkpoint_source_kick(p->source);
}

bool protection_pause_turn_take(struct protection *p)
{
	struct turnstile *t = p->settings->pause_turns;

	return !t || turnstile_take(t, p, turn_came);
}

void protection_pause_turn_give_back(struct protection *p)
{
	turnstile_give_back(p->settings->pause_turns, p);
}

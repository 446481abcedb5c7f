/*
 * The QMP commands of the COLO source, one after the other, each on the
 * previous one's success (migrating without x-colo would run a plain
 * migration into us, and QEMU would stop the VM at its end):
 * query-yank, migrate-set-capabilities, migrate-set-parameters, migrate;
 * and x-colo-lost-heartbeat when the source is abandoned.
 *
 * Why query-yank first: a QEMU whose previous migration has not ended
 * yet (its COLO thread still leaving after x-colo-lost-heartbeat) still
 * holds that migration's yank instance, which it drops only in the
 * migration's final cleanup.  A `migrate` then fails with "duplicate
 * yank instance", and QEMU 7.2 fails it after migrate_prepare() already
 * set the state to SETUP (migration/migration.c, qmp_migrate): every
 * later migrate-set-capabilities says "There's a migration process in
 * progress", and the VM can never be protected again until its QEMU
 * restarts (seen in the soak of 2026-11-27 21:14).  So the source waits
 * until the instance is gone, looking again every
 * YANK_RETRY_MS, and fails with what it saw if it is still there after
 * previous_migration_wait_ms.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "qemu/colo_capture_internal.h"
#include "qemu/qmp.h"

#define YANK_RETRY_MS 100

static const char *const step_commands[] = {
	[STEP_YANK_CHECK] = "query-yank",
	[STEP_CAPABILITIES] = "migrate-set-capabilities",
	[STEP_PARAMETERS] = "migrate-set-parameters",
	[STEP_MIGRATE] = "migrate",
	[STEP_LOST_HEARTBEAT] = "x-colo-lost-heartbeat",
};

/*
 * One QMP command in flight.  The QMP client owns it until the reply
 * callback frees it; a source that goes away first only clears `src`.
 */
struct qmp_step {
	struct checkpoint_source *src; /* NULL: just log the reply */
	struct qmp_step *next;         /* in src->steps */
	enum qmp_step_kind kind;
	char vm_name[64];
};

static void on_qmp_reply(struct qmp_client *qmp, json_t *reply, void *data);

static json_t *step_arguments(const struct checkpoint_source *src, enum qmp_step_kind kind)
{
	switch (kind) {
	case STEP_CAPABILITIES:
		/* return-path off: COLO reads our replies from the stream socket. */
		return json_pack("{s:[{s:s,s:b},{s:s,s:b}]}", "capabilities",
				 "capability", "x-colo", "state", 1,
				 "capability", "return-path", "state", 0);
	case STEP_PARAMETERS:
		return json_pack("{s:I}", "x-checkpoint-delay",
				 (json_int_t)src->interval_ms);
	case STEP_MIGRATE: {
		size_t len = strlen(src->path) + sizeof("unix:");
		char *uri = malloc(len);
		json_t *args = NULL;

		if (uri) {
			snprintf(uri, len, "unix:%s", src->path);
			args = json_pack("{s:s}", "uri", uri);
		}
		free(uri);
		return args;
	}
	default:
		return NULL;
	}
}

int capture_issue_step(struct checkpoint_source *src, enum qmp_step_kind kind)
{
	struct qmp_step *step = calloc(1, sizeof(*step));
	json_t *args = NULL;

	if (!step)
		return -1;
	step->kind = kind;
	snprintf(step->vm_name, sizeof(step->vm_name), "%s", src->vm_name);
	if (kind != STEP_LOST_HEARTBEAT && kind != STEP_YANK_CHECK &&
	    !(args = step_arguments(src, kind))) {
		free(step);
		return -1;
	}
	/* qmp_execute() takes args even when it fails. */
	if (qmp_execute(src->qmp, step_commands[kind], args, on_qmp_reply, step) < 0) {
		free(step);
		return -1;
	}
	if (kind == STEP_LOST_HEARTBEAT)
		return 0; /* nobody waits for its answer: it is only logged */
	step->src = src;
	step->next = src->steps;
	src->steps = step;
	if (kind == STEP_MIGRATE)
		src->migrate_issued = true;
	return 0;
}

static void unlink_step(struct checkpoint_source *src, struct qmp_step *step)
{
	for (struct qmp_step **link = &src->steps; *link; link = &(*link)->next) {
		if (*link == step) {
			*link = step->next;
			return;
		}
	}
}

static const char *error_text(json_t *error)
{
	const char *desc = json_string_value(json_object_get(error, "desc"));

	return desc ? desc : "(no description)";
}

/* A reply nobody waits for: say what happened and forget it. */
static void log_orphan_reply(const struct qmp_step *step, json_t *reply)
{
	const char *command = step_commands[step->kind];
	json_t *error = json_object_get(reply, "error");

	if (!reply)
		log_warn("vm %s: QMP connection lost before %s was answered",
			 step->vm_name, command);
	else if (error)
		log_warn("vm %s: QMP %s: %s", step->vm_name, command,
			 error_text(error));
	else if (step->kind == STEP_LOST_HEARTBEAT)
		log_info("vm %s: QEMU left COLO (x-colo-lost-heartbeat); the VM runs "
			 "unprotected", step->vm_name);
}

/* The chain's next command, or the source fails saying it could not go out. */
static void issue_next(struct checkpoint_source *src, enum qmp_step_kind kind)
{
	if (capture_issue_step(src, kind) < 0)
		capture_fail(src, "cannot queue QMP %s", step_commands[kind]);
}

/* True when QEMU's yank instances (query-yank's return) include a migration. */
static bool lists_a_migration(json_t *instances)
{
	size_t i;
	json_t *instance;

	json_array_foreach(instances, i, instance) {
		const char *type = json_string_value(json_object_get(instance, "type"));

		if (type && strcmp(type, "migration") == 0)
			return true;
	}
	return false;
}

static long retry_yank_check(event_loop *loop, long long timer_id, void *data)
{
	struct checkpoint_source *src = data;

	src->yank_retry_timer = 0;
	capture_enter(src);
	if (!capture_gone(src))
		issue_next(src, STEP_YANK_CHECK);
	capture_leave(src);
	return TIMER_DONE;
}

void capture_cancel_yank_retry(struct checkpoint_source *src)
{
	if (src->yank_retry_timer) {
		event_loop_del_timer(src->loop, src->yank_retry_timer);
		src->yank_retry_timer = 0;
	}
}

/* query-yank answered: migrate, wait for the previous migration, or give up. */
static void on_yank_reply(struct checkpoint_source *src, json_t *reply)
{
	json_t *error = json_object_get(reply, "error");
	json_t *instances = json_object_get(reply, "return");

	if (error || !json_is_array(instances)) {
		/* A QEMU without query-yank (before 6.0) has no yank instance to clash with. */
		log_warn("vm %s: QMP query-yank: %s; migrating without checking for a previous "
			 "migration", src->vm_name, error ? error_text(error) : "no list returned");
	} else if (lists_a_migration(instances)) {
		int64_t now = monotonic_us();

		if (!src->previous_migration_seen) {
			src->previous_migration_seen = true;
			log_info("vm %s: QEMU's previous migration has not ended yet (its yank "
				 "instance is still registered): waiting up to %u ms before "
				 "migrating", src->vm_name, src->previous_migration_wait_ms);
		}
		if (now >= src->previous_migration_deadline_us) {
			capture_fail(src, "QEMU's previous migration has not ended after %u ms "
				     "(its yank instance is still registered; its COLO thread "
				     "may be stuck): a new migrate would fail and leave this "
				     "QEMU unable to migrate until it restarts. The VM runs "
				     "unprotected; restart its QEMU (stop and start the VM) to "
				     "protect it again", src->previous_migration_wait_ms);
			return;
		}
		src->yank_retry_timer = event_loop_add_timer(src->loop, YANK_RETRY_MS,
							     retry_yank_check, src);
		if (src->yank_retry_timer <= 0) {
			src->yank_retry_timer = 0;
			capture_fail(src, "cannot arm a timer to look at QEMU's migration again");
		}
		return;
	} else if (src->previous_migration_seen) {
		log_info("vm %s: QEMU's previous migration has ended: migrating", src->vm_name);
	}
	issue_next(src, STEP_CAPABILITIES);
}

static void on_qmp_reply(struct qmp_client *qmp, json_t *reply, void *data)
{
	struct qmp_step *step = data;
	struct checkpoint_source *src = step->src;
	enum qmp_step_kind kind = step->kind;
	const char *command = step_commands[kind];
	json_t *error = json_object_get(reply, "error");

	if (!src || capture_gone(src)) {
		if (src)
			unlink_step(src, step);
		log_orphan_reply(step, reply);
		free(step);
		return;
	}
	unlink_step(src, step);
	free(step);
	capture_enter(src);
	if (!reply) {
		capture_fail(src, "the QMP connection to QEMU was lost before %s was answered",
			     command);
	} else if (kind == STEP_YANK_CHECK) {
		on_yank_reply(src, reply);
	} else if (error) {
		if (kind == STEP_MIGRATE)
			src->migrate_issued = false; /* no migration: nothing to leave */
		capture_fail(src, "QEMU refused %s: %s", command, error_text(error));
	} else if (kind == STEP_CAPABILITIES || kind == STEP_PARAMETERS) {
		issue_next(src, kind == STEP_CAPABILITIES ? STEP_PARAMETERS : STEP_MIGRATE);
	} else if (kind == STEP_MIGRATE) {
		log_info("vm %s: QEMU is migrating to unix:%s with x-colo (%u ms "
			 "checkpoints)", src->vm_name, src->path, src->interval_ms);
	}
	capture_leave(src);
}

void capture_orphan_steps(struct checkpoint_source *src)
{
	for (struct qmp_step *step = src->steps; step; step = step->next)
		step->src = NULL;
	src->steps = NULL;
}

const char *capture_step_name(enum qmp_step_kind kind)
{
	return step_commands[kind];
}

/*
 * The QMP commands of the COLO source, one after the other, each on the
 * previous one's success (migrating without x-colo would run a plain
 * migration into us, and QEMU would stop the VM at its end):
 * migrate-set-capabilities, migrate-set-parameters, migrate; and
 * x-colo-lost-heartbeat when the source is abandoned.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "qemu/colo_capture_internal.h"
#include "qemu/qmp.h"

static const char *const step_commands[] = {
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
	if (kind != STEP_LOST_HEARTBEAT && !(args = step_arguments(src, kind))) {
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
	} else if (error) {
		if (kind == STEP_MIGRATE)
			src->migrate_issued = false; /* no migration: nothing to leave */
		capture_fail(src, "QEMU refused %s: %s", command, error_text(error));
	} else if (kind == STEP_CAPABILITIES || kind == STEP_PARAMETERS) {
		enum qmp_step_kind next = kind == STEP_CAPABILITIES ?
						  STEP_PARAMETERS : STEP_MIGRATE;

		if (capture_issue_step(src, next) < 0)
			capture_fail(src, "cannot queue QMP %s", step_commands[next]);
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

/*
 * Control commands for replication: protect, unprotect, failover,
 * reset-stats, dirty-census, checkpoint holds, switchover.
 */
#include <stdio.h>
#include <string.h>

#include "control/control_internal.h"
#include "control/control_json.h"
#include "primary/protection.h"
#include "primary/switchover.h"
#include "backup/replication_server.h"
#include "vm/vm.h"

json_t *cmd_protect(const struct control_context *ctx, json_t *request)
{
	static const char *const allowed[] = { "vm", "backup", "interval_ms", "qemu_argv",
					       "run_dir", "output_commit",
					       "unsafe_release_early", "compress",
					       "read_tracking", "trace_pages",
					       "commit_protection", "cp_dscp", "full_copy",
					       "debug_resync_omit_extent", NULL };
	const struct control_config *cfg = &ctx->config;
	json_t *bad = check_members(request, allowed);
	const char *name, *backup, *run_dir;
	struct protect_request req;
	char err[512];

	if (bad || (bad = string_member(request, "vm", &name)) ||
	    (bad = string_member(request, "backup", &backup)) ||
	    (bad = string_member(request, "run_dir", &run_dir)))
		return bad;
	struct vm *vm = vm_find(cfg->vms, name);
	if (!vm)
		return error_reply("no VM named '%.40s' on this host (start it with "
				   "tools/remusdb-vm first)", name);
	if (!cfg->repl)
		return error_reply("replication is not configured in this daemon");
	struct protection *old = protection_of(vm);
	if (old && !protection_finished(old))
		return error_reply("VM %s is already protected (unprotect it first)", name);
	memset(&req, 0, sizeof(req));
	snprintf(req.backup, sizeof(req.backup), "%s", backup);
	snprintf(req.run_dir, sizeof(req.run_dir), "%s", run_dir);
	json_t *interval = json_object_get(request, "interval_ms");
	if (interval && !json_is_integer(interval))
		return error_reply("interval_ms must be an integer");
	json_int_t ms = interval ? json_integer_value(interval) : PROTECTION_DEFAULT_INTERVAL_MS;
	req.interval_ms = ms < 0 || ms > 100000 ? 0 : (unsigned)ms;
	/* The RemusDB optimizations and output commit are on unless the request turns them off. */
	const struct { const char *name; bool *value; bool dflt; } switches[] = {
		{ "output_commit", &req.output_commit, true },
		{ "unsafe_release_early", &req.unsafe_release_early, false },
		{ "compress", &req.compress, true },
		{ "read_tracking", &req.read_tracking, true },
		{ "commit_protection", &req.commit_protection, false },
		{ "full_copy", &req.full_copy, false },
		{ "debug_resync_omit_extent", &req.debug_resync_omit_extent, false },
	};
	for (size_t i = 0; i < sizeof(switches) / sizeof(switches[0]); i++) {
		json_t *v = json_object_get(request, switches[i].name);
		if (v && !json_is_boolean(v))
			return error_reply("%s must be true or false", switches[i].name);
		*switches[i].value = v ? json_is_true(v) : switches[i].dflt;
	}
	json_t *dscp = json_object_get(request, "cp_dscp");
	if (dscp && !json_is_integer(dscp))
		return error_reply("cp_dscp must be an integer");
	json_int_t code = dscp ? json_integer_value(dscp) : PROTECTION_DEFAULT_CP_DSCP;
	req.cp_dscp = code < 0 || code > 255 ? 0 : (unsigned)code;
	json_t *trace = json_object_get(request, "trace_pages");
	if (trace && (!json_is_string(trace) || json_string_value(trace)[0] != '/' ||
		      strlen(json_string_value(trace)) >= sizeof(req.trace_pages)))
		return error_reply("trace_pages must be an absolute file path");
	if (trace)
		snprintf(req.trace_pages, sizeof(req.trace_pages), "%s", json_string_value(trace));
	req.qemu_argv = json_object_get(request, "qemu_argv");
	struct protection *p = protection_start(ctx->loop, cfg->repl, vm,
						&req, err, sizeof(err));
	if (!p)
		return error_reply("cannot protect %s: %s", name, err);
	protection_attach(vm, p);
	return json_pack("{s:b, s:o}", "ok", 1, "protection", protection_status_json(p));
}

/* The protection named by the request's "vm", or an error reply. */
static json_t *find_protection(const struct control_context *ctx, json_t *request,
				  struct protection **out)
{
	static const char *const allowed[] = { "vm", NULL };
	json_t *bad = check_members(request, allowed);
	const char *name;

	if (bad || (bad = string_member(request, "vm", &name)))
		return bad;
	struct vm *vm = vm_find(ctx->config.vms, name);
	*out = vm ? protection_of(vm) : NULL;
	if (!*out)
		return error_reply("VM '%.40s' is not protected on this host", name);
	return NULL;
}

json_t *cmd_unprotect(const struct control_context *ctx, json_t *request)
{
	struct protection *p;
	json_t *bad = find_protection(ctx, request, &p);

	if (bad)
		return bad;
	protection_stop(p);
	return json_pack("{s:b, s:o}", "ok", 1, "protection", protection_status_json(p));
}

json_t *cmd_failover(const struct control_context *ctx, json_t *request)
{
	static const char *const allowed[] = { "vm", NULL };
	const struct control_config *cfg = &ctx->config;
	json_t *bad = check_members(request, allowed);
	const char *name;
	char err[512];

	if (bad || (bad = string_member(request, "vm", &name)))
		return bad;
	if (!cfg->replication)
		return error_reply("this daemon holds no replicas (it runs without --listen); "
				   "run failover on the backup host");
	if (replication_server_failover(cfg->replication, name, err, sizeof(err)) < 0)
		return error_reply("failover refused: %s", err);
	return ok_reply();
}

/* A command on the request's protection that answers with its status. */
static json_t *on_protection(const struct control_context *ctx, json_t *request,
				void (*action)(struct protection *p))
{
	struct protection *p;
	json_t *bad = find_protection(ctx, request, &p);

	if (bad)
		return bad;
	action(p);
	return json_pack("{s:b, s:o}", "ok", 1, "protection", protection_status_json(p));
}

json_t *cmd_reset_stats(const struct control_context *ctx, json_t *request)
{
	return on_protection(ctx, request, protection_reset_stats);
}

/* dirty-census {vm}: the census with its page scan, which status leaves out. */
json_t *cmd_dirty_census(const struct control_context *ctx, json_t *request)
{
	struct protection *p;
	json_t *bad = find_protection(ctx, request, &p);

	if (bad)
		return bad;
	return json_pack("{s:b, s:o}", "ok", 1, "dirty_census", protection_dirty_census_json(p));
}

/*
 * hold-checkpoint {vm, dump, size}: the VM stays paused at its next
 * checkpoint with its memory written to `dump` (protection.h); status
 * shows checkpoint_hold.  release-checkpoint {vm} resumes it.
 */
json_t *cmd_hold_checkpoint(const struct control_context *ctx, json_t *request)
{
	static const char *const allowed[] = { "vm", "dump", "size", NULL };
	json_t *bad = check_members(request, allowed);
	const char *name, *dump;
	char err[256];

	if (bad || (bad = string_member(request, "vm", &name)) ||
	    (bad = string_member(request, "dump", &dump)))
		return bad;
	json_t *size = json_object_get(request, "size");
	if (!json_is_integer(size) || json_integer_value(size) <= 0)
		return error_reply("size must be a positive number of bytes");
	struct vm *vm = vm_find(ctx->config.vms, name);
	struct protection *p = vm ? protection_of(vm) : NULL;
	if (!p)
		return error_reply("VM '%.40s' is not protected on this host", name);
	if (protection_hold_checkpoint(p, dump, (uint64_t)json_integer_value(size), err,
				       sizeof(err)) < 0)
		return error_reply("cannot hold a checkpoint of %s: %s", name, err);
	return json_pack("{s:b, s:o}", "ok", 1, "protection", protection_status_json(p));
}

json_t *cmd_release_checkpoint(const struct control_context *ctx, json_t *request)
{
	return on_protection(ctx, request, protection_release_checkpoint);
}

/*
 * switchover {vm, timeout_ms, unsafe_release_early}, on the primary
 * (protection.h): the VM stops at its next checkpoint and, once the backup
 * acknowledged it, waits paused for the backup's `failover`.  The reply
 * comes at once; status shows the steps under protection.switchover.
 */
json_t *cmd_switchover(const struct control_context *ctx, json_t *request)
{
	static const char *const allowed[] = { "vm", "timeout_ms", "unsafe_release_early", NULL };
	json_t *bad = check_members(request, allowed);
	const char *name;
	char err[320];

	if (bad || (bad = string_member(request, "vm", &name)))
		return bad;
	json_t *timeout = json_object_get(request, "timeout_ms");
	if (timeout && (!json_is_integer(timeout) ||
			json_integer_value(timeout) < SWITCHOVER_MIN_TIMEOUT_MS ||
			json_integer_value(timeout) > SWITCHOVER_MAX_TIMEOUT_MS))
		return error_reply("timeout_ms must be a whole number of ms in %d..%d",
				   SWITCHOVER_MIN_TIMEOUT_MS, SWITCHOVER_MAX_TIMEOUT_MS);
	json_t *unsafe = json_object_get(request, "unsafe_release_early");
	if (unsafe && !json_is_boolean(unsafe))
		return error_reply("unsafe_release_early must be true or false");
	struct vm *vm = vm_find(ctx->config.vms, name);
	struct protection *p = vm ? protection_of(vm) : NULL;
	if (!p)
		return error_reply("VM '%.40s' is not protected on this host: a switchover starts "
				   "on the host that runs it protected", name);
	unsigned ms = timeout ? (unsigned)json_integer_value(timeout)
			      : SWITCHOVER_DEFAULT_TIMEOUT_MS;
	if (protection_switchover(p, ms, unsafe && json_is_true(unsafe), err, sizeof(err)) < 0)
		return error_reply("cannot switch %s over: %s", name, err);
	return json_pack("{s:b, s:o}", "ok", 1, "protection", protection_status_json(p));
}

/* switchover-cancel {vm}: the VM resumes here, still protected, if the link is up. */
json_t *cmd_switchover_cancel(const struct control_context *ctx, json_t *request)
{
	struct protection *p;
	json_t *bad = find_protection(ctx, request, &p);
	char err[320];

	if (bad)
		return bad;
	if (protection_switchover_cancel(p, err, sizeof(err)) < 0)
		return error_reply("cannot cancel the switchover: %s", err);
	return json_pack("{s:b, s:o}", "ok", 1, "protection", protection_status_json(p));
}

/* image-checksums {vm, block, path}, on the backup (replication_server.h). */
json_t *cmd_image_checksums(const struct control_context *ctx, json_t *request)
{
	static const char *const allowed[] = { "vm", "block", "path", NULL };
	const struct control_config *cfg = &ctx->config;
	json_t *bad = check_members(request, allowed);
	const char *name, *block, *path;
	char err[256];

	if (bad || (bad = string_member(request, "vm", &name)) ||
	    (bad = string_member(request, "block", &block)) ||
	    (bad = string_member(request, "path", &path)))
		return bad;
	if (!cfg->replication)
		return error_reply("this daemon holds no replicas (it runs without --listen)");
	if (replication_server_image_checksums(cfg->replication, name, block, path, err,
					       sizeof(err)) < 0)
		return error_reply("image-checksums refused: %s", err);
	return ok_reply();
}

/* forget {vm}: retire the VM's idle replicas now (replica_retire.c). */
json_t *cmd_forget(const struct control_context *ctx, json_t *request)
{
	static const char *const allowed[] = { "vm", NULL };
	const struct control_config *cfg = &ctx->config;
	json_t *bad = check_members(request, allowed);
	const char *name;
	char err[256];

	if (bad || (bad = string_member(request, "vm", &name)))
		return bad;
	if (!cfg->replication)
		return error_reply("this daemon holds no replicas (it runs without --listen)");
	int n = replication_server_forget(cfg->replication, name, err, sizeof(err));
	if (n < 0)
		return error_reply("forget refused: %s", err);
	return json_pack("{s:b, s:i}", "ok", 1, "retired", n);
}

/* Control commands for VM fork: fork-start, fork-serve, fork-release, vm-release. */
#include <stdio.h>
#include <string.h>

#include "control/control_internal.h"
#include "control/control_json.h"
#include "primary/protection.h"
#include "backup/replication_server.h"
#include "vm/vm.h"
#include "fork/vm_fork.h"

/* The VM named by the request's "vm", or an error reply. */
static json_t *find_vm(const struct control_context *ctx, json_t *request,
		       struct vm **out)
{
	const char *name;
	json_t *bad = string_member(request, "vm", &name);

	if (bad)
		return bad;
	*out = vm_find(ctx->config.vms, name);
	if (!*out)
		return error_reply("no VM named '%.40s' on this host", name);
	return NULL;
}

/* The fork of the VM named by "vm": a running VM's, else its replica's. */
static struct vm_fork *find_fork(const struct control_context *ctx, json_t *request,
				    json_t **bad)
{
	const struct control_config *cfg = &ctx->config;
	const char *name;
	struct vm_fork *f = NULL;

	*bad = string_member(request, "vm", &name);
	if (*bad)
		return NULL;
	struct vm *vm = vm_find(cfg->vms, name);
	if (vm)
		f = vm_fork_of(vm);
	if (!f && cfg->replication)
		f = replication_server_fork(cfg->replication, name);
	if (!f)
		*bad = vm ? error_reply("VM %s has no fork (fork-start first)", name)
			  : error_reply("no VM named '%.40s' on this host, and no replica of one "
				     "with a fork", name);
	return f;
}

json_t *cmd_fork_start(const struct control_context *ctx, json_t *request)
{
	static const char *const allowed[] = { "vm", "clones", "push_mbps", NULL };
	const struct control_config *cfg = &ctx->config;
	json_t *bad = check_members(request, allowed);
	struct vm *vm;
	char err[512];

	if (bad)
		return bad;
	if (!cfg->forks)
		return error_reply("forks are not configured in this daemon");
	json_t *clones = json_object_get(request, "clones");
	if (!json_is_integer(clones))
		return error_reply("clones must be an integer (1 to 16)");
	json_t *mbps = json_object_get(request, "push_mbps");
	if (mbps && (!json_is_integer(mbps) || json_integer_value(mbps) < 0 ||
		     json_integer_value(mbps) > 1000000))
		return error_reply("push_mbps must be an integer, 0 (no cap) to 1000000");
	const char *name = json_string_value(json_object_get(request, "vm"));
	vm = name ? vm_find(cfg->vms, name) : NULL;
	if (!vm && name && cfg->replication) {
		/* A protected VM forks from its backup's committed image. */
		if (replication_server_fork_start(cfg->replication, name, cfg->forks,
						  (unsigned)json_integer_value(clones),
						  mbps ? (unsigned)json_integer_value(mbps) : 0,
						  err, sizeof(err)) < 0)
			return error_reply("cannot fork %s: %s", name, err);
		return json_pack("{s:b, s:o}", "ok", 1, "fork", vm_fork_status_json(
			replication_server_fork(cfg->replication, name)));
	}
	if ((bad = find_vm(ctx, request, &vm)))
		return bad;
	struct protection *p = protection_of(vm);
	if (p && !protection_finished(p))
		return error_reply("VM %s is protected: fork it from its backup's committed "
				   "image (fork-start on the backup's daemon; `remusdb fork` "
				   "does that)", vm_def(vm)->name);
	if (vm_fork_of(vm))
		return error_reply("VM %s already has a fork (fork-release it first)",
				   vm_def(vm)->name);
	struct vm_fork *f = vm_fork_start(ctx->loop, cfg->forks, vm,
					  (unsigned)json_integer_value(clones),
					  mbps ? (unsigned)json_integer_value(mbps) : 0, err, sizeof(err));
	if (!f)
		return error_reply("cannot fork %s: %s", vm_def(vm)->name, err);
	vm_fork_attach(vm, f);
	return json_pack("{s:b, s:o}", "ok", 1, "fork", vm_fork_status_json(f));
}

json_t *cmd_fork_serve(const struct control_context *ctx, json_t *request)
{
	static const char *const allowed[] = { "vm", "clone", "address", NULL };
	json_t *bad = check_members(request, allowed);
	const char *clone, *address;
	char err[256];

	if (bad || (bad = string_member(request, "clone", &clone)) ||
	    (bad = string_member(request, "address", &address)))
		return bad;
	struct vm_fork *f = find_fork(ctx, request, &bad);
	if (!f)
		return bad;
	if (vm_fork_serve(f, clone, address, err, sizeof(err)) < 0)
		return error_reply("cannot serve clone %s: %s", clone, err);
	return ok_reply();
}

json_t *cmd_fork_release(const struct control_context *ctx, json_t *request)
{
	static const char *const allowed[] = { "vm", NULL };
	const struct control_config *cfg = &ctx->config;
	json_t *bad = check_members(request, allowed);

	if (bad || !find_fork(ctx, request, &bad))
		return bad;
	const char *name = json_string_value(json_object_get(request, "vm"));
	struct vm *vm = vm_find(cfg->vms, name);
	if (vm && vm_fork_of(vm)) {
		json_t *last = vm_fork_status_json(vm_fork_of(vm));
		vm_fork_attach(vm, NULL);
		return json_pack("{s:b, s:o}", "ok", 1, "fork", last);
	}
	return json_pack("{s:b, s:o}", "ok", 1, "fork",
			 replication_server_fork_release(cfg->replication, name));
}

/*
 * vm-release {vm}: the clone joins the LAN.  vm-release {vm, mac, ip}: only
 * its new identity passes (before the guest re-identifies, so nothing of
 * it as the parent ever leaves).
 */
json_t *cmd_vm_release(const struct control_context *ctx, json_t *request)
{
	static const char *const allowed[] = { "vm", "mac", "ip", NULL };
	json_t *bad = check_members(request, allowed);
	struct vm *vm;
	char err[256];

	if (bad || (bad = find_vm(ctx, request, &vm)))
		return bad;
	if (json_object_get(request, "mac") || json_object_get(request, "ip")) {
		const char *mac, *ip;

		if ((bad = string_member(request, "mac", &mac)) ||
		    (bad = string_member(request, "ip", &ip)))
			return bad;
		if (vm_admit_identity(vm, mac, ip, err, sizeof(err)) < 0)
			return error_reply("%s", err);
		return ok_reply();
	}
	if (vm_release_quarantine(vm, err, sizeof(err)) < 0)
		return error_reply("%s", err);
	return ok_reply();
}

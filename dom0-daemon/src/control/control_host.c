/* Control commands for the host and its VMs: ping, status, vm-add, vm-remove, shutdown. */
#include <stdio.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "base/config.h"
#include "base/event_loop.h"
#include "base/loop_turns.h"
#include "backup/replication_server.h"
#include "control/control_internal.h"
#include "control/control_json.h"
#include "primary/protection_marker.h"
#include "primary/protect_settings.h"
#include "vm/vm.h"

/*
 * What an operator's per-VM protection file (`remusdb protect --config`)
 * is checked against: the witness, the fence command and which key this
 * daemon holds, as the first 16 hex digits of the SHA-256 of its bytes
 * (the file's content without its final newline), never the key itself.
 */
static json_t *settings_json(const struct repl_settings *repl)
{
	char fingerprint[17] = "";

	if (!repl)
		return json_object();
	if (repl->psk_len) {
		unsigned char md[EVP_MAX_MD_SIZE];
		unsigned int md_len = 0;

		if (EVP_Digest(repl->psk, repl->psk_len, md, &md_len, EVP_sha256(), NULL) &&
		    md_len >= 8)
			for (int i = 0; i < 8; i++)
				snprintf(fingerprint + 2 * i, 3, "%02x", md[i]);
	}
	return json_pack("{s:s, s:s, s:s?}", "etcd", repl->witness.endpoints,
			 "fence_command", repl->fence_command ? repl->fence_command : "",
			 "psk_sha256", fingerprint[0] ? fingerprint : NULL);
}

json_t *cmd_ping(const struct control_context *ctx, json_t *request)
{
	static const char *const allowed[] = { NULL };
	json_t *bad = check_members(request, allowed);

	if (bad)
		return bad;
	return json_pack("{s:b, s:s, s:I, s:s, s:o}", "ok", 1, "host", ctx->config.host,
			 "pid", (json_int_t)getpid(), "version", REMUSDBD_VERSION,
			 "settings", settings_json(ctx->config.repl));
}

json_t *cmd_status(const struct control_context *ctx, json_t *request)
{
	static const char *const allowed[] = { "vm", NULL };
	json_t *bad = check_members(request, allowed);
	const char *name;

	if (bad)
		return bad;
	if (!json_object_get(request, "vm"))
		return json_pack("{s:b, s:s, s:o, s:o, s:o, s:o}", "ok", 1, "host", ctx->config.host,
				 "vms", vm_registry_status_json(ctx->config.vms),
				 "replicas", ctx->config.replication ?
				 replication_server_status_json(ctx->config.replication) :
				 json_array(),
				 "memory", ctx->config.replication ?
				 replication_server_memory_json(ctx->config.replication) :
				 json_null(),
				 "loop", loop_turns_json(event_loop_turns(ctx->loop), monotonic_us()));
	if ((bad = string_member(request, "vm", &name)))
		return bad;
	struct vm *vm = vm_find(ctx->config.vms, name);
	if (!vm)
		return error_reply("no VM named '%.40s' (status without \"vm\" "
				   "lists them all)", name);
	return json_pack("{s:b, s:o}", "ok", 1, "vm", vm_status_json(vm));
}

json_t *cmd_vm_add(const struct control_context *ctx, json_t *request)
{
	struct vm_definition def;
	char err[512];
	json_t *fields = json_deep_copy(request);

	if (!fields)
		return error_reply("out of memory");
	json_object_del(fields, "cmd");
	json_object_del(fields, "id");
	int rc = vm_definition_from_json(fields, &def, err, sizeof(err));
	json_decref(fields);
	if (rc < 0 || vm_add(ctx->config.vms, &def, err, sizeof(err)) < 0)
		return error_reply("vm-add refused: %s", err);
	return json_pack("{s:b, s:o}", "ok", 1, "vm",
			 vm_status_json(vm_find(ctx->config.vms, def.name)));
}

json_t *cmd_vm_remove(const struct control_context *ctx, json_t *request)
{
	static const char *const allowed[] = { "vm", NULL };
	json_t *bad = check_members(request, allowed);
	const char *name;
	char err[512];

	if (bad || (bad = string_member(request, "vm", &name)))
		return bad;
	if (vm_remove(ctx->config.vms, name, err, sizeof(err)) < 0)
		return error_reply("vm-remove failed: %s", err);
	/* The VM is gone from this host: a restart has nothing to arbitrate. */
	if (ctx->config.repl) {
		protection_marker_delete(ctx->config.repl->state_dir, name);
		protect_settings_delete(ctx->config.repl->state_dir, name);
	}
	return ok_reply();
}

json_t *cmd_shutdown(const struct control_context *ctx, json_t *request)
{
	static const char *const allowed[] = { NULL };
	json_t *bad = check_members(request, allowed);

	return bad ? bad : ok_reply();
}

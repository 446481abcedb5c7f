/*
 * One replica's status object, as `status` lists it on a backup (the keys
 * tools and tests parse): the replica's own fields, then each feature's
 * part from the feature's own function.
 */
#include "backup/replica_status.h"

#include "backup/replica.h"
#include "wire/heartbeat.h"

json_t *replica_status_json(const struct replica *r, struct heartbeat_link *hb, int64_t now)
{
	int64_t heard = hb ? heartbeat_link_last_heard_us(hb) : r->last_heard_us;
	json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:b, s:s, s:I, s:s?}",
			      "vm", r->name, "role", "backup",
			      "state", replica_state_name(r->state),
			      "committed_epoch", (json_int_t)r->committed_epoch,
			      "epochs_committed", (json_int_t)r->epochs_committed,
			      "last_heard_ms", (json_int_t)((now - heard) / 1000),
			      "disk_synced", r->disk_synced, "peer", r->peer,
			      "generation", (json_int_t)r->ownership.generation,
			      "disk_replica", r->disk_path);
	if (!o)
		return NULL;
	json_object_set_new(o, "error", r->error[0] ? json_string(r->error) : json_null());
	json_object_set_new(o, "failover", failover_json(r));
	json_object_set_new(o, "flows", cp_flow_takeover_json(r));
	json_t *hbs = hb ? heartbeat_link_status_json(hb) : NULL;
	int64_t max_silence = hbs ? json_integer_value(json_object_get(hbs,
				"max_silence_ms")) : 0;
	json_object_set_new(o, "max_peer_silence_ms", json_integer(
		max_silence > r->max_silence_ms ? max_silence : r->max_silence_ms));
	json_object_set_new(o, "heartbeat", hbs ? hbs : json_null());
	json_object_set_new(o, "stream_max_silence_ms",
			    json_integer(r->stream_max_silence_ms));
	json_object_set_new(o, "coded_pages", coded_pages_json(r));
	json_object_set_new(o, "image_checksums", replica_checksums_json(r));
	/* in_memfd: a takeover now would map the image's RAM (ram_image.h). */
	json_object_set_new(o, "image", !r->image ? json_null() : json_pack(
		"{s:b, s:I}", "in_memfd", !ram_image_diverged(r->image),
		"pages_written", (json_int_t)ram_image_pages_written(r->image)));
	/* What admission counted it at (replica_memory.h); null before RAM_LAYOUT. */
	json_object_set_new(o, "memory", !r->image ? json_null() : json_pack(
		"{s:I, s:I, s:I, s:I, s:I}",
		"admitted_bytes", (json_int_t)replica_memory_total(&r->memory),
		"image_bytes", (json_int_t)r->memory.image,
		"staging_bytes", (json_int_t)r->memory.staging,
		"deferred_bytes", (json_int_t)r->memory.deferred,
		"takeover_bytes", (json_int_t)r->memory.takeover));
	json_t *fork = replica_fork_json(r);
	if (fork)
		json_object_set_new(o, "fork", fork);
	json_object_set_new(o, "retire", replica_retire_json(r));
	json_object_set_new(o, "disk_base", replica_disk_base_json(r));
	return o;
}

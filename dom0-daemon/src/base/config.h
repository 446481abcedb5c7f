/*
 * Daemon configuration: built-in defaults, then an optional `key = value`
 * file (--config), then command-line options, each overriding the last.
 * Parsing never exits or prints, so that it can be unit-tested; errors
 * come back as text in err.
 */
#ifndef REMUSDB_CONFIG_H
#define REMUSDB_CONFIG_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"

#define REMUSDBD_VERSION "0.1.0"
#define CONFIG_HOST_MAX 64
/* sun_path holds 108 bytes including the NUL. */
#define CONFIG_SOCKET_PATH_MAX 108

struct config {
	char host[CONFIG_HOST_MAX];         /* lab host name, for log lines */
	char control_path[CONFIG_SOCKET_PATH_MAX];
	char state_dir[PATH_MAX];           /* VM definitions live here */
	char log_path[PATH_MAX];            /* "" = stderr */
	enum log_level log_level;
	char config_path[PATH_MAX];         /* "" = no file */
	int show_help;
	int unsafe_no_flow_reset;           /* the negative control of the takeover's flow reset */
	unsigned retire_replicas_s;         /* replica_retire.c */
	char restore[8];                    /* takeover restore: "shared", "eager" or "lazy" */
	/* Replication (Remus): see docs/protocol.md and docs/witness.md. */
	char run_dir[PATH_MAX];             /* VM run dirs live in <run_dir>/vms */
	char listen[64];                    /* "ADDR:PORT" the backup side serves; "" = none */
	char http[64];                      /* "ADDR:PORT" of /metrics and the health checks; "" = off */
	char psk_file[PATH_MAX];            /* pre-shared key for peers */
	char etcd[512];                     /* etcd client URLs, comma-separated */
	char fence_command[PATH_MAX];       /* run before a takeover; "" = none */
	unsigned heartbeat_ms;              /* heartbeat interval, both ways */
	unsigned peer_timeout_ms;           /* silence after which the peer is dead */
	unsigned heartbeat_rt_priority;     /* SCHED_FIFO priority of the heartbeat thread; 0 = none */
	unsigned etcd_timeout_ms;           /* one etcd operation */
	unsigned max_inflight;              /* epochs sent but not acknowledged */
	unsigned pause_boost;               /* nice levels for a pausing QEMU; 0: none */
	unsigned read_index_mb;             /* disk read tracking index, per protected VM */
	unsigned compress_cache_mb;         /* ASC's cache of sent pages; 0 (unset): by percent */
	unsigned compress_cache_percent;    /* of guest RAM when no size is set; 0 (unset): 10 */
	uint64_t memory_limit_mb;           /* replicas' memory here (--memory-limit); 0: auto */
	char reprotect[8];                  /* "on" or "off": re-protect after the backup is lost */
	unsigned reprotect_first_ms;        /* the first wait before trying the backup again */
	unsigned reprotect_max_ms;          /* the wait doubles up to this */
};

#define CONFIG_DEFAULT_CONTROL "/run/remusdb/remusdbd.sock"
#define CONFIG_DEFAULT_STATE_DIR "/var/lib/remusdb"
#define CONFIG_DEFAULT_RUN_DIR "/run/remusdb"
/*
 * Four heartbeats: the real-time heartbeat thread kept every silence of a
 * live peer within 2 ms of the interval under the drill's load on a
 * 2-core TCG host (docs/protocol.md has the numbers and the trade-off).
 */
#define CONFIG_DEFAULT_HEARTBEAT_MS 50
#define CONFIG_DEFAULT_PEER_TIMEOUT_MS 200
/* Above every ordinary thread, below the kernel's own (heartbeat.h says why). */
#define CONFIG_DEFAULT_HEARTBEAT_RT_PRIORITY 10
#define CONFIG_MAX_RT_PRIORITY 99
#define CONFIG_DEFAULT_ETCD_TIMEOUT_MS 1000
#define CONFIG_DEFAULT_MAX_INFLIGHT 4
/* As the daemon's own Nice=-10: a pause weighs what the daemon does (primary/pause_boost.h). */
#define CONFIG_DEFAULT_PAUSE_BOOST 10
#define CONFIG_MAX_PAUSE_BOOST 20
/*
 * The read-tracking index (read_index.h) costs 41 bytes per 4 KiB block
 * it remembers: 64 MiB remember 1.6 million blocks, 6.4 GiB of disk
 * content, more than a guest's page cache and buffer pool hold in the
 * lab.  Up to 16 GiB per VM; beyond that a typo is likelier than a need.
 */
#define CONFIG_DEFAULT_READ_INDEX_MB 64
#define CONFIG_DEFAULT_RETIRE_REPLICAS_S 600
/*
 * A backup that comes back (its daemon restarted, its host rebooted) is
 * found within a second at first; a long absence costs one connection
 * attempt per 30 s.
 */
#define CONFIG_DEFAULT_REPROTECT_FIRST_MS 1000
#define CONFIG_DEFAULT_REPROTECT_MAX_MS 30000
#define CONFIG_MAX_READ_INDEX_MB 16384
/* The compression cache holds copies of guest pages: never more than a large guest. */
#define CONFIG_MAX_COMPRESS_CACHE_MB 65536

/* Defaults; host is this machine's hostname. */
void config_init(struct config *cfg);
/*
 * Applies command-line options (argv[0] is skipped).  Accepts `--key value`
 * and `--key=value`.  Returns 0, or -1 with a message in err.
 */
int config_parse_args(struct config *cfg, int argc, char **argv, char *err,
		      size_t errlen);
/* Applies a config file's text; origin names it in messages ("file:line: ..."). */
int config_parse_file_text(struct config *cfg, const char *text,
			   const char *origin, char *err, size_t errlen);
/* Settings that are each valid but do not fit together; 0, or -1 with err. */
int config_check(const struct config *cfg, char *err, size_t errlen);
/* Defaults, then --config's file if given, then the command line, then config_check. */
int config_load(struct config *cfg, int argc, char **argv, char *err,
		size_t errlen);
void config_print_usage(const char *program);

#endif

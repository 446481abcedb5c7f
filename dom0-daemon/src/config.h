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

#include "log.h"

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
};

#define CONFIG_DEFAULT_CONTROL "/run/remusdb/remusdbd.sock"
#define CONFIG_DEFAULT_STATE_DIR "/var/lib/remusdb"

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
/* Defaults, then --config's file if given, then the command line. */
int config_load(struct config *cfg, int argc, char **argv, char *err,
		size_t errlen);
void config_print_usage(const char *program);

#endif

/* Logging: one timestamped line per event (log.h). */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static FILE *log_stream;
static enum log_level log_min_level = LOG_INFO;
static const char *const level_names[] = { "debug", "info", "warn", "error" };
/* syslog priorities: LOG_DEBUG, LOG_INFO, LOG_WARNING, LOG_ERR */
static const int journal_priorities[] = { 7, 6, 4, 3 };
static int log_to_journal;

/*
 * systemd sets JOURNAL_STREAM to "DEV:INODE" of the stream it connected
 * to the journal; when that is our stderr, lines carry a "<N>" priority
 * prefix (sd-daemon(3)) and no timestamp of their own, the journal's.
 */
static int stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
		return 0;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

int log_open(const char *path, enum log_level min_level)
{
	log_min_level = min_level;
	if (!path) {
		log_to_journal = stderr_is_journal();
		return 0;
	}
	FILE *f = fopen(path, "a");
	if (!f)
		return -1;
	setvbuf(f, NULL, _IOLBF, 0);
	log_close();
	log_stream = f;
	return 0;
}

void log_close(void)
{
	if (log_stream)
		fclose(log_stream);
	log_stream = NULL;
}

int log_parse_level(const char *name, enum log_level *out)
{
	for (unsigned i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
		if (strcasecmp(name, level_names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	return -1;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	if (level < log_min_level)
		return;
	FILE *out = log_stream ? log_stream : stderr;
	struct timeval tv;
	struct tm tm;
	char stamp[32];

	gettimeofday(&tv, NULL);
	localtime_r(&tv.tv_sec, &tm);
	strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &tm);

	va_list ap;
	va_start(ap, fmt);
	flockfile(out);
	if (log_to_journal && out == stderr)
		fprintf(out, "<%d>", journal_priorities[level]);
	else
		fprintf(out, "%s.%03ld %-5s ", stamp, (long)(tv.tv_usec / 1000),
			level_names[level]);
	vfprintf(out, fmt, ap);
	fputc('\n', out);
	funlockfile(out);
	fflush(out);
	va_end(ap);
}

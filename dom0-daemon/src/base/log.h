/*
 * Logging: one line per event, timestamped, to stderr or a file; to the
 * journal (stderr under systemd) with a syslog priority prefix instead.
 */
#ifndef REMUSDB_LOG_H
#define REMUSDB_LOG_H

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

/* path NULL keeps stderr.  Returns 0 or -1 (errno set). */
int log_open(const char *path, enum log_level min_level);
void log_close(void);
int log_parse_level(const char *name, enum log_level *out);

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void log_msg(enum log_level level, const char *fmt, ...);

#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

#endif

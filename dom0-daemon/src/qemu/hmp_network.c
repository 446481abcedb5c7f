/*
 * Reads HMP `info network` for the state of QEMU's stream netdevs
 * (hmp_network.h says why the takeover asks).
 */
#include "qemu/hmp_network.h"

#include <stdbool.h>
#include <string.h>

#define TYPE_KEY ",type="
#define STREAM "stream"

static bool starts_with(const char *s, size_t len, const char *prefix)
{
	size_t n = strlen(prefix);

	return len >= n && !memcmp(s, prefix, n);
}

static const char *find(const char *s, size_t len, const char *needle)
{
	size_t n = strlen(needle);

	for (size_t i = 0; n <= len && i <= len - n; i++)
		if (!memcmp(s + i, needle, n))
			return s + i;
	return NULL;
}

/* One line: -1 not a stream netdev, 0 without its client, 1 with it. */
static int stream_line(const char *line, size_t len)
{
	const char *type = find(line, len, TYPE_KEY);

	if (!type || !find(line, (size_t)(type - line), ": index="))
		return -1;
	const char *value = type + strlen(TYPE_KEY);
	size_t rest = len - (size_t)(value - line);
	if (!starts_with(value, rest, STREAM ","))
		return -1;
	const char *info = value + strlen(STREAM ",");
	size_t info_len = rest - strlen(STREAM ",");
	while (info_len && (info[info_len - 1] == '\r' || info[info_len - 1] == ' '))
		info_len--;
	/* The failures net/stream.c names instead of a URI. */
	if (!info_len || starts_with(info, info_len, "connection error") ||
	    starts_with(info, info_len, "can't use"))
		return 0;
	return 1;
}

enum hmp_streams hmp_network_streams(const char *text, size_t len)
{
	bool any = false, waiting = false;
	size_t pos = 0;

	while (pos < len) {
		const char *line = text + pos;
		const char *nl = memchr(line, '\n', len - pos);
		size_t line_len = nl ? (size_t)(nl - line) : len - pos;
		int state = stream_line(line, line_len);

		if (state >= 0) {
			any = true;
			waiting |= state == 0;
		}
		pos += line_len + (nl ? 1 : 0);
	}
	if (!any)
		return HMP_NO_STREAM;
	return waiting ? HMP_STREAMS_WAITING : HMP_STREAMS_CONNECTED;
}

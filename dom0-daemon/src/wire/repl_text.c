/*
 * The text rules of the replication protocol: UTF-8 for ERROR reasons, BYE
 * text and VM_CONFIG, printable ASCII for host names and RAM block names.
 * Apart from the messages because several families share them.
 */
#include "wire/repl_proto.h"

#include <string.h>

#include "wire/repl_proto_internal.h"

/*
 * Length of the longest prefix of s made of complete, well-formed UTF-8
 * characters (no overlong forms, surrogates or code points > U+10FFFF).
 */
size_t repl_utf8_valid_prefix(const uint8_t *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		uint8_t c = s[i];
		size_t need;
		uint8_t lo = 0x80, hi = 0xbf; /* range of the second byte */

		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			need = 1;
		} else if (c >= 0xe0 && c <= 0xef) {
			need = 2;
			if (c == 0xe0)
				lo = 0xa0;
			else if (c == 0xed)
				hi = 0x9f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			need = 3;
			if (c == 0xf0)
				lo = 0x90;
			else if (c == 0xf4)
				hi = 0x8f;
		} else {
			return i;
		}
		if (n - i - 1 < need)
			return i;
		if (s[i + 1] < lo || s[i + 1] > hi)
			return i;
		for (size_t k = 2; k <= need; k++)
			if ((s[i + k] & 0xc0) != 0x80)
				return i;
		i += need + 1;
	}
	return n;
}

bool repl_is_printable_ascii(const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] < 0x20 || s[i] > 0x7e)
			return false;
	return true;
}

/*
 * Wire length of an ERROR reason or BYE text: valid UTF-8 or -1, cut to
 * REPL_TEXT_MAX at a character boundary.
 */
int repl_text_wire_length(const char *text, size_t *len)
{
	if (!text) {
		*len = 0;
		return 0;
	}
	size_t n = strlen(text);
	if (repl_utf8_valid_prefix((const uint8_t *)text, n) != n)
		return -1;
	if (n > REPL_TEXT_MAX)
		n = repl_utf8_valid_prefix((const uint8_t *)text, REPL_TEXT_MAX);
	*len = n;
	return 0;
}

/* A string for a fixed char[cap] field: 1..cap-1 printable ASCII bytes. */
bool repl_field_string_ok(const char *s, size_t cap, size_t *len)
{
	size_t n = strnlen(s, cap);

	if (n == 0 || n == cap || !repl_is_printable_ascii((const uint8_t *)s, n))
		return false;
	*len = n;
	return true;
}

/* ERROR reason and BYE text: <= REPL_TEXT_MAX bytes of UTF-8 without NUL. */
int repl_check_text(const uint8_t *s, size_t n, uint16_t type, const char **err)
{
	if (n > REPL_TEXT_MAX)
		return repl_fail(err, repl_errf("%s: text of %zu bytes exceeds %d", repl_type_name(type),
						n, REPL_TEXT_MAX));
	if (repl_utf8_valid_prefix(s, n) != n || memchr(s, '\0', n))
		return repl_fail(err, repl_errf("%s: text is not valid UTF-8", repl_type_name(type)));
	return 0;
}

/*
 * libFuzzer harness for the device state delta (device_delta.c), which
 * the backup decodes from the network: any record stream must be decoded
 * or refused without reading or writing out of bounds, for blob and base
 * lengths the input picks.  The input also drives the encoder: a blob
 * made from it, coded against a base made from it, must decode back to
 * itself.
 *
 * Build: make -C dom0-daemon build/fuzz_device_delta
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/buffer.h"
#include "codec/device_delta.h"

static void check(int ok)
{
	if (!ok)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t base[3 * DEVICE_DELTA_CHUNK + 77], out[3 * DEVICE_DELTA_CHUNK + 77];
	const char *err = NULL;

	if (size < 4)
		return 0;
	/* Lengths from the first four bytes: 0..sizeof(base) for each. */
	size_t total = ((size_t)data[0] << 8 | data[1]) % sizeof(out);
	size_t base_len = ((size_t)data[2] << 8 | data[3]) % (sizeof(base) + 1);
	data += 4;
	size -= 4;
	for (size_t i = 0; i < sizeof(base); i++)
		base[i] = (uint8_t)(i * 29 + 3);

	/* Decoding as the backup would; a blob of 0 bytes is always refused. */
	int rc = device_delta_decode(data, size, base, base_len, out, total, &err);
	check(rc == 0 || err != NULL);
	check(total != 0 || rc == -1);

	/* Encoding: cur is the input itself (truncated), against the base. */
	size_t cur_len = size < sizeof(out) ? size : sizeof(out);
	if (cur_len == 0)
		return 0;
	struct buffer rec;
	buffer_init(&rec);
	check(device_delta_encode(data, cur_len, base, base_len, &rec) == 0);
	check(buffer_len(&rec) <= cur_len + (cur_len + DEVICE_DELTA_CHUNK - 1) / DEVICE_DELTA_CHUNK);
	check(device_delta_decode(buffer_head(&rec), buffer_len(&rec), base, base_len, out,
				  cur_len, &err) == 0);
	check(memcmp(out, data, cur_len) == 0);
	buffer_free(&rec);
	return 0;
}

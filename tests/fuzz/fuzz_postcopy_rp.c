/*
 * libFuzzer harness for the postcopy return-path parser (pcw_rp_feed): the
 * bytes a clone QEMU sends back to remusdbd.  The input is fed three ways
 * (whole; split at a point taken from data[0]; one byte at a time) and all
 * three must give the same result, error message and callbacks.  The
 * request callback refuses some requests (chosen by their offset) so that
 * the sticky error after a refusal is exercised too.
 *
 * Build: `make -C dom0-daemon build/fuzz_postcopy_rp` (or `make fuzz`).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fork/postcopy_wire.h"

struct tally {
	uint64_t requests, shuts;
	uint64_t sum;
};

static int on_request(void *o, const char *block, uint64_t start, uint32_t len)
{
	struct tally *t = o;
	size_t n = strlen(block);

	if (n == 0 || n > 255)
		abort(); /* a request always names a block of 1..255 bytes */
	t->requests++;
	t->sum = t->sum * 31 + start + len + (uint8_t)block[0] + (uint8_t)block[n - 1] + n;
	return (start & 0xfff) == 0xabc;
}

static int on_shut(void *o, uint32_t error)
{
	struct tally *t = o;

	t->shuts++;
	t->sum = t->sum * 37 + error;
	return 0;
}

struct outcome {
	int rc;
	struct tally t;
	char error[160];
	char block[256];
};

static struct pcw_rp_parser parser;

static void run(const uint8_t *data, size_t size, size_t split, int bytewise,
		struct outcome *out)
{
	struct pcw_rp_callbacks cb = { &out->t, on_request, on_shut };
	int rc = 0;

	memset(out, 0, sizeof(*out));
	pcw_rp_init(&parser, &cb);
	if (bytewise) {
		for (size_t i = 0; i < size && rc == 0; i++)
			rc = pcw_rp_feed(&parser, data + i, 1);
	} else {
		rc = pcw_rp_feed(&parser, data, split);
		if (rc == 0)
			rc = pcw_rp_feed(&parser, data + split, size - split);
	}
	if (rc != 0 && rc != -1)
		abort();
	if (rc == -1 && !parser.error[0])
		abort(); /* every error has a message */
	if (rc == -1 && pcw_rp_feed(&parser, data, size) != -1)
		abort(); /* sticky */
	out->rc = rc;
	memcpy(out->error, parser.error, sizeof(out->error));
	memcpy(out->block, parser.block, sizeof(out->block));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct outcome whole, split, bytes;

	if (size == 0)
		return 0;
	run(data, size, size, 0, &whole);
	run(data, size, data[0] % (size + 1), 0, &split);
	run(data, size, 0, 1, &bytes);
	if (memcmp(&whole, &split, sizeof(whole)) || memcmp(&whole, &bytes, sizeof(whole)))
		abort();
	return 0;
}

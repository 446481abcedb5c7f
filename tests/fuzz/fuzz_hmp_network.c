/*
 * libFuzzer harness for the reader of HMP `info network`
 * (qemu/hmp_network.h): text straight from QEMU's monitor.  A heap copy
 * of exactly `size` bytes, no terminator, so ASan sees any overread.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qemu/hmp_network.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *copy = malloc(size ? size : 1);

	if (!copy)
		return 0;
	memcpy(copy, data, size);
	enum hmp_streams st = hmp_network_streams(copy, size);
	if (st != HMP_NO_STREAM && st != HMP_STREAMS_WAITING && st != HMP_STREAMS_CONNECTED)
		abort();
	free(copy);
	return 0;
}

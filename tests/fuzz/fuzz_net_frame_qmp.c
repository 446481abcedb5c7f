/*
 * libFuzzer harness for the two parsers that read bytes straight from
 * QEMU: the stream netdev framing and the QMP message splitter.  Both see
 * the same input, consumed the way the daemon consumes its buffers, so a
 * crash, leak or overread here is one a misbehaving QEMU could trigger.
 *
 * Build: clang -fsanitize=fuzzer,address,undefined -Idom0-daemon/src \
 *   tests/fuzz/fuzz_net_frame_qmp.c dom0-daemon/src/relay/net_frame.c \
 *   dom0-daemon/src/qemu/qmp.c dom0-daemon/src/base/event_loop.c \
 *   dom0-daemon/src/base/buffer.c dom0-daemon/src/base/log.c -ljansson
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "relay/net_frame.h"
#include "qemu/qmp.h"

static void fuzz_frames(const uint8_t *data, size_t size)
{
	struct net_frame frame;
	size_t pos = 0;

	while (net_frame_decode(data + pos, size - pos, &frame) == NET_FRAME_OK) {
		/* Touch both ends of the payload so ASan checks the bounds. */
		volatile uint8_t sink = frame.payload[0] ^
					frame.payload[frame.len - 1];
		(void)sink;
		if (frame.consumed == 0 || frame.consumed > size - pos)
			abort();
		pos += frame.consumed;
	}
}

static void fuzz_qmp(const uint8_t *data, size_t size)
{
	/* A heap copy of exactly `size` bytes: no terminator to lean on. */
	char *copy = malloc(size ? size : 1);
	size_t pos = 0;

	if (!copy)
		return;
	memcpy(copy, data, size);
	for (;;) {
		size_t consumed = 0;
		json_t *message = qmp_parse_message(copy + pos, size - pos,
						    &consumed);

		if (message && !json_is_object(message))
			abort();
		if (!message && consumed == 0)
			break;
		if (consumed == 0 || consumed > size - pos)
			abort();
		json_decref(message);
		pos += consumed;
	}
	free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_frames(data, size);
	fuzz_qmp(data, size);
	return 0;
}

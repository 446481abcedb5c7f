/*
 * libFuzzer harness for the heartbeat datagram parser: every datagram a
 * UDP socket on the replication address receives goes through
 * heartbeat_peek, and those with a known link id through
 * heartbeat_verify, so neither may misread any byte string.  Half of the
 * time the input is first given a valid header, so the fuzzer reaches
 * the MAC check as well.  Built by `make fuzz` (dom0-daemon/Makefile).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "wire/heartbeat_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t key[HEARTBEAT_KEY_SIZE] = { 7 };
	uint8_t d[HEARTBEAT_DATAGRAM_SIZE];
	struct heartbeat_msg m;
	const char *err;

	if (heartbeat_peek(data, size, &m, &err) == 0) {
		memcpy(d, data, sizeof(d));
		(void)heartbeat_verify(d, key);
	}
	if (size >= HEARTBEAT_DATAGRAM_SIZE && (data[0] & 1)) {
		struct heartbeat_msg valid = { .link_id = 1, .seq = 2 };
		heartbeat_encode(&valid, key, d);
		memcpy(d + HEARTBEAT_SIGNED_SIZE, data, HEARTBEAT_DATAGRAM_SIZE - HEARTBEAT_SIGNED_SIZE);
		if (heartbeat_peek(d, sizeof(d), &m, &err) == 0 && heartbeat_verify(d, key))
			__builtin_trap(); /* a MAC the fuzzer guessed: impossible, so a bug */
	}
	return 0;
}

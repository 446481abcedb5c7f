/*
 * libFuzzer harness for commit protection's frame parser (cp_flow_frame.c),
 * which reads every frame the guest sends: any bytes must classify without
 * reading out of bounds; a marked IP frame with its mark cleared must no
 * longer be marked, keep its length, flow and ECN bits, and an IPv4 header
 * whose checksum was valid must stay valid.  TCP's sequence fields are
 * read only from a whole header, and a segment never claims more payload
 * than its IP length allows.  The takeover's flow reset reads the same
 * frames (cp_flow_reset.c): it must take any frame too, and the frames it
 * builds must classify back to what it built.
 *
 * Build: make -C dom0-daemon build/fuzz_cp_flow_frame
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "relay/cp_flow_frame.h"
#include "relay/cp_flow_reset.h"

static void check(int ok)
{
	if (!ok)
		abort();
}

static int ipv4_header_sum_ok(const uint8_t *ip, size_t ihl)
{
	uint32_t sum = 0;

	for (size_t i = 0; i + 1 < ihl; i += 2)
		sum += (uint32_t)(ip[i] << 8 | ip[i + 1]);
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return sum == 0xffff;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct cp_flow_frame f, again;

	if (size < 1)
		return 0;
	uint8_t dscp = (uint8_t)(1 + data[0] % 63);
	const uint8_t *frame = data + 1;
	size_t len = size - 1;
	/* An exact-size copy, so ASan sees any read past the frame. */
	uint8_t *copy = malloc(len ? len : 1);

	check(copy != NULL);
	memcpy(copy, frame, len);
	cp_flow_frame_classify(copy, len, dscp, &f);
	check(!f.marked || f.ip);
	check(!f.tcp || f.ip);
	check(!f.seq_valid || f.tcp);
	/* Payload (seg_len less SYN and FIN) fits in the 16-bit IP length. */
	check(!f.seq_valid || f.seg_len <= 65535 + 2);
	if (f.seq_valid) {
		/* The reset engine's own frame for this flow reads back as built. */
		uint8_t built[128];
		struct cp_flow_frame b;
		size_t n = cp_flow_reset_build(built, &f.key, f.dst_mac, f.src_mac, f.seq, f.ack,
					       f.tcp_flags);
		cp_flow_frame_classify(built, n, dscp, &b);
		check(b.seq_valid && b.seq == f.seq && b.ack == f.ack && b.tcp_flags == f.tcp_flags);
		check(memcmp(&b.key, &f.key, sizeof(f.key)) == 0);
		check(b.seg_len == !!(f.tcp_flags & CP_TCP_SYN) + !!(f.tcp_flags & CP_TCP_FIN));
	}
	if (f.marked) {
		uint8_t ecn_before = f.key.family == 4 ? copy[f.ip_offset + 1] & 3
						       : (copy[f.ip_offset + 1] >> 4) & 3;
		size_t ihl = (size_t)(copy[f.ip_offset] & 0x0f) * 4;
		int sum_ok = f.key.family == 4 && ipv4_header_sum_ok(copy + f.ip_offset, ihl);
		cp_flow_frame_clear_mark(copy, &f);
		cp_flow_frame_classify(copy, len, dscp, &again);
		check(again.ip && !again.marked);
		check(again.tcp == f.tcp);
		check(memcmp(&again.key, &f.key, sizeof(f.key)) == 0);
		uint8_t ecn_after = f.key.family == 4 ? copy[f.ip_offset + 1] & 3
						      : (copy[f.ip_offset + 1] >> 4) & 3;
		check(ecn_before == ecn_after);
		if (sum_ok)
			check(ipv4_header_sum_ok(copy + f.ip_offset, ihl));
	}
	free(copy);
	return 0;
}

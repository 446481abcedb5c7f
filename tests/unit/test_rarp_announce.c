/*
 * The takeover's early announcement of the guest's MAC (rarp_announce.c):
 * the frame, byte for byte as RFC 903 lays out a reverse request, and the
 * MAC parser's refusals.
 */
#include <CUnit/CUnit.h>
#include <string.h>

#include "relay/rarp_announce.h"
#include "suites.h"

static void test_announce_frame(void)
{
	const uint8_t mac[6] = { 0x52, 0x54, 0x00, 0xcb, 0x4e, 0x43 };
	static const uint8_t expect[RARP_ANNOUNCE_LEN] = {
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff,   /* broadcast */
		0x52, 0x54, 0x00, 0xcb, 0x4e, 0x43,   /* from the guest's MAC */
		0x80, 0x35,                           /* RARP */
		0x00, 0x01, 0x08, 0x00, 6, 4,         /* Ethernet, IPv4, lengths */
		0x00, 0x03,                           /* reverse request */
		0x52, 0x54, 0x00, 0xcb, 0x4e, 0x43, 0, 0, 0, 0,
		0x52, 0x54, 0x00, 0xcb, 0x4e, 0x43, 0, 0, 0, 0,
		/* zero padding to 60 bytes */
	};
	uint8_t frame[RARP_ANNOUNCE_LEN];

	memset(frame, 0xaa, sizeof(frame));
	CU_ASSERT_EQUAL(rarp_announce(mac, frame), RARP_ANNOUNCE_LEN);
	CU_ASSERT_EQUAL(memcmp(frame, expect, sizeof(expect)), 0);
}

static void test_parse_mac(void)
{
	uint8_t mac[6] = { 0 };

	CU_ASSERT_EQUAL(rarp_parse_mac("52:54:00:cb:4e:43", mac), 0);
	CU_ASSERT(mac[0] == 0x52 && mac[3] == 0xcb && mac[5] == 0x43);
	CU_ASSERT_EQUAL(rarp_parse_mac("", mac), -1);
	CU_ASSERT_EQUAL(rarp_parse_mac(NULL, mac), -1);
	CU_ASSERT_EQUAL(rarp_parse_mac("52:54:00:cb:4e", mac), -1);
	CU_ASSERT_EQUAL(rarp_parse_mac("52:54:00:cb:4e:43:01", mac), -1);
	CU_ASSERT_EQUAL(rarp_parse_mac("52:54:00:cb:4e:4g", mac), -1);
	CU_ASSERT_EQUAL(rarp_parse_mac("52-54-00-cb-4e-43", mac), -1);
}

int register_rarp_announce_tests(void)
{
	CU_pSuite suite = CU_add_suite("rarp_announce", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "the announcement frame", test_announce_frame) ||
	    !CU_add_test(suite, "MAC parsing", test_parse_mac))
		return -1;
	return 0;
}

/*
 * Reading HMP `info network` for the takeover's wait on the NIC's stream
 * (qemu/hmp_network.h), from lines as QEMU 7.2's print_net_client prints
 * them: before the stream netdev has a client, after, and after a failure.
 */
#include <CUnit/CUnit.h>
#include <string.h>

#include "qemu/hmp_network.h"
#include "suites.h"

#define NIC " \\ net0: index=0,type=nic,model=virtio-net-pci,macaddr=52:54:00:78:2f:83\r\n"

static enum hmp_streams streams(const char *text)
{
	return hmp_network_streams(text, strlen(text));
}

static void test_a_stream_without_its_client_is_waited_for(void)
{
	CU_ASSERT_EQUAL(streams("net0: index=0,type=stream,\r\n" NIC), HMP_STREAMS_WAITING);
	/* the last line without its newline, as a reply may end */
	CU_ASSERT_EQUAL(streams("net0: index=0,type=stream,"), HMP_STREAMS_WAITING);
	CU_ASSERT_EQUAL(streams("net0: index=0,type=stream,connection error\r\n"),
			HMP_STREAMS_WAITING);
	CU_ASSERT_EQUAL(streams("net0: index=0,type=stream,can't use file descriptor 3 "
				"(errno 22)\r\n"), HMP_STREAMS_WAITING);
}

static void test_a_stream_with_its_client_is_connected(void)
{
	/* verbatim from the lab's QEMU 7.2.22: the NIC, its peer indented under it */
	CU_ASSERT_EQUAL(streams("virtio-net-pci.0: index=0,type=nic,model=virtio-net-pci,"
				"macaddr=52:54:00:78:2f:83\r\n \\ net0: index=0,type=stream,"
				"unix:/run/remusdb/primary/vms/soak1/net.sock\r\n"),
			HMP_STREAMS_CONNECTED);
	CU_ASSERT_EQUAL(streams("virtio-net-pci.0: index=0,type=nic,model=virtio-net-pci,"
				"macaddr=52:54:00:78:2f:83\r\n \\ net0: index=0,type=stream,"
				"\r\n"), HMP_STREAMS_WAITING);
	CU_ASSERT_EQUAL(streams("net0: index=0,type=stream,unix:/run/remusdb/backup/vms/v/"
				"net.sock\r\n" NIC), HMP_STREAMS_CONNECTED);
}

static void test_every_stream_must_have_its_client(void)
{
	const char *one_of_two = "a: index=0,type=stream,unix:/x\r\n"
				 "b: index=0,type=stream,\r\n";
	const char *both = "a: index=0,type=stream,unix:/x\r\n"
			   "b: index=0,type=stream,tcp:10.0.0.1:5\r\n";

	CU_ASSERT_EQUAL(streams(one_of_two), HMP_STREAMS_WAITING);
	CU_ASSERT_EQUAL(streams(both), HMP_STREAMS_CONNECTED);
}

static void test_no_stream_netdev_is_nothing_to_wait_for(void)
{
	CU_ASSERT_EQUAL(streams(""), HMP_NO_STREAM);
	CU_ASSERT_EQUAL(streams("hub0port0: index=0,type=tap,ifname=tap0,script=no\r\n" NIC),
			HMP_NO_STREAM);
	/* "stream" elsewhere than the type is no stream netdev */
	CU_ASSERT_EQUAL(streams("stream: index=0,type=tap,type=stream,\r\n" NIC),
			HMP_NO_STREAM);
	CU_ASSERT_EQUAL(streams("garbage type=stream,\r\n"), HMP_NO_STREAM);
	CU_ASSERT_EQUAL(streams("x: index=0,type=streamer,\r\n"), HMP_NO_STREAM);
}

int register_hmp_network_tests(void)
{
	CU_pSuite suite = CU_add_suite("hmp_network", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "a stream without its client is waited for",
			 test_a_stream_without_its_client_is_waited_for) ||
	    !CU_add_test(suite, "a stream with its client is connected",
			 test_a_stream_with_its_client_is_connected) ||
	    !CU_add_test(suite, "every stream must have its client",
			 test_every_stream_must_have_its_client) ||
	    !CU_add_test(suite, "no stream netdev: nothing to wait for",
			 test_no_stream_netdev_is_nothing_to_wait_for))
		return -1;
	return 0;
}

/*
 * Unit tests for base/unmap_later.c: a large mapping and its file are
 * gone once the unmaps are drained, a small one at once.
 */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/unmap_later.h"
#include "suites.h"

static bool mapped(void *addr, size_t len)
{
	unsigned char vec[1];

	/* mincore fails with ENOMEM on an address range that is not mapped */
	return mincore(addr, len < 4096 ? len : 4096, vec) == 0;
}

static bool fd_open(int fd)
{
	return fcntl(fd, F_GETFD) != -1 || errno != EBADF;
}

static void test_a_large_image_is_gone_once_drained(void)
{
	size_t len = UNMAP_LATER_MIN_BYTES;
	int fd = memfd_create("unmap-later-test", MFD_CLOEXEC);

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(ftruncate(fd, (off_t)len) == 0);
	void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CU_ASSERT_FATAL(mem != MAP_FAILED);
	memset(mem, 0xab, len); /* every page present, as in a replica's image */
	unmap_later(mem, len, fd);
	unmap_later_drain();
	CU_ASSERT_EQUAL(unmap_later_running(), 0);
	CU_ASSERT_FALSE(mapped(mem, len));
	CU_ASSERT_FALSE(fd_open(fd));
}

static void test_a_small_mapping_goes_at_once(void)
{
	size_t len = 1 << 20;
	void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	CU_ASSERT_FATAL(mem != MAP_FAILED);
	CU_ASSERT_TRUE(mapped(mem, len));
	unmap_later(mem, len, -1);
	CU_ASSERT_FALSE(mapped(mem, len)); /* no drain needed */
	unmap_later(NULL, 0, -1);         /* nothing: a no-op */
}

int register_unmap_later_tests(void)
{
	CU_pSuite suite = CU_add_suite("unmap_later", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "a large image is gone once drained",
			 test_a_large_image_is_gone_once_drained) ||
	    !CU_add_test(suite, "a small mapping goes at once", test_a_small_mapping_goes_at_once))
		return -1;
	return 0;
}

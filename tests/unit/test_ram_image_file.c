/*
 * The image's memfds (ram_image_file.c): a takeover's QEMU reads the
 * committed image from the main RAM block's memfd, and a fork() taken
 * while the image is diverged sees it frozen, whatever the daemon stores
 * afterwards, until converging writes those stores back.
 */
#include <CUnit/CUnit.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "image/ram_image.h"
#include "qemu/migration_writer.h"
#include "suites.h"

#define PAGE MIG_PAGE_SIZE
#define PAGES 64

static struct ram_image *image(void)
{
	const char *names[] = { "pc.ram", "pc.bios" };
	uint64_t lengths[] = { PAGES * PAGE, 4 * PAGE };
	char err[256] = "";
	struct ram_image *img = ram_image_create("pc", 2, names, lengths, 2, err, sizeof(err));

	CU_ASSERT_STRING_EQUAL(err, "");
	return img;
}

static void store(struct ram_image *img, uint64_t page, uint8_t value)
{
	uint8_t data[PAGE];

	memset(data, value, sizeof(data));
	CU_ASSERT_EQUAL(ram_image_store_page(img, 0, page, data), 0);
}

/* The first byte of the page as the memfd holds it (what QEMU would map). */
static int in_file(int fd, uint64_t page)
{
	uint8_t byte = 0;

	if (pread(fd, &byte, 1, (off_t)(page * PAGE)) != 1)
		return -1;
	return byte;
}

static int page_at_first_byte(const struct ram_image *img, uint64_t page)
{
	return ram_image_block(img, 0)->mem[page * PAGE];
}

/*
 * fork()s a child that waits for a byte on `go`, then reports on `seen`
 * the first byte of page 7 of block 0 in its own view of the image.
 */
static pid_t child_reading_page_7(const struct ram_image *img, int go[2], int seen[2])
{
	CU_ASSERT_EQUAL_FATAL(pipe(go), 0);
	CU_ASSERT_EQUAL_FATAL(pipe(seen), 0);
	pid_t pid = fork();
	if (pid == 0) {
		uint8_t b;

		if (read(go[0], &b, 1) != 1)
			_exit(2);
		b = ram_image_block(img, 0)->mem[7 * PAGE];
		_exit(write(seen[1], &b, 1) == 1 ? 0 : 3);
	}
	return pid;
}

static int what_the_child_saw(pid_t pid, int go[2], int seen[2])
{
	uint8_t b = 0;
	int status = 0;

	CU_ASSERT_EQUAL(write(go[1], "x", 1), 1);
	CU_ASSERT_EQUAL(read(seen[0], &b, 1), 1);
	CU_ASSERT_EQUAL(waitpid(pid, &status, 0), pid);
	CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	for (int i = 0; i < 2; i++) {
		close(go[i]);
		close(seen[i]);
	}
	return b;
}

static void test_memfd_holds_the_committed_image(void)
{
	struct ram_image *img = image();
	uint64_t length = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	int fd = ram_image_shared_fd(img, "pc.ram", &length);
	CU_ASSERT(fd >= 0);
	CU_ASSERT_EQUAL(length, PAGES * PAGE);
	CU_ASSERT_EQUAL(ram_image_shared_fd(img, "no.such", &length), -1);
	store(img, 3, 0x33);
	CU_ASSERT_EQUAL(in_file(fd, 3), 0x33);
	CU_ASSERT_EQUAL(in_file(fd, 4), 0); /* never written: zero */
	CU_ASSERT_EQUAL(ram_image_store_page(img, 0, 3, NULL), 0);
	CU_ASSERT_EQUAL(in_file(fd, 3), 0);
	ram_image_destroy(img);
}

static void test_fork_of_a_diverged_image_sees_it_frozen(void)
{
	struct ram_image *img = image();
	int go[2], seen[2];
	uint64_t length = 0, back = 99;
	char err[256] = "";

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	int fd = ram_image_shared_fd(img, "pc.ram", &length);
	store(img, 7, 0x11);
	CU_ASSERT_EQUAL_FATAL(ram_image_diverge(img, err, sizeof(err)), 0);
	CU_ASSERT_TRUE(ram_image_diverged(img));
	CU_ASSERT_EQUAL(ram_image_diverge(img, err, sizeof(err)), 0); /* already */
	/* Diverged, the memfd is not the image: a takeover must not map it. */
	CU_ASSERT_EQUAL(ram_image_shared_fd(img, "pc.ram", &length), -1);
	pid_t pid = child_reading_page_7(img, go, seen);
	CU_ASSERT_FATAL(pid > 0);
	store(img, 7, 0x22);
	store(img, 9, 0x99);
	CU_ASSERT_EQUAL(page_at_first_byte(img, 7), 0x22); /* the daemon reads its own stores */
	CU_ASSERT_EQUAL(what_the_child_saw(pid, go, seen), 0x11);
	CU_ASSERT_EQUAL(in_file(fd, 7), 0x11);
	CU_ASSERT_EQUAL(in_file(fd, 9), 0);
	CU_ASSERT_EQUAL(ram_image_converge(img, &back, err, sizeof(err)), 0);
	CU_ASSERT_FALSE(ram_image_diverged(img));
	CU_ASSERT_EQUAL(back, 2);
	CU_ASSERT_EQUAL(ram_image_shared_fd(img, "pc.ram", &length), fd);
	CU_ASSERT_EQUAL(in_file(fd, 7), 0x22);
	CU_ASSERT_EQUAL(in_file(fd, 9), 0x99);
	/* Shared again: a store reaches the memfd at once. */
	store(img, 7, 0x44);
	CU_ASSERT_EQUAL(in_file(fd, 7), 0x44);
	CU_ASSERT_EQUAL(ram_image_converge(img, &back, err, sizeof(err)), 0); /* no-op */
	ram_image_destroy(img);
}

/*
 * The control: without diverging, the child's view follows the daemon's
 * later stores, so the frozen view above is the divergence's doing.
 */
static void test_fork_of_a_shared_image_is_not_frozen(void)
{
	struct ram_image *img = image();
	int go[2], seen[2];

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	store(img, 7, 0x11);
	pid_t pid = child_reading_page_7(img, go, seen);
	CU_ASSERT_FATAL(pid > 0);
	store(img, 7, 0x22);
	CU_ASSERT_EQUAL(what_the_child_saw(pid, go, seen), 0x22);
	ram_image_destroy(img);
}

/*
 * Converging a slice at a time: each call writes at most its budget and
 * says whether pages remain; a store between slices goes back too; only
 * the last slice makes the memfd the image again.
 */
static void test_converging_in_slices(void)
{
	struct ram_image *img = image();
	uint64_t length = 0, written = 0, total = 0;
	char err[256] = "";
	int rc, calls = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	int fd = ram_image_shared_fd(img, "pc.ram", &length);
	CU_ASSERT_EQUAL_FATAL(ram_image_diverge(img, err, sizeof(err)), 0);
	for (uint64_t p = 10; p < 17; p++)   /* a run of 7 */
		store(img, p, (uint8_t)p);
	store(img, 40, 40);
	store(img, 63, 63);                   /* the block's last page */
	CU_ASSERT_EQUAL(ram_image_converge_some(img, 4, &written, err, sizeof(err)), 1);
	CU_ASSERT_EQUAL(written, 4);
	CU_ASSERT_EQUAL(in_file(fd, 13), 13);
	CU_ASSERT_EQUAL(in_file(fd, 14), 0);  /* not yet */
	CU_ASSERT_TRUE(ram_image_diverged(img));
	store(img, 11, 0x77);                 /* stored again after its write-back */
	total = written;
	do {
		rc = ram_image_converge_some(img, 4, &written, err, sizeof(err));
		total += written;
		calls++;
	} while (rc == 1 && calls < 100);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_EQUAL(total, 10);
	CU_ASSERT_FALSE(ram_image_diverged(img));
	CU_ASSERT_EQUAL(ram_image_shared_fd(img, "pc.ram", &length), fd);
	CU_ASSERT_EQUAL(in_file(fd, 11), 0x77);
	CU_ASSERT_EQUAL(in_file(fd, 16), 16);
	CU_ASSERT_EQUAL(in_file(fd, 40), 40);
	CU_ASSERT_EQUAL(in_file(fd, 63), 63);
	ram_image_destroy(img);
}

/* A diverged image is destroyed whole (ASan and valgrind watch the bitmaps). */
static void test_diverged_image_is_destroyed_whole(void)
{
	struct ram_image *img = image();
	char err[256] = "";

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	CU_ASSERT_EQUAL(ram_image_diverge(img, err, sizeof(err)), 0);
	store(img, 1, 0x55);
	ram_image_destroy(img);
}

int register_ram_image_file_tests(void)
{
	CU_pSuite suite = CU_add_suite("ram_image_file", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "the memfd holds the committed image",
			 test_memfd_holds_the_committed_image) ||
	    !CU_add_test(suite, "a fork of a diverged image sees it frozen",
			 test_fork_of_a_diverged_image_sees_it_frozen) ||
	    !CU_add_test(suite, "control: a fork of a shared image is not frozen",
			 test_fork_of_a_shared_image_is_not_frozen) ||
	    !CU_add_test(suite, "converging in slices", test_converging_in_slices) ||
	    !CU_add_test(suite, "a diverged image is destroyed whole",
			 test_diverged_image_is_destroyed_whole))
		return -1;
	return 0;
}

/*
 * The whole-read helpers (base/fs_util.h): read_full and pread_full go
 * on over short reads and EINTR, stop at end of file with the count, and
 * pass errors on with errno.  Each check is a function over the reader,
 * so that it also runs against a planted bug (one read only, EINTR taken
 * as an error, an offset that does not advance) and must fail it: a
 * check that cannot tell them apart would prove nothing.
 */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/fs_util.h"
#include "suites.h"

typedef ssize_t (*reader_fn)(int fd, void *buf, size_t len);
typedef ssize_t (*preader_fn)(int fd, void *buf, size_t len, uint64_t offset);

/* ---- planted bugs: each must fail at least one check below ----------- */

static ssize_t read_once(int fd, void *buf, size_t len)
{
	ssize_t n;

	do
		n = read(fd, buf, len);
	while (n < 0 && errno == EINTR);
	return n;
}

static ssize_t read_eintr_fails(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, p + got, len - got);
		if (n < 0)
			return -1;
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

static ssize_t pread_offset_stuck(int fd, void *buf, size_t len, uint64_t offset)
{
	uint8_t *p = buf;
	size_t got = 0;

	while (got < len) {
		ssize_t n = pread(fd, p + got, len - got, (off_t)offset);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -1 : (ssize_t)got;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

/* ---- the checks -------------------------------------------------------- */

/*
 * A SOCK_SEQPACKET socket gives one message per read: three messages are
 * three short reads.  The writer's end is closed, so a fourth read is
 * end of file.
 */
static int three_messages_then_eof(void)
{
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return -1;
	if (write(sv[1], "abc", 3) != 3 || write(sv[1], "defg", 4) != 4 ||
	    write(sv[1], "hi", 2) != 2) {
		close(sv[0]);
		close(sv[1]);
		return -1;
	}
	close(sv[1]);
	return sv[0];
}

/* len bytes arrive in pieces: all of them come back. */
static bool reads_over_short_reads(reader_fn rd)
{
	char buf[9];
	int fd = three_messages_then_eof();

	CU_ASSERT_FATAL(fd >= 0);
	bool ok = rd(fd, buf, sizeof(buf)) == 9 && memcmp(buf, "abcdefghi", 9) == 0;
	close(fd);
	return ok;
}

/* The file ends before len: the count so far, then 0. */
static bool stops_at_eof(reader_fn rd)
{
	char buf[20];
	int fd = three_messages_then_eof();

	CU_ASSERT_FATAL(fd >= 0);
	bool ok = rd(fd, buf, sizeof(buf)) == 9 && memcmp(buf, "abcdefghi", 9) == 0 &&
		  rd(fd, buf, sizeof(buf)) == 0;
	close(fd);
	return ok;
}

static void on_signal(int sig)
{
	(void)sig;
}

struct interrupter {
	pthread_t reader;
	int fd;
};

static void sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* Interrupts the reader blocked in read, then sends what it waits for. */
static void *interrupt_then_write(void *arg)
{
	struct interrupter *in = arg;

	sleep_ms(150);
	pthread_kill(in->reader, SIGUSR1);
	sleep_ms(150);
	if (write(in->fd, "late", 4) != 4)
		abort();
	return NULL;
}

/*
 * rd blocks on an empty socket; a signal whose handler does not restart
 * system calls interrupts it (EINTR), then the data arrives.  Returns
 * what rd returned, with errno.
 */
static ssize_t read_through_signal(reader_fn rd, char buf[4], int *err)
{
	struct sigaction sa = { .sa_handler = on_signal }, old;
	struct interrupter in = { .reader = pthread_self() };
	int sv[2];
	pthread_t t;

	sigemptyset(&sa.sa_mask);
	CU_ASSERT_FATAL(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
	in.fd = sv[1];
	CU_ASSERT_FATAL(sigaction(SIGUSR1, &sa, &old) == 0);
	CU_ASSERT_FATAL(pthread_create(&t, NULL, interrupt_then_write, &in) == 0);
	errno = 0;
	ssize_t n = rd(sv[0], buf, 4);
	*err = errno;
	pthread_join(t, NULL);
	sigaction(SIGUSR1, &old, NULL);
	close(sv[0]);
	close(sv[1]);
	return n;
}

static bool reads_over_eintr(reader_fn rd)
{
	char buf[4];
	int err;

	return read_through_signal(rd, buf, &err) == 4 && memcmp(buf, "late", 4) == 0;
}

/* "0123456789" in a temporary file, its name unlinked; -1 if it could not be made. */
static int ten_digits(void)
{
	char path[] = "/tmp/rdb-fs-util-XXXXXX";
	int fd = mkstemp(path);

	if (fd < 0)
		return -1;
	unlink(path);
	if (write(fd, "0123456789", 10) != 10 || lseek(fd, 0, SEEK_SET) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/*
 * From an offset, past the end: the second pread must start where the
 * first stopped, or it reads the same bytes again instead of the end.
 */
static bool preads_to_eof_from_offset(preader_fn rd)
{
	char buf[100];
	int fd = ten_digits();

	CU_ASSERT_FATAL(fd >= 0);
	bool ok = rd(fd, buf, sizeof(buf), 4) == 6 && memcmp(buf, "456789", 6) == 0;
	close(fd);
	return ok;
}

/* ---- the tests --------------------------------------------------------- */

static void test_read_full_short_reads(void)
{
	CU_ASSERT_TRUE(reads_over_short_reads(read_full));
	CU_ASSERT_FALSE(reads_over_short_reads(read_once)); /* control */
}

static void test_read_full_eof(void)
{
	char buf[1];
	int fd = three_messages_then_eof();

	CU_ASSERT_TRUE(stops_at_eof(read_full));
	CU_ASSERT_FALSE(stops_at_eof(read_once)); /* control */
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(read_full(fd, buf, 0), 0);
	close(fd);
}

static void test_read_full_eintr(void)
{
	char buf[4];
	int err;

	/* The control first: the setup must really interrupt the read. */
	CU_ASSERT_EQUAL(read_through_signal(read_eintr_fails, buf, &err), -1);
	CU_ASSERT_EQUAL(err, EINTR);
	CU_ASSERT_TRUE(reads_over_eintr(read_full));
}

static void test_read_full_error(void)
{
	char buf[4];
	int fds[2];

	CU_ASSERT_FATAL(pipe(fds) == 0);
	errno = 0;
	CU_ASSERT_EQUAL(read_full(fds[1], buf, sizeof(buf)), -1); /* the write end */
	CU_ASSERT_EQUAL(errno, EBADF);
	errno = 0;
	CU_ASSERT_EQUAL(pread_full(fds[0], buf, sizeof(buf), 0), -1);
	CU_ASSERT_EQUAL(errno, ESPIPE);
	close(fds[0]);
	close(fds[1]);
}

static void test_pread_full(void)
{
	char buf[8];
	int fd = ten_digits();

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(pread_full(fd, buf, 4, 3), 4);
	CU_ASSERT_EQUAL(memcmp(buf, "3456", 4), 0);
	CU_ASSERT_EQUAL(pread_full(fd, buf, sizeof(buf), 10), 0); /* at the end */
	CU_ASSERT_EQUAL(pread_full(fd, buf, sizeof(buf), 20), 0); /* past it */
	CU_ASSERT_EQUAL(lseek(fd, 0, SEEK_CUR), 0);                /* the position stays */
	close(fd);
	CU_ASSERT_TRUE(preads_to_eof_from_offset(pread_full));
	CU_ASSERT_FALSE(preads_to_eof_from_offset(pread_offset_stuck)); /* control */
}

int register_fs_util_tests(void)
{
	CU_pSuite suite = CU_add_suite("fs_util", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "read_full goes on over short reads", test_read_full_short_reads) ||
	    !CU_add_test(suite, "read_full stops at end of file with the count",
			 test_read_full_eof) ||
	    !CU_add_test(suite, "read_full goes on over EINTR", test_read_full_eintr) ||
	    !CU_add_test(suite, "read_full and pread_full pass errors on", test_read_full_error) ||
	    !CU_add_test(suite, "pread_full from an offset, to and past the end",
			 test_pread_full))
		return -1;
	return 0;
}

/*
 * rdb-dirty: a synthetic guest dirty-rate workload for the Remus
 * benchmarks (tools/remusdb-bench dirty).
 *
 * Allocates a buffer of --buffer-mb MiB, touches every page (and mlocks it
 * if it may), then for --seconds writes --rate-mb MiB/s worth of 4 KiB
 * pages, paced in 1 ms steps, cycling through the buffer's pages in order.
 *   --mode dense   rewrites each page whole with new pseudo-random bytes;
 *   --mode sparse  changes one 8-byte word per page (dirty, barely changed).
 * Rate 0 only sleeps: an idle control with the same process alive. It
 * keeps the 1 ms steps (the writers' control: the same wakeups, no
 * writes); with --one-sleep it sleeps once until the end instead (the
 * guest as idle as it gets with the process alive).
 * At the end it prints one JSON line: pages written, achieved rate, seconds
 * (guest clock, after the buffer was touched), and how long touching took.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define PAGE 4096u

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_until(double t)
{
	struct timespec ts = { .tv_sec = (time_t)t,
			       .tv_nsec = (long)((t - (double)(time_t)t) * 1e9) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static void usage(const char *argv0)
{
	fprintf(stderr, "usage: %s [--buffer-mb N] [--rate-mb N] [--seconds S] "
		"[--mode dense|sparse] [--one-sleep]\n", argv0);
	exit(2);
}

static double number(const char *arg, const char *argv0)
{
	char *end;
	double v = strtod(arg, &end);

	if (end == arg || *end || v < 0)
		usage(argv0);
	return v;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "buffer-mb", required_argument, NULL, 'b' },
		{ "rate-mb", required_argument, NULL, 'r' },
		{ "seconds", required_argument, NULL, 's' },
		{ "mode", required_argument, NULL, 'm' },
		{ "one-sleep", no_argument, NULL, 'o' },
		{ NULL, 0, NULL, 0 },
	};
	double buffer_mb = 64, rate_mb = 0, seconds = 10;
	int dense = 1, one_sleep = 0, c;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'b': buffer_mb = number(optarg, argv[0]); break;
		case 'r': rate_mb = number(optarg, argv[0]); break;
		case 's': seconds = number(optarg, argv[0]); break;
		case 'o': one_sleep = 1; break;
		case 'm':
			if (!strcmp(optarg, "dense"))
				dense = 1;
			else if (!strcmp(optarg, "sparse"))
				dense = 0;
			else
				usage(argv[0]);
			break;
		default: usage(argv[0]);
		}
	}
	if (optind != argc)
		usage(argv[0]);

	size_t pages = (size_t)(buffer_mb * 1024 * 1024 / PAGE);
	if (pages == 0)
		pages = 1;
	uint8_t *buf = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		perror("rdb-dirty: mmap");
		return 1;
	}
	double touch_start = now_s();
	int locked = mlock(buf, pages * PAGE) == 0;
	uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)(now_s() * 1e6);
	for (size_t i = 0; i < pages; i++)
		memset(buf + i * PAGE, (int)(i & 0xff) | 1, PAGE);

	double touch_s = now_s() - touch_start;

	/* Pages owed per 1 ms step; the fraction carries over. */
	double per_step = rate_mb * 1024 * 1024 / PAGE / 1000.0, owed = 0;
	uint64_t written = 0;
	size_t next = 0;
	double start = now_s(), end = start + seconds, tick = start;

	if (per_step == 0 && one_sleep) {
		sleep_until(end);
		tick = end;
	}
	while (tick < end) {
		owed += per_step;
		while (owed >= 1.0) {
			uint8_t *pg = buf + next * PAGE;
			if (dense) {
				uint64_t *w = (uint64_t *)(void *)pg;
				for (size_t k = 0; k < PAGE / sizeof(*w); k++)
					w[k] = xorshift(&seed);
			} else {
				uint64_t *w = (uint64_t *)(void *)(pg + (written % (PAGE / 8)) * 8);
				*w ^= xorshift(&seed) | 1;
			}
			written++;
			owed -= 1.0;
			next = (next + 1) % pages;
		}
		tick += 0.001;
		if (tick > end)
			tick = end;
		sleep_until(tick);
	}
	double elapsed = now_s() - start;
	printf("{\"mode\": \"%s\", \"one_sleep\": %s, \"buffer_mb\": %.0f, \"mlocked\": %s, "
	       "\"rate_mb_requested\": %.3f, \"pages_written\": %llu, "
	       "\"rate_mb_achieved\": %.3f, \"seconds\": %.3f, \"touch_seconds\": %.3f}\n",
	       dense ? "dense" : "sparse", per_step == 0 && one_sleep ? "true" : "false", buffer_mb, locked ? "true" : "false", rate_mb,
	       (unsigned long long)written,
	       elapsed > 0 ? (double)written * PAGE / (1024.0 * 1024.0) / elapsed : 0.0,
	       elapsed, touch_s);
	return 0;
}

/* The host's total memory and this process's resident set (host_memory.h). */
#include "base/host_memory.h"

#include <stdio.h>
#include <unistd.h>

uint64_t host_memory_total(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[256];
	unsigned long long kib = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemTotal: %llu kB", &kib) == 1)
			break;
	fclose(f);
	return (uint64_t)kib << 10;
}

uint64_t host_memory_self_rss(void)
{
	FILE *f = fopen("/proc/self/statm", "re");
	unsigned long long size, resident;
	long page = sysconf(_SC_PAGESIZE);
	int n;

	if (!f)
		return 0;
	n = fscanf(f, "%llu %llu", &size, &resident);
	fclose(f);
	if (n != 2 || page <= 0)
		return 0;
	return (uint64_t)resident * (uint64_t)page;
}

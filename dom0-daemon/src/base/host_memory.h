/*
 * The host's memory as the kernel reports it: the total (/proc/meminfo),
 * for the backup's default --memory-limit, and this process's resident
 * set (/proc/self/statm), for status and /metrics.
 */
#ifndef REMUSDB_HOST_MEMORY_H
#define REMUSDB_HOST_MEMORY_H

#include <stdint.h>

/* MemTotal in bytes; 0 when /proc/meminfo cannot be read or parsed. */
uint64_t host_memory_total(void);
/* This process's resident set in bytes; 0 when /proc/self/statm cannot be read. */
uint64_t host_memory_self_rss(void);

#endif

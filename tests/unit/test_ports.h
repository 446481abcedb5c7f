/* Loopback ports for tests that run real servers. */
#ifndef REMUSDB_TEST_PORTS_H
#define REMUSDB_TEST_PORTS_H

#include <stdint.h>

/* A TCP port on 127.0.0.1 nobody listens on right now (bound, read, closed); 0 on failure. */
uint16_t test_free_port(void);

#endif

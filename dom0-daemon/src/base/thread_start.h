/*
 * Starting a worker thread that accepts no signal.  Why: the daemon takes
 * SIGTERM, SIGINT and SIGHUP through a signalfd, which only works while no
 * thread accepts them, and a thread starts with its creator's mask; so
 * every signal is blocked around the creation and restored after it.
 */
#ifndef REMUSDB_THREAD_START_H
#define REMUSDB_THREAD_START_H

#include <pthread.h>

/* 0, or pthread_create's error number. */
int thread_start_without_signals(pthread_t *thread, void *(*run)(void *), void *arg);

#endif

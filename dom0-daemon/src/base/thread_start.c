/* Starting a worker thread that accepts no signal (thread_start.h). */
#include "base/thread_start.h"

#include <signal.h>

int thread_start_without_signals(pthread_t *thread, void *(*run)(void *), void *arg)
{
	sigset_t all, old;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int rc = pthread_create(thread, NULL, run, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}

/* Placeholder: the epoch_queue tests are being written. */
#include "suites.h"

int register_epoch_queue_tests(void)
{
	return 0;
}

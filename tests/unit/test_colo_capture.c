/* Placeholder: the colo_capture tests are being written. */
#include "suites.h"

int register_colo_capture_tests(void)
{
	return 0;
}

/* Placeholder: the ram_image tests are being written. */
#include "suites.h"

int register_ram_image_tests(void)
{
	return 0;
}

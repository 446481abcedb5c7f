/* Placeholder: the repl_proto tests are being written. */
#include "suites.h"

int register_repl_proto_tests(void)
{
	return 0;
}

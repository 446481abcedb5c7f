/* CUnit runner for all of remusdbd's unit tests. */
#include <CUnit/Basic.h>
#include <stdio.h>

#include "suites.h"

int main(void)
{
	int (*const registrations[])(void) = {
		register_buffer_tests,   register_event_loop_tests,
		register_config_tests,   register_nbd_proto_tests,
		register_nbd_server_tests, register_net_frame_tests,
		register_qmp_tests,        register_vm_tests,
		register_control_tests,    register_colo_stream_tests,
		register_colo_fixture_tests,
		register_repl_proto_tests,   register_ram_image_tests,
		register_epoch_queue_tests,  register_witness_tests,
		register_colo_capture_tests,
		register_replication_server_tests, register_fence_tests,
		register_accept_policy_tests,
	};

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	for (size_t i = 0; i < sizeof(registrations) / sizeof(registrations[0]); i++) {
		if (registrations[i]() != 0) {
			fprintf(stderr, "suite registration %zu failed\n", i);
			CU_cleanup_registry();
			return 2;
		}
	}
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	unsigned failed = CU_get_number_of_failures();
	unsigned run = CU_get_number_of_tests_run();
	CU_cleanup_registry();
	return (failed == 0 && run > 0) ? 0 : 1;
}

/* CUnit runner for all of remusdbd's unit tests. */
#include <CUnit/Basic.h>
#include <stdbool.h>
#include <stdio.h>

#include "suites.h"

int main(void)
{
	int (*const registrations[])(void) = {
		register_buffer_tests,   register_fs_util_tests,   register_state_file_tests,
		register_event_loop_tests, register_unmap_later_tests,
		register_file_flush_tests,
		register_loop_worker_tests,
		register_disk_copy_tests,
		register_sched_group_tests, register_pause_boost_tests,
		register_checkpoint_resume_tests,
		register_config_tests,   register_nbd_proto_tests,
		register_nbd_server_tests, register_net_frame_tests,
		register_qmp_tests,        register_vm_tests,
		register_control_tests,    register_colo_stream_tests,
		register_colo_fixture_tests,
		register_repl_proto_tests,   register_ram_image_tests,
		register_ram_image_file_tests,
		register_replica_memory_tests,
		register_output_queue_tests,  register_witness_tests,
		register_colo_capture_tests,
		register_replication_server_tests, register_fence_tests,
		register_heartbeat_tests,
		register_vm_config_tests, register_output_commit_tests,
		register_repl_handshake_tests,
		register_accept_policy_tests,
		register_read_index_tests,
		register_page_delta_tests, register_page_cache_tests,
		register_checkpoint_pipeline_tests, register_asc_encoder_tests,
		register_dirty_census_tests, register_hmp_network_tests,
		register_device_delta_tests,
		register_replica_checksums_tests, register_repl_conn_tests,
		register_cp_flow_hold_tests, register_cp_flow_reset_tests,
		register_disk_snapshot_tests, register_disk_snapshot_extent_tests,
		register_replica_fork_tests,
		register_postcopy_wire_tests, register_postcopy_source_tests,
		register_snapshot_capture_tests, register_metrics_tests,
		register_disk_changes_tests, register_repl_fields_tests,
		register_claim_refusal_tests,
		register_repl_version_tests,
		register_reprotect_policy_tests, register_protect_settings_tests,
		register_switchover_tests,
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
	/*
	 * Failed assertions are not the only failures: a suite whose
	 * initialisation or cleanup fails records a failure but no failed
	 * assertion, and its tests never run.  Any failure record, failed
	 * or inactive suite or test fails the run.
	 */
	const CU_RunSummary *sum = CU_get_run_summary();
	unsigned records = CU_get_number_of_failure_records();
	bool ok = CU_get_number_of_failures() == 0 && records == 0 &&
		  sum->nSuitesFailed == 0 && sum->nSuitesInactive == 0 &&
		  sum->nTestsFailed == 0 && sum->nTestsInactive == 0 &&
		  sum->nTestsRun > 0 && sum->nTestsRun == CU_get_registry()->uiNumberOfTests;
	if (!ok)
		fprintf(stderr, "unit tests FAILED: %u failure record(s), %u suite(s) failed, "
			"%u suite(s) inactive, %u test(s) failed, %u of %u test(s) run\n",
			records, sum->nSuitesFailed, sum->nSuitesInactive, sum->nTestsFailed,
			sum->nTestsRun, CU_get_registry()->uiNumberOfTests);
	CU_cleanup_registry();
	return ok ? 0 : 1;
}

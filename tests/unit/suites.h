/*
 * Every unit-test file registers its CUnit suite through one function
 * listed here; tests/unit/main.c calls them all.
 */
#ifndef REMUSDB_TEST_SUITES_H
#define REMUSDB_TEST_SUITES_H

int register_buffer_tests(void);
int register_fs_util_tests(void);
int register_state_file_tests(void);
int register_event_loop_tests(void);
int register_config_tests(void);
int register_nbd_proto_tests(void);
int register_nbd_server_tests(void);
int register_net_frame_tests(void);
int register_qmp_tests(void);
int register_unmap_later_tests(void);
int register_file_flush_tests(void);
int register_loop_worker_tests(void);
int register_disk_copy_tests(void);
int register_sched_group_tests(void);
int register_pause_boost_tests(void);
int register_checkpoint_resume_tests(void);
int register_vm_tests(void);
int register_control_tests(void);
int register_colo_stream_tests(void);
int register_colo_fixture_tests(void);
int register_repl_proto_tests(void);
int register_ram_image_tests(void);
int register_ram_image_file_tests(void);
int register_replica_memory_tests(void);
int register_output_queue_tests(void);
int register_witness_tests(void);
int register_colo_capture_tests(void);
int register_replication_server_tests(void);
int register_fence_tests(void);
int register_heartbeat_tests(void);
int register_vm_config_tests(void);
int register_output_commit_tests(void);
int register_repl_handshake_tests(void);
int register_accept_policy_tests(void);
int register_read_index_tests(void);
int register_page_delta_tests(void);
int register_page_cache_tests(void);
int register_checkpoint_pipeline_tests(void);
int register_asc_encoder_tests(void);
int register_dirty_census_tests(void);
int register_hmp_network_tests(void);
int register_device_delta_tests(void);
int register_replica_checksums_tests(void);
int register_repl_conn_tests(void);
int register_cp_flow_hold_tests(void);
int register_cp_flow_reset_tests(void);
int register_disk_snapshot_tests(void);
int register_disk_snapshot_extent_tests(void);
int register_replica_fork_tests(void);
int register_postcopy_wire_tests(void);
int register_postcopy_source_tests(void);
int register_snapshot_capture_tests(void);
int register_metrics_tests(void);
int register_disk_changes_tests(void);
int register_repl_fields_tests(void);
int register_claim_refusal_tests(void);
int register_repl_version_tests(void);
int register_reprotect_policy_tests(void);
int register_protect_settings_tests(void);
int register_switchover_tests(void);

#endif

//! The Endpoint behaviour suite over `softib://`: both endpoints in this process, then each
//! test again with its servers, and once more with its clients, in an agent process (the two
//! ends talk through the software provider across processes: `process_vm_*`, shared rings).
mod conformance;

agent_entry!();

macro_rules! softib_suite {
    ($net:expr) => {
        crate::suite!($net;
            matching_order_and_tag_isolation,
            sizes_around_every_limit,
            receive_buffer_too_small_is_truncated_error,
            list_send_into_list_receive,
            cancel_before_and_after_match,
            deadline_expiry,
            unexpected_buffering_is_bounded_with_backpressure,
            early_eager_data_is_bounded_by_budget,
            request_payload_both_directions,
            dropped_request_fails_the_client_not_hangs,
            put_get_validated_by_target,
            many_threads_post_on_one_endpoint,
            wait_modes_all_work,
            every_op_completes_exactly_once,
            cluster_key_required_and_checked,
            peer_loss_fails_ops_once_and_reconnects,
            soak_32_clients_checksummed,
            info_reports_limits_and_counters,
            batched_sends_keep_order_and_complete,
            pushed_reads_then_replies_never_lose_a_frame,
            one_way_streams_keep_flowing,
        );
    };
}

mod inproc {
    use super::conformance::{self, Net, Place};
    softib_suite!(Net::new("softib", Place::Local));
}

mod xproc_servers {
    use super::conformance::{self, Net, Place};
    softib_suite!(Net::new("softib", Place::RemoteServers));
}

mod xproc_clients {
    use super::conformance::{self, Net, Place};
    softib_suite!(Net::new("softib", Place::RemoteClients));
}

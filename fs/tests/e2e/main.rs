//! End-to-end behaviour of a stripefs cluster (1 meta + io servers as child processes) through
//! the client library, one module per theme. Most tests are written against a transport
//! scheme, and `transports!` below runs each on every scheme; the rest need only one.

#[path = "../common/mod.rs"]
mod common;
mod data;
mod faults;
mod io_paths;
mod namespace;
mod requests;

use bytes::{Bytes, BytesMut};
use common::{TestCluster, no_objects_ahead, pattern, requests_during};
use std::time::Duration;
use stripefs::capability::Rights;
use stripefs::layout::Extent;
use stripefs::proto::{self, FileKind, Handle, LayoutSpec, ServerStats, SetAttr, Timestamp};
use stripefs::{CreateOptions, Errno, FsError};

fn code<T: std::fmt::Debug>(r: Result<T, FsError>) -> Errno {
    match r {
        Err(e) => e.errno(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

fn read_all(f: &stripefs::File, off: u64, len: usize) -> (Vec<u8>, usize) {
    let (b, n) = f.read_at(off, BytesMut::zeroed(len)).expect("read");
    (b.to_vec(), n)
}

fn spec(pcount: u32, ssize: u64) -> Option<LayoutSpec> {
    Some(LayoutSpec { base: None, pcount: Some(pcount), ssize: Some(ssize) })
}

/// The counters of the cluster's only io server.
fn io_stats(c: &stripefs::Client) -> ServerStats {
    let mut all = c.server_stats();
    assert_eq!(all.len(), 1, "a one-server cluster");
    all.remove(0).expect("io server stats")
}

/// Objects under an io server's data directory `dir` (every file but the server's lock).
fn walk(dir: &std::path::Path) -> usize {
    files(dir) - usize::from(dir.join("lock").exists())
}

fn files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| if e.path().is_dir() { files(&e.path()) } else { 1 }).sum())
        .unwrap_or(0)
}

macro_rules! transports {
    ($($scheme:ident),*) => {$(
        mod $scheme {
            const S: &str = stringify!($scheme);
            #[test] fn namespace_and_data() { super::namespace::namespace_and_data(S) }
            #[test] fn sparse_files_and_holes() { super::data::sparse_files_and_holes(S) }
            #[test] fn symbolic_links() { super::namespace::symbolic_links(S) }
            #[test] fn a_writers_sync_records_the_modification_time() { super::data::a_writers_sync_records_the_modification_time(S) }
            #[test] fn read_into_shows_no_earlier_bytes() { super::data::read_into_shows_no_earlier_bytes(S) }
            #[test] fn a_read_from_every_server_needs_no_size_round() { super::requests::a_read_from_every_server_needs_no_size_round(S) }
            #[test] fn a_stat_of_an_opened_file_asks_attributes_and_sizes_at_once() { super::requests::a_stat_of_an_opened_file_asks_attributes_and_sizes_at_once(S) }
            #[test] fn a_listings_stats_take_one_request_per_server_a_batch() { super::requests::a_listings_stats_take_one_request_per_server_a_batch(S) }
            #[test] fn list_io_matches_contiguous() { super::data::list_io_matches_contiguous(S) }
            #[test] fn eight_clients_interleaved_strided() { super::data::eight_clients_interleaved_strided(S) }
            #[test] fn io_server_killed_mid_write_is_an_error() { super::faults::io_server_killed_mid_write_is_an_error(S) }
            #[test] fn restart_serves_synced_files_and_namespace() { super::faults::restart_serves_synced_files_and_namespace(S) }
            #[test] fn forged_and_expired_capabilities_are_refused() { super::namespace::forged_and_expired_capabilities_are_refused(S) }
            #[test] fn bad_names_are_refused() { super::namespace::bad_names_are_refused(S) }
            #[test] fn disk_error_does_not_desynchronise_the_connection() { super::faults::disk_error_does_not_desynchronise_the_connection(S) }
            #[test] fn expired_capability_is_renewed() { super::namespace::expired_capability_is_renewed(S) }
            #[test] fn failed_fan_outs_are_cleaned_up() { super::faults::failed_fan_outs_are_cleaned_up(S) }
            #[test] fn copying_and_mapped_io_servers_agree() { super::io_paths::copying_and_mapped_io_servers_agree(S) }
            #[test] fn overlapping_writers_each_win_whole_units() { super::data::overlapping_writers_each_win_whole_units(S) }
            #[test] fn a_writer_is_not_starved_by_readers_of_the_same_bytes() { super::data::a_writer_is_not_starved_by_readers_of_the_same_bytes(S) }
            #[test] fn io_requests_count_the_data_path_they_took() { super::io_paths::io_requests_count_the_data_path_they_took(S) }
            #[test] fn mapping_io_servers_count_their_fallbacks() { super::io_paths::mapping_io_servers_count_their_fallbacks(S) }
            #[test] fn large_reads_go_as_several_requests_over_tcp_and_writes_as_one() { super::requests::large_reads_go_as_several_requests_over_tcp_and_writes_as_one(S) }
            #[test] fn a_clients_adaptive_waits_poll_for_its_transports_budget() { super::requests::a_clients_adaptive_waits_poll_for_its_transports_budget(S) }
        }
    )*};
}

// Every test runs on each transport.
transports!(tcp, softib);

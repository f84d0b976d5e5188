//! Shared by the integration tests: a local cluster of `stripefs serve` child processes in a
//! temporary directory, killed and removed when dropped.
#![allow(dead_code)]

use bytes::Bytes;
use ionet::Scheme;
use std::time::Duration;
use stripefs::cluster::{LocalCluster, LocalClusterOptions};
use stripefs::{Client, ClientOptions};

pub struct TestCluster {
    // Field order: the cluster (processes) goes before its directory.
    pub cluster: LocalCluster,
    pub dir: tempfile::TempDir,
}

pub fn scheme(s: &str) -> Scheme {
    match s {
        "tcp" => Scheme::Tcp,
        "softib" => Scheme::SoftIb,
        "ib" => Scheme::Ib,
        _ => panic!("unknown scheme {s}"),
    }
}

pub fn options(scheme_name: &str, n: u32, dir: &std::path::Path) -> LocalClusterOptions {
    let mut o = LocalClusterOptions::new(env!("CARGO_BIN_EXE_stripefs"), scheme(scheme_name), n, dir);
    // Small transfer units so even test-sized transfers are pipelined over several units.
    o.transfer_unit = Some(64 * 1024);
    o
}

impl TestCluster {
    pub fn start(scheme_name: &str, n: u32) -> TestCluster {
        Self::start_with(scheme_name, n, |_| {})
    }

    pub fn start_with(scheme_name: &str, n: u32, f: impl FnOnce(&mut LocalClusterOptions)) -> TestCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut o = options(scheme_name, n, dir.path());
        f(&mut o);
        let cluster = LocalCluster::start(o).expect("cluster starts");
        TestCluster { cluster, dir }
    }

    pub fn client(&self) -> Client {
        let opts = ClientOptions { timeout: Duration::from_secs(10), ..Default::default() };
        Client::connect_with(self.cluster.config(), opts).expect("client connects")
    }

    pub fn key(&self) -> Vec<u8> {
        self.cluster.config().cluster_key().expect("key")
    }
}

/// Deterministic test data.
pub fn pattern(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

//! The endpoint settings a measurement runs with, shared by client and server so both sides of
//! a run agree (a forced mechanism, larger receive buffers for inline sends, thresholds).

use ionet::{Config, IbConfig, Mechanism, Policy, Scheme, ServiceLevel, Thresholds, WaitMode};

/// What a perf endpoint is configured with beyond the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// How waits wait.
    pub wait: WaitMode,
    /// Force one mechanism for every transfer.
    pub mechanism: Option<Mechanism>,
    /// Inline / fast-RDMA thresholds for every service level (default: the transport's).
    pub thresholds: Option<Thresholds>,
    /// Size of each pre-posted InfiniBand receive buffer (inline sends must fit one).
    pub recv_size: Option<u32>,
    /// Largest message this end sends eagerly and accepts unasked (`Config::eager_limit`).
    pub eager_limit: Option<usize>,
}

impl Tuning {
    /// Defaults with this wait mode.
    pub fn wait(wait: WaitMode) -> Tuning {
        Tuning { wait, mechanism: None, thresholds: None, recv_size: None, eager_limit: None }
    }

    /// The policy these settings give on `scheme`.
    pub fn policy(&self, scheme: Scheme) -> Option<Policy> {
        if self.mechanism.is_none() && self.thresholds.is_none() {
            return None;
        }
        let mut p = Policy::for_scheme(scheme);
        if let Some(t) = self.thresholds {
            for sl in ServiceLevel::ALL {
                p.set(sl, t);
            }
        }
        p.force(self.mechanism);
        Some(p)
    }

    /// The endpoint configuration.
    pub fn config(&self, scheme: Scheme) -> Config {
        let mut c = Config::default().wait_mode(self.wait);
        if let Some(p) = self.policy(scheme) {
            c = c.policy(p);
        }
        if let Some(n) = self.recv_size {
            c = c.ib(IbConfig::default().recv_size(n));
        }
        if let Some(n) = self.eager_limit {
            c = c.eager_limit(n);
        }
        c
    }

    /// Command-line arguments that give a server the same settings.
    pub fn server_args(&self) -> Vec<String> {
        let mut v = vec!["--wait".to_string(), self.wait.name().to_string()];
        if let Some(m) = self.mechanism {
            v.extend(["--mechanism".into(), m.name().into()]);
        }
        if let Some(t) = self.thresholds {
            v.extend(["--inline-max".into(), t.inline_max.to_string()]);
            v.extend(["--fast-max".into(), t.fast_max.to_string()]);
        }
        if let Some(n) = self.recv_size {
            v.extend(["--recv-size".into(), n.to_string()]);
        }
        if let Some(n) = self.eager_limit {
            v.extend(["--eager-limit".into(), n.to_string()]);
        }
        v
    }

    /// Settings from server arguments (the inverse of [`Tuning::server_args`]).
    pub fn from_parts(
        wait: WaitMode,
        mechanism: Option<Mechanism>,
        inline_max: Option<usize>,
        fast_max: Option<usize>,
        recv_size: Option<u32>,
        eager_limit: Option<usize>,
    ) -> Tuning {
        let thresholds = match (inline_max, fast_max) {
            (None, None) => None,
            (i, f) => {
                let inline_max = i.unwrap_or(0);
                Some(Thresholds { inline_max, fast_max: f.unwrap_or(inline_max).max(inline_max) })
            }
        };
        Tuning { wait, mechanism, thresholds, recv_size, eager_limit }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_args_round_trip() {
        let t = Tuning {
            wait: WaitMode::Spin,
            mechanism: Some(Mechanism::FastRdma),
            thresholds: Some(Thresholds { inline_max: 1024, fast_max: 65536 }),
            recv_size: Some(70_000),
            eager_limit: Some(1 << 20),
        };
        let a = t.server_args();
        let get = |k: &str| a.iter().position(|x| x == k).map(|i| a[i + 1].clone());
        let back = Tuning::from_parts(
            get("--wait").unwrap().parse().unwrap(),
            get("--mechanism").map(|m| m.parse().unwrap()),
            get("--inline-max").map(|m| m.parse().unwrap()),
            get("--fast-max").map(|m| m.parse().unwrap()),
            get("--recv-size").map(|m| m.parse().unwrap()),
            get("--eager-limit").map(|m| m.parse().unwrap()),
        );
        assert_eq!(back, t);
        assert_eq!(Tuning::wait(WaitMode::Block).server_args(), vec!["--wait", "block"]);
    }

    #[test]
    fn config_carries_the_eager_limit() {
        let t = Tuning { eager_limit: Some(1 << 20), ..Tuning::wait(WaitMode::Block) };
        let ep = ionet::Endpoint::bind("tcp://127.0.0.1:0", t.config(Scheme::Tcp)).unwrap();
        assert_eq!(ep.info().eager_limit, 1 << 20);
    }

    #[test]
    fn policy_applies_thresholds_and_forcing() {
        let t = Tuning::from_parts(WaitMode::Block, Some(Mechanism::Inline), Some(100), Some(50), None, None);
        let p = t.policy(Scheme::SoftIb).unwrap();
        assert_eq!(p.thresholds(ServiceLevel::Bulk), Thresholds { inline_max: 100, fast_max: 100 });
        assert_eq!(p.forced(), Some(Mechanism::Inline));
        assert!(Tuning::wait(WaitMode::Block).policy(Scheme::Tcp).is_none());
    }
}

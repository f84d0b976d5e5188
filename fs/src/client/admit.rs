//! Whether a request may go to a server now: the client's side of `crate::health` (a server
//! that stopped answering is held off, then checked with a short ping).

use super::*;
use crate::health::{Admit, Ended, Sent};

/// A server of the cluster, as the client addresses it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Target {
    Meta,
    Io(usize),
}

/// Longest wait for the ping that checks whether a silent server answers again.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

impl Client {
    fn health(&self, t: Target) -> Option<&Health> {
        match t {
            Target::Meta => Some(&self.inner.meta_health),
            Target::Io(i) => self.inner.io_health.get(i),
        }
    }

    fn target_name(&self, t: Target) -> String {
        match t {
            Target::Meta => self.inner.meta_name.clone(),
            Target::Io(i) => self.inner.io_names.get(i).cloned().unwrap_or_else(|| format!("io server {i}")),
        }
    }

    /// Whether a request may go to `t` now: fails at once while `t` is silent, and pings it
    /// first when its hold-off is over (see `health`). Returns when the request is sent.
    pub(super) fn admit(&self, t: Target) -> FsResult<Instant> {
        let Some(health) = self.health(t) else { return Ok(Instant::now()) };
        let silent = |silent| FsError::Silent { server: self.target_name(t), silent };
        match health.admit(Instant::now()) {
            Admit::Send => {}
            Admit::Refuse { silent: d } => return Err(silent(d)),
            Admit::Probe => {
                let sent = Instant::now();
                let r = self.ping(t);
                let ended = health.finish(Sent { at: sent, probe: true }, r.as_ref().err());
                match (ended, r) {
                    (Ended::Answered, _) => {}
                    (_, Err(e)) if ended == Ended::Failed => return Err(e.at(|| self.target_name(t))),
                    _ => {
                        return Err(match health.admit(Instant::now()) {
                            Admit::Refuse { silent: d } => silent(d),
                            _ => silent(sent.elapsed()),
                        });
                    }
                }
            }
        }
        Ok(Instant::now())
    }

    /// A cheap request to `t` with a short deadline, for [`Client::admit`]'s probe.
    fn ping(&self, t: Target) -> FsResult<()> {
        let id = self.id();
        let deadline = Instant::now() + self.inner.opts.timeout.min(PROBE_TIMEOUT);
        let ep = &self.inner.ep;
        let (peer, tag, header) = match t {
            Target::Meta => {
                let call = proto::MetaCall { cred: (*self.cred).clone(), req: MetaRequest::Status };
                (self.inner.meta, TAG_META, proto::encode(&Envelope::new(id, call))?)
            }
            Target::Io(i) => {
                let peer = *self.inner.io.get(i).ok_or_else(|| FsError::Invalid("server index".into()))?;
                (peer, TAG_IO, proto::encode(&Envelope::new(id, IoRequest::Ping))?)
            }
        };
        let op = ep.request(peer, tag, Bytes::from(header), Payload::None, ServiceLevel::Control)?;
        ep.set_deadline(op, deadline)?;
        let c = ep.wait(op)?;
        if let Err(e) = &c.result {
            return Err(FsError::Net(e.duplicate()));
        }
        Ok(())
    }

    /// Records how a request to `t` sent at `sent` ended (`err`: how it failed, if it did).
    pub(super) fn finish(&self, t: Target, sent: Instant, err: Option<&FsError>) {
        if let Some(h) = self.health(t) {
            h.finish(Sent { at: sent, probe: false }, err);
        }
    }
}

//! The server's side of a request: its payload moved with pulls and pushes, and the one reply
//! that ends it.

use bytes::Bytes;

use super::Endpoint;
use crate::backend::{Cmd, PullCmd, PushCmd, ReplyCmd};
use crate::buffers::buf::{RecvBuf, SendBuf};
use crate::error::{Error, Result};
use crate::op::{Direction, RequestMeta, status};
use crate::types::{OpId, PeerId, ServiceLevel, Tag};

/// An incoming request, server side. Move its payload with [`Request::pull_into`] /
/// [`Request::push_from`], then [`Request::reply`]. Dropping it unanswered sends an error reply
/// so the client never hangs.
#[derive(Debug)]
pub struct Request {
    ep: Endpoint,
    meta: RequestMeta,
    answered: bool,
}

impl Request {
    pub(super) fn new(ep: Endpoint, meta: RequestMeta) -> Request {
        Request { ep, meta, answered: false }
    }

    /// The client.
    pub fn peer(&self) -> PeerId {
        self.meta.peer
    }
    /// The request's tag.
    pub fn tag(&self) -> Tag {
        self.meta.tag
    }
    /// Service level it arrived on (replies and payload use it too).
    pub fn sl(&self) -> ServiceLevel {
        self.meta.sl
    }
    /// The request header.
    pub fn header(&self) -> &Bytes {
        &self.meta.header
    }
    /// Payload direction.
    pub fn direction(&self) -> Direction {
        self.meta.dir
    }
    /// Payload length (bytes the client offers, or room it has).
    pub fn payload_len(&self) -> u64 {
        self.meta.len
    }
    /// The endpoint the request arrived on.
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// Whether the client has cancelled this request ([`Endpoint::cancel`], a deadline, or
    /// dropping its future): its notice travels behind the request, so a server working on a
    /// long request can check this between steps and stop early.
    ///
    /// It says what this endpoint's progress has received so far: with no progress thread,
    /// the notice arrives in the server's next `wait`, `test`, `next_request` or
    /// [`Endpoint::try_progress`]. A notice sent before the request itself arrived may come
    /// only behind the part of a streamed payload already on its way; a pull meets the cut
    /// and fails with [`Error::PeerCancelled`] at the latest. Once it has, pulls and pushes posted for the request fail at
    /// once with [`Error::PeerCancelled`] without moving bytes (ones already under way end
    /// either way, their bytes discarded by the client), and so does the reply, which the
    /// server still sends (or drops the `Request`) to release what the request holds. False is no promise: the client may
    /// cancel at any moment, and its completion then ignores whatever the server still does.
    pub fn is_cancelled(&self) -> bool {
        self.ep.backend().is_ok_and(|b| b.request_cancelled(self.meta.peer, self.meta.id))
    }

    /// Pulls `buf.capacity()` bytes of the client's OUT payload starting at `offset` into
    /// `buf`. Several pulls may be outstanding (pipelining).
    ///
    /// Over TCP a payload may be streamed behind its request ([`Config::stream_requests`](crate::Config::stream_requests)): its
    /// bytes then arrive in order and go into the pulls that cover them, so pulls may come in
    /// any order and size but may not overlap, nor go back over bytes an earlier pull (or the
    /// answer) has already consumed; and until a pull covers the next byte, later messages
    /// from this client on this service level wait behind the payload.
    pub fn pull_into(&self, buf: impl Into<RecvBuf>, offset: u64) -> Result<OpId> {
        let buf = buf.into();
        if self.meta.dir != Direction::Out {
            return Err(Error::misuse("pull_into on a request without an OUT payload"));
        }
        check_range(offset, buf.capacity() as u64, self.meta.len)?;
        self.ep.post(Cmd::Pull(PullCmd {
            peer: self.meta.peer,
            req: self.meta.id,
            sl: self.meta.sl,
            offset,
            buf,
        }))
    }

    /// Pushes `buf` into the client's IN buffer at `offset`.
    ///
    /// The server decides how much of the room ([`Request::payload_len`]) it fills; the
    /// client's completion counts up to the end of the furthest byte pushed
    /// ([`Completion::len`](crate::Completion::len)), so an answer whose size only the server
    /// knows needs no length in the reply. A push past the room fails here with
    /// [`Error::Misuse`] and moves nothing; the request stays open.
    pub fn push_from(&self, buf: impl Into<SendBuf>, offset: u64) -> Result<OpId> {
        let buf = buf.into();
        if self.meta.dir != Direction::In {
            return Err(Error::misuse("push_from on a request without an IN payload"));
        }
        check_range(offset, buf.len() as u64, self.meta.len)?;
        self.ep.post(Cmd::Push(PushCmd {
            peer: self.meta.peer,
            req: self.meta.id,
            sl: self.meta.sl,
            offset,
            buf,
        }))
    }

    /// Ends the request with a reply header; the client's request op completes with it.
    pub fn reply(self, header: impl Into<Bytes>) -> Result<OpId> {
        self.answer(header.into(), status::OK)
    }

    /// Ends the request with a failure the application numbers: the client's op fails with
    /// [`Error::RemoteStatus`] carrying `status` and `reason` (an errno, an HTTP-like code),
    /// so a client can act on the kind of failure without parsing text.
    pub fn reply_status(self, status: u16, reason: &str) -> Result<OpId> {
        self.answer(Bytes::copy_from_slice(reason.as_bytes()), status::APP + u32::from(status))
    }

    /// Ends the request with a transport-level failure; the client's op fails with
    /// [`Error::Remote`] carrying `reason`.
    pub fn reply_error(self, reason: &str) -> Result<OpId> {
        self.answer(Bytes::copy_from_slice(reason.as_bytes()), status::ERROR)
    }

    fn answer(mut self, header: Bytes, status: u32) -> Result<OpId> {
        self.answered = true;
        self.ep.post(Cmd::Reply(self.reply_cmd(header, status)))
    }

    fn reply_cmd(&self, header: Bytes, status: u32) -> ReplyCmd {
        ReplyCmd { peer: self.meta.peer, req: self.meta.id, sl: self.meta.sl, header, status }
    }
}

fn check_range(offset: u64, len: u64, total: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(Error::misuse(format!("range {offset}+{len} outside the {total}-byte payload"))),
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if !self.answered {
            let _ = self.ep.post_detached(Cmd::Reply(self.reply_cmd(Bytes::new(), status::DROPPED)), true);
        }
    }
}

//! What an operation is and how it ends: the public operation kinds, completions and request
//! payloads, and the request metadata and reply status codes the backends report to the
//! endpoint through the shared completion queue.

use bytes::Bytes;

use crate::buffers::buf::{OpBuf, RecvBuf, SendBuf};
use crate::comm::Mechanism;
use crate::error::Result;
use crate::types::{OpId, PeerId, ServiceLevel, Tag};

/// What kind of operation completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpKind {
    /// [`Endpoint::send`](crate::Endpoint::send).
    Send,
    /// [`Endpoint::send_unexpected`](crate::Endpoint::send_unexpected).
    SendUnexpected,
    /// [`Endpoint::recv`](crate::Endpoint::recv).
    Recv,
    /// [`Endpoint::put`](crate::Endpoint::put).
    Put,
    /// [`Endpoint::get`](crate::Endpoint::get).
    Get,
    /// [`Endpoint::request`](crate::Endpoint::request) (client side).
    Request,
    /// [`Request::pull_into`](crate::Request::pull_into) (server side).
    Pull,
    /// [`Request::push_from`](crate::Request::push_from) (server side).
    Push,
    /// [`Request::reply`](crate::Request::reply) (server side).
    Reply,
}

/// The outcome of an operation, with its buffer handed back.
#[derive(Debug)]
#[non_exhaustive]
pub struct Completion {
    /// The operation.
    pub op: OpId,
    /// What it was.
    pub kind: OpKind,
    /// The peer it addressed.
    pub peer: PeerId,
    /// Its tag (0 for one-sided operations).
    pub tag: Tag,
    /// The bytes moved (see [`Completion::len`]), or why it failed.
    pub result: Result<usize>,
    /// The buffer the operation carried (always returned, also on error).
    pub buf: OpBuf,
    /// For requests: the reply header sent by the server.
    pub reply: Option<Bytes>,
    /// The mechanism that moved the data, when there was data.
    pub mechanism: Option<Mechanism>,
}

impl Completion {
    pub(crate) fn new(op: OpId, kind: OpKind, peer: PeerId, tag: Tag) -> Self {
        Completion { op, kind, peer, tag, result: Ok(0), buf: OpBuf::None, reply: None, mechanism: None }
    }

    /// True when the operation succeeded.
    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }

    /// The byte count, or the error (the buffer is dropped on error; match on `result` to
    /// keep it).
    pub fn ok(self) -> Result<Completion> {
        match self.result {
            Ok(_) => Ok(self),
            Err(e) => Err(e),
        }
    }

    /// The bytes the operation moved (0 on error), the same on every transport, mechanism and
    /// buffer kind:
    ///
    /// - send, put, push: the bytes sent, written or pushed;
    /// - receive: the message's length (the buffer may be larger);
    /// - get: the requested length (the local buffer's);
    /// - pull: the bytes pulled (the buffer's length);
    /// - request with an IN payload: the end of the furthest byte the server pushed, so pushes
    ///   at 0..1000 and 5000..6000 count 6000 (the server may write in any order and leave
    ///   holes). Past the end the buffer is as the caller passed it, and so are the holes,
    ///   except where InfiniBand staged the read through its pool because it could not
    ///   register the buffer (scatter lists of many pieces): there the holes are unspecified,
    ///   since the server's RDMA writes are invisible to the client and keeping them would mean
    ///   copying the whole buffer in before every such read;
    /// - request with an OUT payload: its whole length, however much of it the server pulled
    ///   (small payloads travel whole with the request); the server's reply says what it used;
    /// - request without payload, reply: 0.
    pub fn len(&self) -> usize {
        *self.result.as_ref().unwrap_or(&0)
    }

    /// True when no bytes moved.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first [`len`](Completion::len) bytes of the receive buffer (a receive, get, pull or
    /// read request), as `Bytes`: exactly the bytes the operation brought, holes between a
    /// read's pushes included. Copies them; `None` for operations without a receive buffer.
    /// [`Completion::into_data`] takes them without a copy.
    pub fn data(&self) -> Option<Bytes> {
        match &self.buf {
            OpBuf::Recv(RecvBuf::Mut(b)) => Some(Bytes::copy_from_slice(&b[..self.len().min(b.len())])),
            OpBuf::Recv(r) => Some(r.to_bytes(self.len())),
            _ => None,
        }
    }

    /// What [`Completion::data`] returns, taking the buffer: without a copy when the operation
    /// received into one contiguous `BytesMut` (the buffer is truncated to the bytes brought
    /// and frozen); other buffer kinds (scatter lists, registered pool buffers, which go back
    /// to their pool) are copied.
    pub fn into_data(self) -> Option<Bytes> {
        let len = self.len();
        match self.buf {
            OpBuf::Recv(RecvBuf::Mut(mut b)) => {
                b.truncate(len);
                Some(b.freeze())
            }
            OpBuf::Recv(r) => Some(r.to_bytes(len)),
            _ => None,
        }
    }
}

/// An unexpected message (sent with [`Endpoint::send_unexpected`](crate::Endpoint::send_unexpected)).
#[derive(Debug, Clone)]
pub struct Unexpected {
    /// Sender.
    pub peer: PeerId,
    /// Tag.
    pub tag: Tag,
    /// Service level it travelled on.
    pub sl: ServiceLevel,
    /// Contents.
    pub data: Bytes,
}

/// A request's payload, chosen by the client.
#[derive(Debug)]
pub enum Payload {
    /// Header only.
    None,
    /// Data the server will pull (a write).
    Out(SendBuf),
    /// A buffer the server will push into (a read). The server decides how much to push: a
    /// client that does not know the answer's size offers the largest it accepts, and the
    /// completion's [`len`](Completion::len) says how much came ([`Completion::into_data`]
    /// takes those bytes without a copy). Small answers (up to [`Config::max_header`](crate::Config::max_header) bytes)
    /// can travel in the reply header instead, with no payload at all.
    In(RecvBuf),
}

impl Payload {
    /// The payload as its operation's buffer, and the direction it moves in.
    pub(crate) fn split(self) -> (OpBuf, Direction) {
        match self {
            Payload::None => (OpBuf::None, Direction::None),
            Payload::Out(b) => (OpBuf::Send(b), Direction::Out),
            Payload::In(b) => (OpBuf::Recv(b), Direction::In),
        }
    }
}

/// Direction of a request's payload as seen by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// No payload.
    None,
    /// The client offers `len` bytes to pull.
    Out,
    /// The client has a `len`-byte buffer to push into.
    In,
}

/// Reply status codes on the wire.
pub(crate) mod status {
    use crate::error::Error;

    pub const OK: u32 = 0;
    /// The server dropped the request without replying.
    pub const DROPPED: u32 = 1;
    /// The server replied with an error message as the header.
    pub const ERROR: u32 = 2;
    /// An application's status `s` travels as `APP + s` (with its message as the header).
    pub const APP: u32 = 1 << 16;

    /// The error a client's request fails with for a reply of status `st` (not [`OK`]) and
    /// header `header`, on every transport.
    pub fn error(st: u32, header: &[u8]) -> Error {
        let reason = || String::from_utf8_lossy(header).into_owned();
        match st {
            DROPPED => Error::Remote("the server dropped the request".into()),
            s if s >= APP => Error::RemoteStatus { status: (s - APP) as u16, reason: reason() },
            _ => Error::Remote(reason()),
        }
    }
}

/// What a backend knows about an incoming request.
#[derive(Debug)]
pub(crate) struct RequestMeta {
    pub peer: PeerId,
    pub tag: Tag,
    pub sl: ServiceLevel,
    pub id: u64,
    pub header: Bytes,
    pub dir: Direction,
    pub len: u64,
}

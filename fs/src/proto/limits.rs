//! The protocol's version, the envelope header's layout, and the limits every decoder
//! enforces (message size, lists, names, I/O per request).

/// Protocol version this build speaks (2: io servers' counters carry their disk space;
/// 3: symbolic links; 4: status requests to every server; 5: callers' credentials, hard
/// links, special files, times set to the server's clock, space allocation; 6: io servers'
/// counters carry the bytes they wrote behind; 7: disk space names its file system; 8: a read
/// sends nothing for the part of its stream past the object's end; 9: attributes and sizes of
/// several files in one request; 10: several objects created in one request, times recorded
/// lazily; 11: times recorded without a flush unless a sync asks, and a request to flush; 12:
/// objects' sizes carry the disk space they hold; 13: seeks for data and holes; 14: holes
/// punched).
pub const PROTO_VERSION: u16 = 14;

/// First four bytes of every message.
pub const MAGIC: [u8; 4] = *b"STFS";

/// Size of the fixed header: magic, version, kind, request id.
pub const HEADER_LEN: usize = 4 + 2 + 1 + 8;

/// Largest encoded message, header included: 128 KiB. Sized for the largest reply, a readdir
/// page of [`MAX_READDIR`] entries with 255-byte names (≈ 80 KiB), and small enough that a server
/// can hold one per connection without a memory budget of its own.
pub const MAX_MESSAGE: usize = 128 * 1024;

/// Most pieces in one list descriptor. A client with more splits the request.
pub const MAX_PIECES: usize = 2048;

/// Most entries in one readdir page.
pub const MAX_READDIR: usize = 256;

/// Most files in one request for several files' attributes or sizes (a listing asks for a
/// page's worth at once).
pub const MAX_BATCH: usize = 128;

/// Longest name on the wire. Longer than `NAME_MAX` (255) on purpose: a 300-byte name still
/// decodes, so the meta server can answer `ENAMETOOLONG` instead of a protocol error.
pub const MAX_NAME_WIRE: usize = 1024;

/// Longest symbolic link target, in bytes (Linux's `PATH_MAX`, terminating NUL included).
pub const MAX_LINK_TARGET: usize = 4095;

/// Longest error text in an error reply.
pub const MAX_ERROR_TEXT: usize = 256;

/// Longest software version in a status reply.
pub const MAX_VERSION_TEXT: usize = 64;

/// Most data bytes one read or write request may move. The server streams it in transfer units,
/// so this bounds work per request, not memory.
pub const MAX_IO_BYTES: u64 = 1 << 30;

/// Most view blocks a strided descriptor may span: bounds the server's work expanding it.
pub const MAX_VIEW_BLOCKS: u64 = 1 << 20;

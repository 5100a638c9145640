//! On the Unix socket only (`--grpc-uds`): an `:authority` that is no URI authority is
//! read as `localhost`, so that gRPC C-core clients (grpcio, which sends the socket path
//! escaped, `tmp%2Fx.sock`) and grpcurl (the path itself) are served, as
//! envoyproxy/ratelimit's Go server serves them. h2 resets such a request with
//! PROTOCOL_ERROR before any service sees it (its URI cannot be built), and has no switch
//! for it; a Unix socket has no host to name, so nothing is lost.
//!
//! [`AuthorityFix`] sits between the socket and h2 on the read side (writes pass through).
//! It passes the client's preface and every frame through as it came, except header
//! blocks (HEADERS and their CONTINUATIONs): each is decoded (HPACK, RFC 7541, with the
//! client's dynamic table kept here), the `:authority` replaced when h2 would refuse it,
//! and written again as literals that touch no table (h2's dynamic table stays empty), in
//! frames of at most 16 384 bytes (the size every HTTP/2 peer accepts). Bounded: a header
//! block of at most [`MAX_BLOCK`] bytes as sent and as decoded (h2's own bound on a
//! header list, beyond which it refuses the request); beyond, or anything HPACK or HTTP/2
//! forbids, the connection fails (h2 would close it for the latter too). With TLS on the socket
//! the bytes are TLS records, and pass as they are (such a client is not helped).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::hpack::{write_integer, Table};

/// The most bytes of one header block, as sent and as decoded (each field's name and
/// value plus 32, as HPACK counts them).
pub(crate) const MAX_BLOCK: usize = super::hpack::MAX_LIST;

/// The buffers' room kept between header blocks.
const IDLE_ROOM: usize = 4 * 1024;

/// Bytes made ready for h2 after which the frames still read wait until it has taken them:
/// what one read can make is at most this and one header block.
const MAX_OUTPUT: usize = 64 * 1024;

/// What stands for an authority h2 would refuse.
const LOCAL: &[u8] = b"localhost";

const PREFACE_BYTES: usize = 24;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The frame size every peer accepts (SETTINGS_MAX_FRAME_SIZE's least value).
const FRAME_MAX: usize = 16_384;
/// CONTINUATION frames one header block may take: a block within [`MAX_BLOCK`] needs a
/// few; empty ones, which h2's own guard would count, are absorbed here and must not run
/// on without end.
const MAX_CONTINUATIONS: u16 = 64;

/// The read side of a Unix-socket connection with its `:authority` made acceptable.
pub(crate) struct AuthorityFix<S> {
    inner: S,
    /// Off: every byte passes as it is (TLS on the socket: the bytes here are records).
    on: bool,
    /// Read from the socket, not yet looked at.
    input: Vec<u8>,
    /// Ready for h2, from `given` on.
    output: Vec<u8>,
    given: usize,
    stage: Stage,
    table: Table,
    block: Option<Block>,
    eof: bool,
}

#[derive(Clone, Copy)]
enum Stage {
    /// Bytes of the client's preface still to pass.
    Preface(usize),
    /// At a frame's start.
    Frames,
    /// Bytes of a frame's payload still to pass as they are.
    Copy(usize),
}

/// A header block being gathered.
struct Block {
    stream: [u8; 4],
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    continuations: u16,
}

impl<S> AuthorityFix<S> {
    /// `inner`'s reads, with header blocks rewritten when `on`.
    pub(crate) fn new(inner: S, on: bool) -> AuthorityFix<S> {
        AuthorityFix {
            inner,
            on,
            input: Vec::new(),
            output: Vec::new(),
            given: 0,
            stage: Stage::Preface(PREFACE_BYTES),
            table: Table::default(),
            block: None,
            eof: false,
        }
    }

    /// Turns as much of `input` into `output` as can be.
    fn process(&mut self) -> io::Result<()> {
        loop {
            match self.stage {
                Stage::Preface(left) | Stage::Copy(left) => {
                    let n = left.min(self.input.len());
                    self.output.extend(self.input.drain(..n));
                    if n < left {
                        self.stage = match self.stage {
                            Stage::Preface(_) => Stage::Preface(left - n),
                            _ => Stage::Copy(left - n),
                        };
                        return Ok(());
                    }
                    self.stage = Stage::Frames;
                }
                // Past the bound, the rest waits for h2 to read what is ready: small frames
                // that name a large table entry decode to far more than they take to send.
                Stage::Frames if self.output.len() >= MAX_OUTPUT => return Ok(()),
                Stage::Frames => {
                    if !self.frame()? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Handles the frame at `input`'s start; false when more bytes are needed.
    fn frame(&mut self) -> io::Result<bool> {
        if self.input.len() < 9 {
            return Ok(false);
        }
        let head: [u8; 9] = self.input[..9].try_into().expect("9 bytes");
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream: [u8; 4] = head[5..9].try_into().expect("4 bytes");
        let in_block = self.block.is_some();
        if in_block && kind != CONTINUATION {
            return Err(broken("a frame inside a header block"));
        }
        if kind != HEADERS && !(kind == CONTINUATION && in_block) {
            self.output.extend(self.input.drain(..9));
            self.stage = Stage::Copy(len);
            return Ok(true);
        }
        if len > MAX_BLOCK {
            return Err(broken("a header block over the bound"));
        }
        if self.input.len() < 9 + len {
            return Ok(false);
        }
        let payload: Vec<u8> = self.input.drain(..9 + len).skip(9).collect();
        match self.block.as_mut() {
            Some(block) if block.stream != stream => {
                return Err(broken("a CONTINUATION of another stream"))
            }
            Some(block) if block.continuations >= MAX_CONTINUATIONS => {
                return Err(broken("a header block in too many frames"))
            }
            Some(block) => {
                block.continuations += 1;
                block.fragment.extend_from_slice(&payload);
            }
            None => self.block = Some(headers(flags, stream, &payload)?),
        }
        let block = self.block.as_ref().expect("gathered");
        if block.fragment.len() > MAX_BLOCK {
            return Err(broken("a header block over the bound"));
        }
        if flags & END_HEADERS != 0 {
            let block = self.block.take().expect("gathered");
            let mut fields = self.table.decode(&block.fragment)?;
            acceptable(&mut fields)?;
            write_block(&mut self.output, &block, &fields);
        }
        Ok(true)
    }
}

/// A HEADERS frame's block fragment, without its padding and priority.
fn headers(flags: u8, stream: [u8; 4], payload: &[u8]) -> io::Result<Block> {
    let mut at = 0;
    let mut end = payload.len();
    if flags & PADDED != 0 {
        let pad = usize::from(*payload.first().ok_or_else(|| broken("padding"))?);
        at = 1;
        end = end.checked_sub(pad).ok_or_else(|| broken("padding"))?;
    }
    let priority = match flags & PRIORITY != 0 {
        true => {
            let p = payload.get(at..at + 5).ok_or_else(|| broken("priority"))?;
            at += 5;
            Some(p.try_into().expect("5 bytes"))
        }
        false => None,
    };
    let fragment = payload.get(at..end).ok_or_else(|| broken("padding"))?;
    Ok(Block {
        stream,
        end_stream: flags & END_STREAM != 0,
        priority,
        fragment: fragment.to_vec(),
        continuations: 0,
    })
}

/// Each `:authority` h2 would refuse made `localhost`; the list, so changed, still within
/// the bound (the replacement is longer than an empty authority).
fn acceptable(fields: &mut [(Vec<u8>, Vec<u8>)]) -> io::Result<()> {
    let mut total = 0;
    for (name, value) in fields.iter_mut() {
        if name.as_slice() == b":authority"
            && http::uri::Authority::try_from(value.as_slice()).is_err()
        {
            *value = LOCAL.to_vec();
        }
        total += name.len() + value.len() + 32;
    }
    match total > MAX_BLOCK {
        true => Err(broken("a header list over the bound")),
        false => Ok(()),
    }
}

/// The fields again, as literals without indexing, in a HEADERS frame and as many
/// CONTINUATIONs as needed.
fn write_block(out: &mut Vec<u8>, block: &Block, fields: &[(Vec<u8>, Vec<u8>)]) {
    let mut encoded = Vec::new();
    for (name, value) in fields {
        encoded.push(0);
        for text in [name.as_slice(), value.as_slice()] {
            write_integer(&mut encoded, text.len(), 7, 0);
            encoded.extend_from_slice(text);
        }
    }
    let first_room = FRAME_MAX - block.priority.map_or(0, |p| p.len());
    let mut rest: &[u8] = &encoded;
    let mut first = true;
    loop {
        let room = if first { first_room } else { FRAME_MAX };
        let (chunk, after) = rest.split_at(rest.len().min(room));
        let mut flags = if after.is_empty() { END_HEADERS } else { 0 };
        let kind = match first {
            true => {
                flags |= if block.end_stream { END_STREAM } else { 0 };
                flags |= if block.priority.is_some() {
                    PRIORITY
                } else {
                    0
                };
                HEADERS
            }
            false => CONTINUATION,
        };
        let priority = block.priority.filter(|_| first);
        let len = chunk.len() + priority.map_or(0, |p| p.len());
        out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&block.stream);
        out.extend_from_slice(priority.as_ref().map_or(&[][..], |p| &p[..]));
        out.extend_from_slice(chunk);
        if after.is_empty() {
            return;
        }
        rest = after;
        first = false;
    }
}

fn broken(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("HTTP/2 on the Unix socket: {what}"),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.on {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        loop {
            if this.given < this.output.len() {
                let n = buf.remaining().min(this.output.len() - this.given);
                buf.put_slice(&this.output[this.given..this.given + n]);
                this.given += n;
                if this.given == this.output.len() {
                    this.output.clear();
                    this.given = 0;
                    // An idle connection keeps no block's room.
                    if this.output.capacity() > IDLE_ROOM {
                        this.output = Vec::new();
                    }
                    if this.input.is_empty() && this.input.capacity() > IDLE_ROOM {
                        this.input = Vec::new();
                    }
                }
                return Poll::Ready(Ok(()));
            }
            this.process()?;
            if !this.output.is_empty() {
                continue;
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if read.filled().is_empty() => this.eof = true,
                Poll::Ready(Ok(())) => this.input.extend_from_slice(read.filled()),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The fuzz harness's property (`crate::fuzzing::uds_authority`): `data` as frames after
/// the preface never panics; as one header block, it is refused, or passed as frames of
/// at most 16 384 bytes whose block decodes, touching no table, to the same fields in the
/// same order, the authority alone changed, and only when h2 would refuse it.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz(data: &[u8]) {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut raw = AuthorityFix::new((), true);
    raw.input = [PREFACE, data].concat();
    let _ = raw.process();
    let mut fix = AuthorityFix::new((), true);
    fix.input = PREFACE.to_vec();
    fix.input
        .extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
    fix.input
        .extend_from_slice(&[HEADERS, END_HEADERS, 0, 0, 0, 1]);
    fix.input.extend_from_slice(data);
    if data.len() >= 1 << 24 || fix.process().is_err() {
        return;
    }
    let sent = Table::default().decode(data).expect("decoded once already");
    assert_eq!(&fix.output[..PREFACE.len()], PREFACE);
    let (mut out, mut block, mut first) = (&fix.output[PREFACE.len()..], Vec::new(), true);
    loop {
        let len = usize::from(out[0]) << 16 | usize::from(out[1]) << 8 | usize::from(out[2]);
        assert!(len <= FRAME_MAX);
        assert_eq!(out[3], if first { HEADERS } else { CONTINUATION });
        block.extend_from_slice(&out[9..9 + len]);
        let last = out[4] & END_HEADERS != 0;
        out = &out[9 + len..];
        if last {
            break;
        }
        first = false;
    }
    assert!(out.is_empty(), "nothing after the block");
    let mut table = Table::default();
    let passed = table.decode(&block).expect("the rewritten block decodes");
    assert!(
        table.entries.is_empty() && table.size == 0,
        "no table touched"
    );
    assert_eq!(passed.len(), sent.len());
    for ((name, value), (sent_name, sent_value)) in passed.iter().zip(&sent) {
        assert_eq!(name, sent_name);
        let refused = name.as_slice() == b":authority"
            && http::uri::Authority::try_from(sent_value.as_slice()).is_err();
        assert_eq!(value.as_slice(), if refused { LOCAL } else { sent_value });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A HEADERS frame on stream 1 with `block`, after the preface.
    fn connection(block: &[u8], flags: u8) -> Vec<u8> {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        bytes.extend_from_slice(&(block.len() as u32).to_be_bytes()[1..]);
        bytes.extend_from_slice(&[HEADERS, flags, 0, 0, 0, 1]);
        bytes.extend_from_slice(block);
        bytes
    }

    fn through(bytes: &[u8]) -> io::Result<Vec<u8>> {
        let mut fix = AuthorityFix::new((), true);
        fix.input = bytes.to_vec();
        fix.process()?;
        Ok(fix.output)
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost_and_the_rest_passes() {
        // :method POST, :scheme http, :path /, :authority "tmp%2Fx.sock" (indexed name).
        let mut block = vec![0x83, 0x86, 0x84, 0x41, 12];
        block.extend_from_slice(b"tmp%2Fx.sock");
        let out = through(&connection(&block, END_HEADERS | END_STREAM)).unwrap();
        let head = 24 + 9;
        assert_eq!(
            &out[..head],
            &connection(&[], 0)[..head],
            "preface, SETTINGS"
        );
        assert_eq!(out[head + 3..head + 5], [HEADERS, END_HEADERS | END_STREAM]);
        let mut table = Table::default();
        let fields = table.decode(&out[head + 9..]).unwrap();
        assert_eq!(fields[3], (b":authority".to_vec(), b"localhost".to_vec()));
        assert_eq!(fields[1], (b":scheme".to_vec(), b"http".to_vec()));
        assert!(table.entries.is_empty(), "no table used");
        // A good authority is kept.
        let mut block = vec![0x83, 0x86, 0x84, 0x41, 9];
        block.extend_from_slice(b"127.0.0.1");
        let out = through(&connection(&block, END_HEADERS)).unwrap();
        let fields = Table::default().decode(&out[head + 9..]).unwrap();
        assert_eq!(fields[3].1, b"127.0.0.1");
    }

    #[test]
    fn hostile_blocks_fail_the_connection_without_panicking() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for len in 0..2_000usize {
            let block: Vec<u8> = (0..len % 97)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = through(&connection(&block, END_HEADERS));
            let _ = through(&connection(&block, END_HEADERS | PADDED | PRIORITY));
        }
        // An index past the table; a size update over the setting; a block over the bound.
        for block in [vec![0xff, 0x80, 0x01], vec![0x3f, 0xe2, 0x1f]] {
            assert!(through(&connection(&block, END_HEADERS)).is_err());
        }
        assert!(through(&connection(&vec![0x82; MAX_BLOCK + 1], END_HEADERS)).is_err());
        // Many references to one large entry decode past the bound: refused, not built.
        let mut bomb = vec![0x40, 1, b'x', 0x7f, 0xa1, 0x1e];
        bomb.extend(std::iter::repeat_n(b'v', 4000));
        bomb.extend(std::iter::repeat_n(0xbe, 1000));
        assert!(through(&connection(&bomb, END_HEADERS)).is_err());
    }

    /// A header block never ended by a stream of empty CONTINUATION frames (which h2's
    /// flood guard would count, had it seen them) fails the connection after a bound.
    #[test]
    fn endless_empty_continuations_fail_the_connection() {
        let mut bytes = connection(&[0x83], 0);
        for _ in 0..MAX_CONTINUATIONS {
            bytes.extend_from_slice(&[0, 0, 0, CONTINUATION, 0, 0, 0, 0, 1]);
        }
        assert!(through(&bytes).is_ok(), "a block may take a few frames");
        bytes.extend_from_slice(&[0, 0, 0, CONTINUATION, 0, 0, 0, 0, 1]);
        let refused = through(&bytes).expect_err("one more is refused");
        assert!(refused.to_string().contains("too many frames"), "{refused}");
    }

    #[test]
    fn frames_that_decode_to_far_more_than_they_take_wait_for_h2() {
        // A 4 000-byte entry put in the table, then 600 frames of 3 references to it:
        // 12 bytes each, 12 KB decoded each (within the list's bound).
        let mut first = vec![0x40, 1, b'x', 0x7f, 0xa1, 0x1e];
        first.extend(std::iter::repeat_n(b'v', 4000));
        let mut bytes = connection(&first, END_HEADERS);
        for stream in 0..600u32 {
            bytes.extend_from_slice(&[0, 0, 3, HEADERS, END_HEADERS]);
            bytes.extend_from_slice(&(2 * stream + 3).to_be_bytes());
            bytes.extend_from_slice(&[0xbe, 0xbe, 0xbe]);
        }
        let mut fix = AuthorityFix::new((), true);
        fix.input = bytes;
        fix.process().unwrap();
        assert!(
            fix.output.len() <= MAX_OUTPUT + 2 * MAX_BLOCK,
            "{} bytes made ready from one read",
            fix.output.len()
        );
        assert!(!fix.input.is_empty(), "the rest waits");
        // Once h2 has taken them, the next frames are made ready.
        let (before, ready) = (fix.input.len(), fix.output.len());
        fix.output.clear();
        fix.process().unwrap();
        assert!(fix.input.len() < before && fix.output.len() <= ready + 2 * MAX_BLOCK);
    }
}

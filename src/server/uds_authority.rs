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
//! block of at most [`MAX_BLOCK`] bytes as sent and [`MAX_BLOCK`] decoded (h2 itself
//! refuses header lists over 16 KiB with its own answer); beyond, or anything HPACK or
//! HTTP/2 forbids, the connection fails (h2 would close it too). With TLS on the socket
//! the bytes are TLS records, and pass as they are (such a client is not helped).

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most bytes of one header block, as sent and as decoded (each field's name and
/// value plus 32, as HPACK counts them).
pub const MAX_BLOCK: usize = 64 * 1024;

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
/// SETTINGS_HEADER_TABLE_SIZE as h2 announces it (its default, not changed here).
const TABLE_MAX: usize = 4_096;

/// The read side of a Unix-socket connection with its `:authority` made acceptable.
pub struct AuthorityFix<S> {
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
}

impl<S> AuthorityFix<S> {
    /// `inner`'s reads, with header blocks rewritten when `on`.
    pub fn new(inner: S, on: bool) -> AuthorityFix<S> {
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
            Some(block) => block.fragment.extend_from_slice(&payload),
            None => self.block = Some(headers(flags, stream, &payload)?),
        }
        let block = self.block.as_ref().expect("gathered");
        if block.fragment.len() > MAX_BLOCK {
            return Err(broken("a header block over the bound"));
        }
        if flags & END_HEADERS != 0 {
            let block = self.block.take().expect("gathered");
            let fields = self.table.decode(&block.fragment)?;
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
    })
}

/// The fields again, as literals without indexing (the authority replaced when h2 would
/// refuse it), in a HEADERS frame and as many CONTINUATIONs as needed.
fn write_block(out: &mut Vec<u8>, block: &Block, fields: &[(Vec<u8>, Vec<u8>)]) {
    let mut encoded = Vec::new();
    for (name, value) in fields {
        let value: &[u8] = match name.as_slice() == b":authority"
            && http::uri::Authority::try_from(value.as_slice()).is_err()
        {
            true => LOCAL,
            false => value,
        };
        encoded.push(0);
        for text in [name.as_slice(), value] {
            integer(&mut encoded, text.len(), 7, 0);
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

/// HPACK's integer with an `n`-bit prefix, after `high` (the bits above the prefix).
fn integer(out: &mut Vec<u8>, value: usize, n: u32, high: u8) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(high | value as u8);
        return;
    }
    out.push(high | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

fn broken(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("HTTP/2 on the Unix socket: {what}"),
    )
}

/// The client's HPACK dynamic table, newest first, and its size as HPACK counts it.
#[derive(Default)]
struct Table {
    entries: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max: Option<usize>,
}

impl Table {
    fn max(&self) -> usize {
        self.max.unwrap_or(TABLE_MAX)
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = name.len() + value.len() + 32;
        self.entries.push_front((name, value));
        self.size += size;
        self.evict();
    }

    fn evict(&mut self) {
        while self.size > self.max() {
            let Some((n, v)) = self.entries.pop_back() else {
                break;
            };
            self.size -= n.len() + v.len() + 32;
        }
    }

    /// Entry `index` (1-based: the static table, then the dynamic one).
    fn get(&self, index: usize) -> io::Result<(Vec<u8>, Vec<u8>)> {
        if let Some((n, v)) = index.checked_sub(1).and_then(|i| STATIC.get(i)) {
            return Ok((n.as_bytes().to_vec(), v.as_bytes().to_vec()));
        }
        index
            .checked_sub(STATIC.len() + 1)
            .and_then(|i| self.entries.get(i))
            .cloned()
            .ok_or_else(|| broken("an HPACK index out of the table"))
    }

    /// The fields of one header block, in order.
    fn decode(&mut self, mut block: &[u8]) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut fields = Vec::new();
        let mut total = 0usize;
        while let Some(&first) = block.first() {
            let (name, value) = match first {
                b if b & 0x80 != 0 => self.get(read_integer(&mut block, 7)?)?,
                b if b & 0xc0 == 0x40 => {
                    let field = self.literal(&mut block, 6)?;
                    self.insert(field.0.clone(), field.1.clone());
                    field
                }
                b if b & 0xe0 == 0x20 => {
                    let size = read_integer(&mut block, 5)?;
                    if size > TABLE_MAX {
                        return Err(broken("an HPACK table size over the setting"));
                    }
                    self.max = Some(size);
                    self.evict();
                    continue;
                }
                _ => self.literal(&mut block, 4)?,
            };
            total += name.len() + value.len() + 32;
            if total > MAX_BLOCK {
                return Err(broken("a header list over the bound"));
            }
            fields.push((name, value));
        }
        Ok(fields)
    }

    /// A literal field: its name by index (`n`-bit prefix) or as a string, then its value.
    fn literal(&self, block: &mut &[u8], n: u32) -> io::Result<(Vec<u8>, Vec<u8>)> {
        let index = read_integer(block, n)?;
        let name = match index {
            0 => read_string(block)?,
            i => self.get(i)?.0,
        };
        Ok((name, read_string(block)?))
    }
}

/// Reads an HPACK integer with an `n`-bit prefix (at most 2^28 and a little).
fn read_integer(block: &mut &[u8], n: u32) -> io::Result<usize> {
    let max = (1usize << n) - 1;
    let (&first, mut rest) = block.split_first().ok_or_else(|| broken("HPACK"))?;
    let mut value = usize::from(first) & max;
    if value == max {
        let mut shift = 0;
        loop {
            let (&b, after) = rest.split_first().ok_or_else(|| broken("HPACK"))?;
            rest = after;
            value += usize::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
            if shift > 21 {
                return Err(broken("an HPACK integer too long"));
            }
        }
    }
    *block = rest;
    Ok(value)
}

/// Reads an HPACK string, Huffman-coded or not.
fn read_string(block: &mut &[u8]) -> io::Result<Vec<u8>> {
    let huffman = block.first().is_some_and(|b| b & 0x80 != 0);
    let len = read_integer(block, 7)?;
    if len > block.len() {
        return Err(broken("an HPACK string past the block"));
    }
    let (text, rest) = block.split_at(len);
    *block = rest;
    match huffman {
        true => huffman_decode(text),
        false => Ok(text.to_vec()),
    }
}

/// The bit length of each symbol's code (0..=255, then EOS), RFC 7541 Appendix B; the
/// code is canonical, so the lengths alone give it.
#[rustfmt::skip]
const CODE_BITS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28,
    30, 28, 28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8,
    6, 6, 6, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5,
    6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13,
    28, 20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23,
    24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22, 21, 20, 22, 22, 23, 23, 21, 23,
    22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22,
    22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19, 21, 26,
    27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23,
    22, 22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27,
    27, 27, 26, 30,
];

/// The canonical code's decoding tables: per length, the first code and where its
/// symbols start in `symbols` (sorted by length, then value).
struct Huffman {
    first: [u32; 31],
    count: [u32; 31],
    start: [usize; 31],
    symbols: Vec<u16>,
}

fn huffman() -> &'static Huffman {
    static TABLE: OnceLock<Huffman> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut count = [0u32; 31];
        for &bits in &CODE_BITS {
            count[usize::from(bits)] += 1;
        }
        let mut symbols: Vec<u16> = (0..257).collect();
        symbols.sort_by_key(|&s| (CODE_BITS[usize::from(s)], s));
        let (mut first, mut start) = ([0u32; 31], [0usize; 31]);
        let (mut code, mut at) = (0u32, 0usize);
        for bits in 1..31 {
            code = (code + count[bits - 1]) << 1;
            first[bits] = code;
            start[bits] = at;
            at += count[bits] as usize;
        }
        Huffman {
            first,
            count,
            start,
            symbols,
        }
    })
}

/// Decodes a Huffman-coded string: EOS inside, or padding that is longer than 7 bits or
/// not all ones, is an error (RFC 7541, 5.2).
fn huffman_decode(text: &[u8]) -> io::Result<Vec<u8>> {
    let table = huffman();
    let mut out = Vec::with_capacity(text.len() * 8 / 5);
    let (mut code, mut bits) = (0u32, 0usize);
    for byte in text {
        for shift in (0..8).rev() {
            code = code << 1 | u32::from(byte >> shift & 1);
            bits += 1;
            if bits > 30 {
                return Err(broken("a Huffman code too long"));
            }
            let offset = code.wrapping_sub(table.first[bits]);
            if code >= table.first[bits] && offset < table.count[bits] {
                match table.symbols[table.start[bits] + offset as usize] {
                    256 => return Err(broken("EOS in a Huffman string")),
                    symbol => out.push(symbol as u8),
                }
                (code, bits) = (0, 0);
            }
        }
    }
    if bits > 7 || code != (1 << bits) - 1 {
        return Err(broken("Huffman padding"));
    }
    Ok(out)
}

/// HPACK's static table (RFC 7541 Appendix A).
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

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

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn huffman_strings_of_rfc_7541_decode() {
        let cases = [
            ("f1e3c2e5f23a6ba0ab90f4ff", "www.example.com"),
            ("a8eb10649cbf", "no-cache"),
            ("25a849e95ba97d7f", "custom-key"),
            ("25a849e95bb8e8b4bf", "custom-value"),
            ("6402", "302"),
            ("aec3771a4b", "private"),
        ];
        for (coded, text) in cases {
            assert_eq!(huffman_decode(&hex(coded)).unwrap(), text.as_bytes());
        }
        // Padding of 8 bits, or not all ones, and EOS itself.
        for bad in ["a8eb10649cbfff", "a8eb10649cbe", "ffffffff"] {
            assert!(huffman_decode(&hex(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn rfc_7541_c3_requests_decode_with_the_dynamic_table() {
        let mut table = Table::default();
        let first = table
            .decode(&hex("828684410f7777772e6578616d706c652e636f6d"))
            .unwrap();
        assert_eq!(
            first[3],
            (b":authority".to_vec(), b"www.example.com".to_vec())
        );
        let second = table.decode(&hex("828684be58086e6f2d6361636865")).unwrap();
        assert_eq!(
            second[3],
            (b":authority".to_vec(), b"www.example.com".to_vec())
        );
        assert_eq!(second[4], (b"cache-control".to_vec(), b"no-cache".to_vec()));
        assert_eq!(table.size, 110);
    }

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
}

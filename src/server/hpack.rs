//! HPACK (RFC 7541), the decoding side, as `uds_authority.rs` needs it: a client's
//! header blocks read with its dynamic table kept here, every integer, string and index
//! bounded by the block it is in, Huffman codes decoded from their lengths alone (the
//! code is canonical). Malformed input is an error, never a panic.

use std::collections::VecDeque;
use std::io;
use std::sync::OnceLock;

/// SETTINGS_HEADER_TABLE_SIZE as h2 announces it (its default, not changed here).
const TABLE_MAX: usize = 4_096;

/// The most bytes of one decoded header list, counted as HPACK counts them (each field's
/// name and value plus 32): h2's own bound on the decision listener
/// (`http2_max_header_list_size`), beyond which it would refuse the request anyway.
pub(super) const MAX_LIST: usize = 16 * 1024;

fn broken(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("HTTP/2 on the Unix socket: {what}"),
    )
}

/// HPACK's integer with an `n`-bit prefix, after `high` (the bits above the prefix).
pub(super) fn write_integer(out: &mut Vec<u8>, value: usize, n: u32, high: u8) {
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

/// The client's HPACK dynamic table, newest first, and its size as HPACK counts it.
#[derive(Default)]
pub(super) struct Table {
    pub(super) entries: VecDeque<(Vec<u8>, Vec<u8>)>,
    pub(super) size: usize,
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
    pub(super) fn decode(&mut self, mut block: &[u8]) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
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
            if total > MAX_LIST {
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
}

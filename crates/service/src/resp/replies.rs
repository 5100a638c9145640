//! Replies out, in RESP2 or RESP3 as the connection chose (`HELLO`), written into one
//! buffer the connection sends after each read's commands are answered.

use bytes::BytesMut;

/// Writes replies into a buffer, in the protocol version the connection chose.
#[derive(Debug, Default)]
pub struct Replies {
    pub out: BytesMut,
    /// RESP3 (after `HELLO 3`): maps and nulls of their own.
    pub resp3: bool,
}

impl Replies {
    pub fn simple(&mut self, text: &str) {
        self.line(b'+', text.as_bytes());
    }

    /// An error reply; `text` starts with its code (`ERR`, `NOAUTH`, ...). Line breaks
    /// are replaced, as Redis does, so that no client text can end the line early.
    pub fn error(&mut self, text: &str) {
        let clean: Vec<u8> = text
            .bytes()
            .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b })
            .collect();
        self.line(b'-', &clean);
    }

    pub fn integer(&mut self, n: i64) {
        self.number(b':', n);
    }

    pub fn bulk(&mut self, value: &[u8]) {
        self.number(b'$', value.len() as i64);
        self.out.extend_from_slice(value);
        self.out.extend_from_slice(b"\r\n");
    }

    pub fn null(&mut self) {
        if self.resp3 {
            self.out.extend_from_slice(b"_\r\n");
        } else {
            self.out.extend_from_slice(b"$-1\r\n");
        }
    }

    pub fn array(&mut self, len: usize) {
        self.number(b'*', len as i64);
    }

    /// A map of `len` pairs (RESP2: an array of `2 x len` elements).
    pub fn map(&mut self, len: usize) {
        if self.resp3 {
            self.number(b'%', len as i64);
        } else {
            self.array(2 * len);
        }
    }

    /// A line of one decimal number, formatted without an allocation.
    fn number(&mut self, kind: u8, n: i64) {
        let mut digits = itoa::Buffer::new();
        self.line(kind, digits.format(n).as_bytes());
    }

    /// An array of integers (the hot path: five per `CL.THROTTLE` answer), written into a
    /// buffer on the stack and appended at once.
    pub fn integers(&mut self, numbers: &[i64]) {
        // `:`, at most 19 digits and a sign, `\r\n` a number.
        const MOST: usize = 8;
        if numbers.len() > MOST {
            self.array(numbers.len());
            numbers.iter().for_each(|&n| self.integer(n));
            return;
        }
        let mut line = [0u8; 4 + MOST * 23];
        line[..4].copy_from_slice(b"*0\r\n");
        line[1] = b'0' + numbers.len() as u8;
        let mut at = 4;
        let mut digits = itoa::Buffer::new();
        for &n in numbers {
            let text = digits.format(n).as_bytes();
            line[at] = b':';
            line[at + 1..at + 1 + text.len()].copy_from_slice(text);
            at += 1 + text.len();
            line[at..at + 2].copy_from_slice(b"\r\n");
            at += 2;
        }
        self.out.extend_from_slice(&line[..at]);
    }

    fn line(&mut self, kind: u8, text: &[u8]) {
        self.out.reserve(text.len() + 3);
        self.out.extend_from_slice(&[kind]);
        self.out.extend_from_slice(text);
        self.out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_in_both_protocols() {
        let mut r = Replies::default();
        r.simple("OK");
        r.error("ERR bad\r\nthing");
        r.integer(-1);
        r.integer(i64::MIN);
        r.integer(0);
        r.bulk(b"hi");
        r.null();
        r.map(1);
        assert_eq!(
            &r.out[..],
            b"+OK\r\n-ERR bad  thing\r\n:-1\r\n:-9223372036854775808\r\n:0\r\n$2\r\nhi\r\n$-1\r\n*2\r\n"
        );
        let mut r = Replies {
            resp3: true,
            ..Replies::default()
        };
        r.null();
        r.map(1);
        assert_eq!(&r.out[..], b"_\r\n%1\r\n");
    }

    #[test]
    fn arrays_of_integers_as_one_number_at_a_time() {
        let one_at_a_time = |numbers: &[i64]| {
            let mut r = Replies::default();
            r.array(numbers.len());
            numbers.iter().for_each(|&n| r.integer(n));
            r.out
        };
        let sets: [&[i64]; 5] = [
            &[],
            &[0, 1, -1, 9_223_372_036_854_775_807, 42],
            &[i64::MIN; 8],
            &[7; 9],
            &[-10, 100],
        ];
        for numbers in sets {
            let mut r = Replies::default();
            r.integers(numbers);
            assert_eq!(r.out, one_at_a_time(numbers), "{numbers:?}");
        }
        let mut r = Replies::default();
        r.integers(&[0, -1, i64::MIN]);
        assert_eq!(&r.out[..], b"*3\r\n:0\r\n:-1\r\n:-9223372036854775808\r\n");
    }
}

//! Where a command's arguments lie once [`super::protocol::Parser`] has read it whole: an
//! array command's in the read buffer itself, read in place (#62: splitting each argument
//! off as its own `Bytes` cost an allocation and two atomic reference counts per argument),
//! an inline command's unquoted into the frame.

use smallvec::SmallVec;

/// A command's arguments, borrowed: up to 8 without an allocation (`CL.THROTTLE` has 5 or 6).
pub type Args<'a> = SmallVec<[&'a [u8]; 8]>;

/// An inline command whose quotes do not close (the parser's protocol error).
#[derive(Debug, PartialEq, Eq)]
pub struct Unbalanced;

/// The command [`super::protocol::Parser::next`] completed, valid until its next call.
#[derive(Debug, Default)]
pub struct Frame {
    /// `(start, end)` of each argument: in the read buffer for an array command, in
    /// `inline` for an inline one.
    pub(super) spans: Vec<(usize, usize)>,
    /// An inline command's arguments, unquoted, one after the other.
    inline: Vec<u8>,
    is_inline: bool,
}

impl Frame {
    /// The arguments, given the buffer the command was read from.
    pub fn args<'a>(&'a self, buf: &'a [u8]) -> Args<'a> {
        let raw = if self.is_inline {
            &self.inline[..]
        } else {
            buf
        };
        self.spans.iter().map(|&(s, e)| &raw[s..e]).collect()
    }

    /// Starts an array command: its arguments will be spans of the read buffer.
    pub(super) fn begin_array(&mut self, arguments: usize) {
        self.spans.clear();
        self.spans.reserve(arguments);
        self.is_inline = false;
    }
}

/// Splits an inline line at blanks, honouring Redis's quotes: `"..."` with `\n`, `\r`,
/// `\t`, `\b`, `\a`, `\xHH` and `\<any>` escapes, `'...'` with `\'` only; a closing quote
/// must be followed by a blank or the end.
pub(super) fn split_inline(line: &[u8], frame: &mut Frame) -> Result<(), Unbalanced> {
    let unbalanced = || Unbalanced;
    frame.spans.clear();
    frame.inline.clear();
    frame.is_inline = true;
    let mut i = 0;
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    loop {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == line.len() {
            return Ok(());
        }
        let start = frame.inline.len();
        let arg = &mut frame.inline;
        match line[i] {
            b'"' => {
                i += 1;
                loop {
                    let &b = line.get(i).ok_or_else(unbalanced)?;
                    i += 1;
                    match b {
                        b'"' => break,
                        b'\\' => {
                            let &e = line.get(i).ok_or_else(unbalanced)?;
                            i += 1;
                            let hex = line
                                .get(i..i + 2)
                                .and_then(|h| std::str::from_utf8(h).ok())
                                .and_then(|h| u8::from_str_radix(h, 16).ok());
                            match (e, hex) {
                                (b'x', Some(v)) => {
                                    arg.push(v);
                                    i += 2;
                                }
                                (b'n', _) => arg.push(b'\n'),
                                (b'r', _) => arg.push(b'\r'),
                                (b't', _) => arg.push(b'\t'),
                                (b'b', _) => arg.push(8),
                                (b'a', _) => arg.push(7),
                                (other, _) => arg.push(other),
                            }
                        }
                        other => arg.push(other),
                    }
                }
            }
            b'\'' => {
                i += 1;
                loop {
                    let &b = line.get(i).ok_or_else(unbalanced)?;
                    i += 1;
                    match b {
                        b'\'' => break,
                        b'\\' if line.get(i) == Some(&b'\'') => {
                            arg.push(b'\'');
                            i += 1;
                        }
                        other => arg.push(other),
                    }
                }
            }
            _ => {
                while i < line.len() && !line[i].is_ascii_whitespace() {
                    arg.push(line[i]);
                    i += 1;
                }
            }
        }
        // A closing quote must be followed by a blank or the end (a bare word stops at one).
        if line.get(i).is_some_and(|b| !b.is_ascii_whitespace()) {
            return Err(unbalanced());
        }
        frame.spans.push((start, frame.inline.len()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(line: &[u8]) -> Result<Vec<Vec<u8>>, Unbalanced> {
        let mut frame = Frame::default();
        split_inline(line, &mut frame)?;
        let args = frame.args(&[]).iter().map(|a| a.to_vec()).collect();
        Ok(args)
    }

    #[test]
    fn inline_quotes_as_redis_splits_them() {
        assert_eq!(
            split(b"SET \"a b\\x41\\n\" 'it\\'s' plain\r").unwrap(),
            vec![
                b"SET".to_vec(),
                b"a bA\n".to_vec(),
                b"it's".to_vec(),
                b"plain".to_vec()
            ]
        );
        assert_eq!(split(b"\"unbalanced"), Err(Unbalanced));
        assert_eq!(split(b"\"a\"b"), Err(Unbalanced));
        assert_eq!(split(b"  "), Ok(vec![]));
    }
}

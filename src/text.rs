//! Text that reaches a log line, an error or a peer: caller text cut to a bound (at a
//! character boundary), and an error with its causes on one line. Every layer uses these;
//! they use nothing.

/// `text` cut to at most `max` bytes, at a character boundary.
pub fn cut_bytes(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The first `n` characters of `text`.
pub fn first_chars(text: &str, n: usize) -> &str {
    match text.char_indices().nth(n) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// An error and its causes, on one line (a transport error's reason is in its causes).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_at_character_boundaries() {
        assert_eq!(cut_bytes("ab\u{e9}", 3), "ab");
        assert_eq!(cut_bytes("abc", 10), "abc");
        assert_eq!(first_chars("\u{e9}\u{e9}\u{e9}", 2), "\u{e9}\u{e9}");
        assert_eq!(first_chars("ab", 5), "ab");
    }

    #[test]
    fn an_error_says_its_causes() {
        assert_eq!(error_chain(&std::io::Error::other("refused")), "refused");
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("connecting")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::other("refused"));
        assert_eq!(error_chain(&e), "connecting: refused");
    }
}

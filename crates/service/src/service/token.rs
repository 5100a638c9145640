//! A secret callers present: the admin API's bearer token and the Redis-protocol
//! listener's `AUTH` password.

use sha2::{Digest, Sha256};

/// A secret token to compare callers' tokens with.
///
/// The comparison runs over SHA-256 digests in constant time, so that neither the
/// token's bytes nor its length leak through timing.
#[derive(Clone)]
pub struct Token([u8; 32]);

impl Token {
    pub fn new(token: &str) -> Token {
        Token(Sha256::digest(token.as_bytes()).into())
    }

    /// Whether `given` is the token.
    pub fn matches(&self, given: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(given).into();
        bool::from(subtle::ConstantTimeEq::ct_eq(&digest[..], &self.0[..]))
    }
}

//! Why a request was not decided, and the one mapping of those reasons to gRPC statuses.

use cellrate_store::StoreError;

/// A malformed request, and where: nothing was spent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The item at fault, if one is.
    pub item: Option<usize>,
    /// The field within the item (e.g. `.id`), or empty.
    pub field: &'static str,
    pub message: String,
}

impl Invalid {
    pub(super) fn at(item: usize, field: &'static str, message: String) -> Invalid {
        Invalid {
            item: Some(item),
            field,
            message,
        }
    }

    /// The message with the item named by `label` (front ends name items their way).
    pub fn describe(&self, label: impl Fn(usize) -> String) -> String {
        match self.item {
            Some(i) => format!("{}{}: {}", label(i), self.field, self.message),
            None => format!("items: {}", self.message),
        }
    }
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe(|i| format!("items[{i}]")))
    }
}

/// Why a request was not decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    #[error("{0}")]
    Invalid(Invalid),
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

impl From<DecideError> for tonic::Status {
    fn from(error: DecideError) -> tonic::Status {
        match error {
            DecideError::Invalid(invalid) => tonic::Status::invalid_argument(invalid.to_string()),
            DecideError::Store(e) => store_unavailable(&e),
        }
    }
}

/// The one mapping of a store failure to a gRPC status: UNAVAILABLE, never UNKNOWN. Envoy
/// treats UNKNOWN as "allow", while UNAVAILABLE lets its `failure_mode_deny` decide. A
/// full memory store is transient too.
pub fn store_unavailable(error: &StoreError) -> tonic::Status {
    tonic::Status::unavailable(format!("store: {error}"))
}

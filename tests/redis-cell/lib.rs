//! Empty: this package only pins redis-cell 0.2.2 (see Cargo.toml).

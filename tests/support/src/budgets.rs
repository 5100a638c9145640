//! Helpers of `budgets`'s tests that both tiers use (`tests/it/budgets.rs`,
//! `tests/full/budgets_envoy.rs`).

use crate::Served;
use cellrate::limits::config::LimitTable;
use std::path::Path;

pub async fn served(dir: &Path) -> Served {
    Served::with_limits(LimitTable::load_dir(dir).expect("the budgets load")).await
}

//! cellrate's Redis module (`crates/module`), built with cargo into `target/module/` once per
//! test run (a no-op when it is fresh), and loaded into a real redis-server or Valkey.
//! Its build needs libclang (redis-module's bindgen), which the test command installs.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use super::redis_cell::run;
use super::redis_server::{RedisCluster, RedisServer};

/// A redis-server with the module loaded.
pub fn redis_with_module() -> RedisServer {
    RedisServer::start_with_args(&["--loadmodule", module().to_str().unwrap()])
}

/// A Valkey server with the module loaded.
pub fn valkey_with_module() -> RedisServer {
    RedisServer::start_valkey_with_args(&["--loadmodule", module().to_str().unwrap()])
}

/// A 3-master Redis Cluster with the module loaded on every node.
pub fn cluster_with_module() -> RedisCluster {
    RedisCluster::start_with_args(&["--loadmodule", module().to_str().unwrap()])
}

/// The built module (`libcellrate_redis.so`).
pub fn module() -> PathBuf {
    static MODULE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    MODULE
        .get_or_init(build)
        .clone()
        .unwrap_or_else(|e| panic!("cellrate's Redis module could not be built: {e}"))
}

fn build() -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let root = std::path::Path::new(crate::ROOT);
    let target = root.join("target/module");
    run(Command::new(&cargo)
        .args([
            "build",
            "--locked",
            "-p",
            "cellrate-redis-module",
            "--manifest-path",
        ])
        .arg(root.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS"))?;
    let built = target.join("debug/libcellrate_redis.so");
    built
        .is_file()
        .then_some(built.clone())
        .ok_or_else(|| format!("cargo built no {}", built.display()))
}

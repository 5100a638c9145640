//! redis-cell 0.2.2, the Redis module whose `CL.THROTTLE` cellrate answers like: its source
//! fetched from crates.io (pinned by `tests/redis-cell/Cargo.lock`), built with cargo into
//! `target/redis-cell/`, once per test run, and loaded into a real redis-server.
//!
//! Every step is bounded in time: a fetch or build that takes longer than [`BUILD_TIMEOUT`]
//! is killed and fails the test with what cargo said.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::redis_server::RedisServer;

const BUILD_TIMEOUT: Duration = Duration::from_secs(300);

/// A redis-server with redis-cell loaded.
pub fn redis_with_cell() -> RedisServer {
    let module = module();
    RedisServer::start_with_args(&["--loadmodule", module.to_str().unwrap()])
}

/// The built module (`libredis_cell.so`), building it on first use.
pub fn module() -> PathBuf {
    static MODULE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    MODULE
        .get_or_init(build)
        .clone()
        .unwrap_or_else(|e| panic!("redis-cell could not be built: {e}"))
}

fn root() -> &'static Path {
    Path::new(crate::ROOT)
}

fn build() -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let pin = root().join("tests/redis-cell/Cargo.toml");
    let work = root().join("target/redis-cell");
    let built = work.join("target/release/libredis_cell.so");
    if built.is_file() {
        return Ok(built);
    }
    // The source, from crates.io into cargo's registry (a no-op once there).
    run(Command::new(&cargo)
        .args(["fetch", "--locked", "--manifest-path"])
        .arg(&pin))?;
    let metadata = run(Command::new(&cargo)
        .args(["metadata", "--locked", "--offline", "--format-version", "1"])
        .arg("--manifest-path")
        .arg(&pin))?;
    let metadata: serde_json::Value =
        serde_json::from_str(&metadata).map_err(|e| format!("cargo metadata: {e}"))?;
    let manifest = metadata["packages"]
        .as_array()
        .and_then(|packages| {
            packages
                .iter()
                .find(|p| p["name"] == "redis-cell" && p["version"] == "0.2.2")
        })
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("redis-cell 0.2.2 is not among the pinned packages")?;
    // Built from a copy (cargo's registry is read-only by convention), with the pinned
    // versions of its dependencies.
    let source = work.join("source");
    let _ = std::fs::remove_dir_all(&source);
    copy_dir(Path::new(manifest).parent().unwrap(), &source)
        .map_err(|e| format!("copying redis-cell's source: {e}"))?;
    std::fs::copy(
        root().join("tests/redis-cell/Cargo.lock"),
        source.join("Cargo.lock"),
    )
    .map_err(|e| format!("copying the lock file: {e}"))?;
    // A workspace of its own: the copy sits under cellrate's target/, inside cellrate's
    // workspace, which cargo would otherwise take it for a member of.
    let manifest = source.join("Cargo.toml");
    let own = std::fs::read_to_string(&manifest).map_err(|e| format!("{manifest:?}: {e}"))?;
    std::fs::write(&manifest, format!("{own}\n[workspace]\n"))
        .map_err(|e| format!("{manifest:?}: {e}"))?;
    run(Command::new(&cargo)
        .args(["build", "--release", "--offline", "--manifest-path"])
        .arg(source.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(work.join("target"))
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS"))?;
    built
        .is_file()
        .then_some(built.clone())
        .ok_or_else(|| format!("cargo built no {}", built.display()))
}

/// Runs `command` to its end within [`BUILD_TIMEOUT`]; its stdout, or why it failed.
pub(crate) fn run(command: &mut Command) -> Result<String, String> {
    let described = format!("{command:?}");
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{described}: {e}"))?;
    let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let deadline = Instant::now() + BUILD_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{described}: not done within {BUILD_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    if status.success() {
        Ok(out)
    } else {
        Err(format!("{described}: {status}\n{err}"))
    }
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

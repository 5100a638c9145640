//! The `cellrate` binary of this build run as a process: started on loopback port 0 with
//! the flags a test gives, its listeners read from its log, its log lines kept, and killed
//! when the test lets go of it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::ROOT;

/// The `cellrate` binary of this build: the path Cargo gives the tests that run it
/// (`CARGO_BIN_EXE_cellrate`, set when `cargo test` runs them), else the one beside the test
/// binary's `deps/` directory (a test binary run by hand).
pub fn cellrate_bin() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("CARGO_BIN_EXE_cellrate") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is in <target>/<profile>/deps/");
    profile.join(format!("cellrate{}", std::env::consts::EXE_SUFFIX))
}

/// A served process; killed on drop if still running.
pub struct Process {
    pub child: Child,
    pub listen: String,
    pub admin: String,
    pub metrics: String,
    /// The Redis-protocol listener (`off` unless `--resp-listen` was given).
    pub resp: String,
    /// Its log lines (JSON) up to the "cellrate serving" line.
    pub early: Vec<String>,
    /// Its log lines (JSON) after the "cellrate serving" line, as they come.
    pub logs: std::sync::mpsc::Receiver<String>,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `cellrate serve` (the example config) on loopback port 0 and reads the bound
/// ports from its log.
pub fn serve() -> Process {
    serve_with(&Path::new(ROOT).join("config"), &[])
}

/// Starts `cellrate serve` on `config` with `extra` flags, every listener on loopback
/// port 0, and reads the bound ports from its log.
pub fn serve_with(config: &Path, extra: &[&str]) -> Process {
    serve_command(Command::new(cellrate_bin()), config, extra)
}

/// As [`serve_with`], with `RUST_LOG` set to `filter`.
pub fn serve_logging(config: &Path, extra: &[&str], filter: &str) -> Process {
    let mut command = Command::new(cellrate_bin());
    command.env("RUST_LOG", filter);
    serve_command(command, config, extra)
}

/// As [`serve_with`], run as the user and group `uid` (the tests run as root).
#[cfg(unix)]
pub fn serve_as(uid: u32, config: &Path, extra: &[&str]) -> Process {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(cellrate_bin());
    command.uid(uid).gid(uid);
    serve_command(command, config, extra)
}

/// As [`serve_with`], with at most `nofile` open files (set by the shell, soft and hard).
pub fn serve_with_nofile(config: &Path, extra: &[&str], nofile: u32) -> Process {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
        .arg(cellrate_bin());
    serve_command(command, config, extra)
}

fn serve_command(mut command: Command, config: &Path, extra: &[&str]) -> Process {
    let mut child = command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .args(["--log-format", "json", "--config"])
        .arg(config)
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .expect("cellrate starts");
    let lines = stderr_lines(&mut child);
    let mut early = Vec::new();
    let announced = (0..10_000)
        .map_while(|_| lines.recv_timeout(Duration::from_secs(20)).ok())
        .inspect(|line| early.push(line.clone()))
        .find_map(|line| {
            let v = serde_json::from_str::<Value>(&line).ok()?;
            let f = &v["fields"];
            (f["message"] == "cellrate serving").then(|| {
                let field = |name: &str| f[name].as_str().unwrap().to_string();
                (
                    field("listen"),
                    field("admin"),
                    field("metrics"),
                    field("resp"),
                )
            })
        });
    let Some((listen, admin, metrics, resp)) = announced else {
        // Not left running behind the failing test.
        let _ = child.kill();
        let _ = child.wait();
        panic!("cellrate logs its listeners (the log filter must let its info line through)");
    };
    Process {
        child,
        listen,
        admin,
        metrics,
        resp,
        early,
        logs: lines,
    }
}

/// The lines `child` writes to its (piped) stderr, read by a thread of their own until the
/// child closes it.
pub fn stderr_lines(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let stderr = child.stderr.take().expect("stderr is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Read to the end even when nobody listens any more, so that the child never blocks
        // (or fails) writing its logs.
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

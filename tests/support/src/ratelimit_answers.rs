//! Helpers of `ratelimit_answers`'s tests that both tiers use
//! (`tests/it/ratelimit_answers.rs`; in tests/full, the upstream suite and
//! `memcache.rs`).

use crate::{descriptor, stderr_lines};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf as pbw;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tonic::transport::Channel;

pub const ANOTHER: &str = "
domain: another
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: key4
    rate_limit: {unit: day, requests_per_unit: 20}
";

pub fn runtime(files: &[(&str, &str)]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("current/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    for (name, text) in files {
        std::fs::write(config.join(name), text).unwrap();
    }
    root
}

/// The binary run as `ratelimit` in `root` (its runtime under `current/ratelimit/config`)
/// with `vars` beside the test's own; the child and its gRPC address.
pub fn start(root: &Path, vars: &[(&str, &str)]) -> (Running, String) {
    let serving = start_serving(root, vars);
    (serving.child, serving.listen)
}

/// A started `ratelimit`: the child, its gRPC address and its metrics listener's, and the
/// lines it logs after its serving line.
pub struct Serving {
    pub child: Running,
    pub listen: String,
    pub metrics: String,
    /// The admin listener's address.
    pub admin: String,
    pub log: std::sync::mpsc::Receiver<String>,
}

/// [`start`], with the metrics listener's address from the serving line.
pub fn start_serving(root: &Path, vars: &[(&str, &str)]) -> Serving {
    start_serving_with(root, &[], vars)
}

/// [`start_serving`] with `args` on the command line (a deployment's `args:`).
pub fn start_serving_with(root: &Path, args: &[&str], vars: &[(&str, &str)]) -> Serving {
    let bin = root.join("ratelimit");
    if !bin.exists() {
        // Tests starting in parallel in one root: the first link made stands.
        let _ = std::os::unix::fs::symlink(crate::cellrate_bin(), &bin);
    }
    let mut command = Command::new(&bin);
    command
        .env_clear()
        .env("RUNTIME_ROOT", root.join("current"))
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", "0")
        .env("HOST", "127.0.0.1")
        .env("PORT", "0")
        .env("USE_STATSD", "false")
        .env("LOG_FORMAT", "json")
        .env("CELLRATE_ADMIN_LISTEN", "127.0.0.1:0");
    command.args(args).envs(vars.iter().copied());
    let mut child = Running(command.stderr(Stdio::piped()).spawn().unwrap());
    let lines = stderr_lines(&mut child.0);
    let mut seen = Vec::new();
    for line in (0..1_000).map_while(|_| lines.recv_timeout(Duration::from_secs(20)).ok()) {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["fields"]["message"] == "cellrate serving" {
            let field = |name: &str| v["fields"][name].as_str().unwrap_or_default().to_string();
            return Serving {
                listen: field("listen"),
                metrics: field("metrics"),
                admin: field("admin"),
                child,
                log: lines,
            };
        }
        seen.push(line);
    }
    drop(child);
    panic!("no serving line; the log: {seen:#?}");
}

/// Asks, and checks every status's `duration_until_reset` is whole seconds computed as
/// envoyproxy/ratelimit computes it (`unit - now % unit`, now read before or after).
pub async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    r: RateLimitRequest,
    units: &[i64],
) -> RateLimitResponse {
    let before = unix_seconds();
    let response = c.should_rate_limit(r).await.unwrap().into_inner();
    let after = unix_seconds();
    for (status, unit) in response.statuses.iter().zip(units) {
        let Some(d) = &status.duration_until_reset else {
            continue;
        };
        let allowed = [unit - before % unit, unit - after % unit];
        assert!(
            d.nanos == 0 && allowed.contains(&d.seconds),
            "{d:?} is not one of {allowed:?}"
        );
    }
    response
}

/// Waits, when fewer than 8 seconds are left in the current minute, for the next one: the
/// scenarios count in minute and hour windows and must not straddle their end.
pub fn clear_of_a_minute_end() {
    let left = 60 - unix_seconds() % 60;
    if left < 8 {
        std::thread::sleep(Duration::from_millis(left as u64 * 1_000 + 200));
    }
}

pub async fn client(listen: &str) -> RateLimitServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{listen}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    RateLimitServiceClient::new(channel)
}

/// envoyproxy/ratelimit's request: `entries` per descriptor, hits_addend 1.
pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors: descriptors.iter().map(|e| descriptor(e)).collect(),
        hits_addend: 1,
    }
}

/// envoyproxy/ratelimit's `newDescriptorStatus`: no name, the reset as answered.
pub fn status(
    code: Code,
    n: u32,
    unit: Unit,
    remaining: u32,
    reset: &DescriptorStatus,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: String::new(),
            requests_per_unit: n,
            unit: unit as i32,
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(pbw::Duration {
            seconds: reset
                .duration_until_reset
                .as_ref()
                .map_or(-1, |d| d.seconds),
            nanos: 0,
        }),
        ..Default::default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child killed when dropped, so that a failed assertion leaves no process behind.
pub struct Running(Child);

/// The binary run as `ratelimit` over `root` (limits in `root/config`), with upstream's
/// variables for a memory store on loopback ports the kernel chooses, then `vars` (none of
/// cellrate's own unless `vars` gives it): the child, the `cellrate serving` line's
/// fields, and every line it logged before that one.
pub fn ratelimit_at(
    root: &Path,
    vars: &[(&str, &str)],
) -> (Running, serde_json::Value, Vec<String>) {
    let bin = root.join("ratelimit");
    if !bin.exists() {
        // Tests starting in parallel in one root: the first link made stands.
        let _ = std::os::unix::fs::symlink(crate::cellrate_bin(), &bin);
    }
    let mut child = Command::new(&bin)
        .env_clear()
        .env("RUNTIME_ROOT", root)
        .env("BACKEND_TYPE", "memory")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", "0")
        .env("HOST", "127.0.0.1")
        .env("PORT", "0")
        .env("LOG_FORMAT", "json")
        .envs(vars.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = stderr_lines(&mut child);
    let child = Running(child);
    let mut seen = Vec::new();
    for line in (0..1_000).map_while(|_| lines.recv_timeout(Duration::from_secs(10)).ok()) {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["fields"]["message"] == "cellrate serving" {
            return (child, v["fields"].clone(), seen);
        }
        seen.push(line);
    }
    panic!("no serving line: {seen:#?}");
}

pub fn unix_seconds() -> i64 {
    use cellrate::clock::{Clock, SystemClock, SECOND};
    SystemClock.now() / SECOND
}

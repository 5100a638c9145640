//! `--grpc-uds` (envoyproxy/ratelimit's `GRPC_UDS`): the decision listener on a Unix
//! socket, through the real binary: a tonic client over the socket decides; the socket is
//! made 0660 and removed at shutdown; a stale socket is replaced, any other file at the
//! path is refused (exit 78) and left intact; a flood of connections over the socket is
//! held to the connection bound.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{item, serve_with, stderr_lines};
use cellrate::proto::v1 as pb;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tonic::transport::Channel;

fn config() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config"))
}

/// A tonic connector that dials the Unix socket at its path, whatever the URI.
#[derive(Clone)]
struct Dial(PathBuf);

impl tower_service::Service<http::Uri> for Dial {
    type Response = hyper_util::rt::TokioIo<UnixStream>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move {
            Ok(hyper_util::rt::TokioIo::new(
                UnixStream::connect(path).await?,
            ))
        })
    }
}

/// SIGTERM and the exit, off the test's runtime, which keeps serving the test's clients
/// (so that they close their connections at the GOAWAY and the drain ends at once).
async fn terminate(process: crate::common::Process) {
    tokio::task::spawn_blocking(move || crate::process_ops::terminate(process))
        .await
        .unwrap();
}

fn client(path: &Path) -> pb::rate_limiter_client::RateLimiterClient<Channel> {
    let channel = tonic::transport::Endpoint::from_static("http://cellrate")
        .connect_with_connector_lazy(Dial(path.to_path_buf()));
    pb::rate_limiter_client::RateLimiterClient::new(channel)
}

/// One Check over `client`, within `within`: `None` if no answer came by then.
async fn check(
    client: &mut pb::rate_limiter_client::RateLimiterClient<Channel>,
    within: Duration,
) -> Option<pb::CheckResponse> {
    let request = pb::CheckRequest {
        items: vec![item("ApiRequestsPerKey", "unix", Some(1))],
        ..Default::default()
    };
    let answer = tokio::time::timeout(within, client.check(request))
        .await
        .ok()?;
    Some(answer.expect("answered without error").into_inner())
}

#[tokio::test]
async fn a_client_over_the_socket_decides_and_the_socket_goes_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratelimit.sock");
    let process = serve_with(config(), &["--grpc-uds", path.to_str().unwrap()]);
    assert_eq!(process.listen, format!("unix:{}", path.display()));
    let mode = std::fs::symlink_metadata(&path)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660, "mode {mode:o}");
    let answer = check(&mut client(&path), Duration::from_secs(10)).await;
    let answer = answer.expect("answered over the socket");
    assert!(answer.items[0].allowed, "{answer:?}");
    terminate(process).await;
    assert!(!path.exists(), "the socket is removed at shutdown");
}

#[tokio::test]
async fn a_stale_socket_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratelimit.sock");
    // A socket nobody listens on any more, as a crash leaves it.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let process = serve_with(config(), &["--grpc-uds", path.to_str().unwrap()]);
    let answer = check(&mut client(&path), Duration::from_secs(10)).await;
    assert!(answer.is_some(), "answered over the new socket");
    terminate(process).await;
}

/// A socket a running server answers on is not taken over: a second server stops (exit
/// 78), the first keeps its socket and answers.
#[tokio::test]
async fn a_live_socket_is_not_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratelimit.sock");
    let first = serve_with(config(), &["--grpc-uds", path.to_str().unwrap()]);
    let (code, log) = run_until_exit(&path, false);
    assert_eq!(code, Some(78), "{log}");
    let expected = format!(
        "{}: a server is listening on this socket already",
        path.display()
    );
    assert!(log.contains(&expected), "{expected:?} not in {log}");
    let answer = check(&mut client(&path), Duration::from_secs(10)).await;
    assert!(
        answer.is_some(),
        "the first server still answers on its socket"
    );
    terminate(first).await;
}

/// `cellrate serve --grpc-uds PATH` (or, with `as_ratelimit`, `ratelimit` with
/// `GRPC_UDS=PATH`) until it exits: its exit code and its log.
fn run_until_exit(path: &Path, as_ratelimit: bool) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut command = match as_ratelimit {
        false => {
            let mut command = Command::new(env!("CARGO_BIN_EXE_cellrate"));
            command.args(["serve", "--listen", "127.0.0.1:0", "--admin-listen"]);
            command.args(["127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]);
            command
                .arg("--grpc-uds")
                .arg(path)
                .arg("--config")
                .arg(config());
            command
        }
        true => {
            std::fs::create_dir(dir.path().join("config")).unwrap();
            let bin = dir.path().join("ratelimit");
            std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_cellrate"), &bin).unwrap();
            let mut command = Command::new(&bin);
            command.env_clear().env("BACKEND_TYPE", "memory");
            command
                .env("RUNTIME_ROOT", dir.path())
                .env("GRPC_UDS", path);
            command.env("HOST", "127.0.0.1").env("PORT", "0");
            command.env("CELLRATE_ADMIN_LISTEN", "127.0.0.1:0");
            command
        }
    };
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    let lines = stderr_lines(&mut child);
    let log: Vec<String> = (0..1_000)
        .map_while(|_| lines.recv_timeout(Duration::from_secs(20)).ok())
        .collect();
    let status = child.wait().unwrap();
    (status.code(), log.join("\n"))
}

#[tokio::test]
async fn another_file_at_the_path_is_refused_and_left_intact() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("precious.txt");
    std::fs::write(&file, "do not remove").unwrap();
    let link = dir.path().join("link.sock");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    for (path, what) in [(&file, "regular file"), (&link, "symbolic link")] {
        for as_ratelimit in [false, true] {
            let (code, log) = run_until_exit(path, as_ratelimit);
            assert_eq!(code, Some(78), "{what}, as ratelimit {as_ratelimit}: {log}");
            let expected = format!("{}: exists and is not a socket (a {what})", path.display());
            assert!(log.contains(&expected), "{expected:?} not in {log}");
        }
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "do not remove");
    let target = std::fs::read_link(&link).unwrap();
    assert_eq!(target, file, "the symlink is left as it was");
}

/// The attacker opens connections over the socket and holds them (each has sent the
/// HTTP/2 preface, so no handshake timeout closes it). At `--max-connections 8` the ninth
/// client waits in the backlog, unanswered, until one of them is closed.
#[tokio::test]
async fn a_flood_of_connections_over_the_socket_is_held_to_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratelimit.sock");
    let extra = [
        "--grpc-uds",
        path.to_str().unwrap(),
        "--max-connections",
        "8",
    ];
    let process = serve_with(config(), &extra);
    let mut flood = Vec::new();
    for _ in 0..50 {
        let mut conn = UnixStream::connect(&path).await.unwrap();
        crate::common::h2_raw::start(&mut conn).await;
        flood.push(conn);
    }
    let mut late = client(&path);
    let answer = check(&mut late, Duration::from_millis(500)).await;
    assert!(answer.is_none(), "answered beyond the bound: {answer:?}");
    // The flood gives up: the bound frees, the waiting client is answered.
    for mut conn in flood {
        let _ = conn.shutdown().await;
    }
    let answer = check(&mut late, Duration::from_secs(10)).await;
    assert!(answer.is_some(), "answered once the flood has gone");
    terminate(process).await;
}

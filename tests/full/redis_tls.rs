//! TLS to Redis with a self-signed server certificate trusted directly, made as upstream
//! ratelimit's Makefile makes it (`openssl req -x509`, CN and SAN `localhost`) and named as
//! the CA (`REDIS_TLS_CACERT` / `--redis-tls-ca`): accepted for its own name, and nothing
//! else is (another self-signed certificate for the same name, the trusted one for another
//! host name).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::common::redis_server::RedisServer;
use cellrate::clock::{FakeClock, Nanos, SECOND};
use cellrate::gcra::{Limit, Mode};
use cellrate::limits::names::BucketKey;
use cellrate::observe::metrics::Metrics;
use cellrate::store::redis::{RedisClock, RedisSettings, RedisStore, RedisTls};
use cellrate::store::{Store, StoreError, StoreItem};

const T0: Nanos = 1_700_000_000 * SECOND;

/// upstream's `bootstrap_redis_tls` certificate (a 2048-bit key instead of 4096, for time):
/// writes `{stem}.pem` and `{stem}.key` into `dir`.
pub(crate) fn upstream_self_signed(dir: &Path, stem: &str) {
    let status = Command::new("openssl")
        .args([
            "req", "-new", "-newkey", "rsa:2048", "-days", "365", "-nodes", "-x509",
        ])
        .args(["-subj", "/C=US/ST=Denial/L=Springfield/O=Dis/CN=localhost"])
        .args(["-addext", "subjectAltName = DNS:localhost"])
        .arg("-keyout")
        .arg(dir.join(format!("{stem}.key")))
        .arg("-out")
        .arg(dir.join(format!("{stem}.pem")))
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success(), "openssl req -x509 failed");
}

fn store_for(url: &str, ca: &Path) -> Arc<RedisStore> {
    let settings = RedisSettings {
        url: Some(url.to_string()),
        timeout: Duration::from_millis(500),
        clock: RedisClock::Local,
        tls: RedisTls {
            ca: Some(std::fs::read(ca).unwrap()),
            client: None,
        },
        ..RedisSettings::default()
    };
    let clock = FakeClock::new(T0);
    RedisStore::new(settings, Arc::new(clock), Metrics::new()).unwrap()
}

fn spend() -> StoreItem {
    StoreItem {
        key: BucketKey::new(100, "tls"),
        limit: Limit::new(2, 1, 10 * SECOND).unwrap(),
        cost: 1,
        mode: Mode::CheckAndSpend,
        lease: None,
    }
}

/// Two certificates made as upstream makes them (trusted.pem, other.pem, both for
/// localhost) in a temporary directory.
fn two_certificates() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    upstream_self_signed(dir.path(), "trusted");
    upstream_self_signed(dir.path(), "other");
    dir
}

/// A TLS redis-server presenting `{stem}.pem`.
fn serving(dir: &Path, stem: &str) -> (RedisServer, u16) {
    RedisServer::start_tls_no_client_auth(
        &dir.join(format!("{stem}.pem")),
        &dir.join(format!("{stem}.key")),
    )
}

#[tokio::test]
async fn a_self_signed_certificate_named_as_the_ca_is_trusted() {
    let dir = two_certificates();
    let (server, port) = serving(dir.path(), "trusted");
    let good = store_for(
        &format!("rediss://localhost:{port}"),
        &dir.path().join("trusted.pem"),
    );
    for expected in [true, true, false] {
        let outcome = good.spend(&[spend()]).await.expect("decided over TLS");
        assert_eq!(outcome.allowed, expected);
    }
    assert_eq!(server.cli(&["DBSIZE"]).unwrap().trim(), "1");

    // A connection Redis drops is made again: the call that finds it broken fails, a later
    // one decides (denied: the bucket is still spent).
    let killed = server.cli(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    assert!(killed.unwrap().trim().parse::<u32>().unwrap() >= 1);
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        let outcome = good.spend(&[spend()]).await;
        let decided = outcome.is_ok();
        outcomes.push(outcome);
        if decided {
            break;
        }
    }
    assert!(
        matches!(outcomes.last(), Some(Ok(o)) if !o.allowed),
        "{outcomes:?}"
    );
}

#[tokio::test]
async fn another_self_signed_certificate_for_the_same_name_is_refused() {
    let dir = two_certificates();
    let (server, port) = serving(dir.path(), "other");
    let url = format!("rediss://localhost:{port}");
    // The server is reachable: trusting its own certificate decides.
    let control = store_for(&url, &dir.path().join("other.pem"));
    control.spend(&[spend()]).await.expect("decided over TLS");
    server.cli(&["FLUSHALL"]).unwrap();

    let impostor = store_for(&url, &dir.path().join("trusted.pem"));
    refused("another self-signed certificate for localhost", impostor).await;
    assert_eq!(server.cli(&["DBSIZE"]).unwrap().trim(), "0");
}

#[tokio::test]
async fn the_trusted_certificate_for_another_host_name_is_refused() {
    let dir = two_certificates();
    let (server, port) = serving(dir.path(), "trusted");
    let trusted = dir.path().join("trusted.pem");
    // It names only localhost; 127.0.0.1 is the same server under a name it does not bear.
    let wrong_name = store_for(&format!("rediss://127.0.0.1:{port}"), &trusted);
    refused("trusted certificate, wrong host name", wrong_name).await;
    assert_eq!(server.cli(&["DBSIZE"]).unwrap().trim(), "0");
}

async fn refused(what: &str, store: Arc<RedisStore>) {
    let result = store.spend(&[spend()]).await;
    eprintln!("{what}: {result:?}");
    assert!(
        matches!(
            result,
            Err(StoreError::Backend { .. } | StoreError::Timeout { .. })
        ),
        "{what}: {result:?}"
    );
}

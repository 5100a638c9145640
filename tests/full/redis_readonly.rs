//! `--redis-reconnect-on-readonly` (envoyproxy/ratelimit's
//! REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR): the Redis at the URL turns into a replica
//! (`REPLICAOF`) while the address moves to the new primary, as a failover behind DNS, a
//! Service or a proxy does. Real redis-servers behind a loopback proxy whose target is
//! switched, and the store over them.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::redis_server::RedisServer;
use crate::common::spend_item as spend;
use cellrate::clock::{FakeClock, Nanos, SECOND};
use cellrate::gcra::Limit;
use cellrate::observe::metrics::Metrics;
use cellrate::store::redis::{RedisClock, RedisSettings, RedisStore};
use cellrate::store::Store;

const T0: Nanos = 1_700_000_000 * SECOND;

/// A loopback proxy: each connection it accepts goes to the port `target` holds then.
/// Stops with the test's runtime.
async fn proxy(target: Arc<AtomicU16>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        // Bounded: the test makes a handful of connections.
        for _ in 0..64 {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let to = target.load(Ordering::SeqCst);
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    port
}

fn port_of(server: &RedisServer) -> u16 {
    let url = server.url();
    url.rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

/// Spends once on `store`: whether it was answered, and the error's words when not.
async fn once(store: &RedisStore, id: &str) -> Result<(), String> {
    let limit = Limit::new(100, 100, SECOND).unwrap();
    store
        .spend(&[spend(id, limit, 1)])
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// With the flag, the call answered READONLY fails and the next one reaches the new
/// primary through the same URL; without it, every call stays on the old connection to
/// the replica and fails READONLY.
#[tokio::test]
async fn a_readonly_answer_reconnects_through_the_url_only_when_asked() {
    for reconnect in [true, false] {
        let (old, new) = (RedisServer::start(), RedisServer::start());
        let target = Arc::new(AtomicU16::new(port_of(&old)));
        let url = format!("redis://127.0.0.1:{}", proxy(target.clone()).await);
        let settings = RedisSettings {
            url: Some(url),
            timeout: Duration::from_millis(500),
            clock: RedisClock::Local,
            reconnect_on_readonly: reconnect,
            ..RedisSettings::default()
        };
        let clock = Arc::new(FakeClock::new(T0));
        let store = RedisStore::new(settings, clock, Metrics::new()).unwrap();
        assert_eq!(once(&store, "before").await, Ok(()));
        // The failover: the old primary follows the new one; the address moves.
        let replicaof = ["REPLICAOF", "127.0.0.1", &port_of(&new).to_string()];
        assert_eq!(old.cli(&replicaof).unwrap().trim(), "OK");
        target.store(port_of(&new), Ordering::SeqCst);
        let first = once(&store, "after").await;
        assert!(
            first.as_ref().is_err_and(|e| e.contains("ReadOnly")),
            "{reconnect}: {first:?}"
        );
        let mut later = Vec::new();
        for _ in 0..3 {
            later.push(once(&store, "after").await);
        }
        match reconnect {
            true => assert!(later.iter().all(Result::is_ok), "{later:?}"),
            false => assert!(later.iter().all(Result::is_err), "{later:?}"),
        }
        if reconnect {
            // Spent on the new primary, not the replica.
            let keys = new.cli(&["DBSIZE"]).unwrap();
            assert!(keys.trim().parse::<u64>().unwrap() >= 1, "{keys}");
        }
    }
}

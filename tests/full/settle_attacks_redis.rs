//! Settlements played by an attacker on a real redis-server (on the memory store: the fast
//! tier's `tests/it/settle_attacks.rs`).

use crate::common::redis_server::RedisServer;
use crate::common::settle::{connect, settle};
use crate::common::settle_attacks::{check, limits};
use crate::common::{item, serve_with};
use tonic::Code;

/// #46 item 13: a Settle racing its own Check on the Redis store used to claim the record
/// before the Check was decided, refunding into an empty bucket what the Check then spent
/// (before: 199 of 200 Checks allowed on an empty bucket).
#[tokio::test]
async fn a_settle_racing_its_check_claims_nothing() {
    let redis = RedisServer::start();
    let dir = limits();
    let url = redis.url();
    let flags = [
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--redis-timeout-ms",
        "2000",
    ];
    let server = serve_with(dir.path(), &flags);
    let (mut c, settler) = (connect(&server.listen).await, connect(&server.listen).await);
    let all = item("TokensPerTenant", "race", Some(10_000));
    assert!(check(&mut c, "", all).await.unwrap(), "the bucket emptied");
    let races = (0..200).map(|i| {
        let (mut c, mut settler) = (c.clone(), settler.clone());
        tokio::spawn(async move {
            let id = format!("race-{i}");
            let one = item("TokensPerTenant", "race", Some(1));
            let (checked, settled) =
                tokio::join!(check(&mut c, &id, one), settle(&mut settler, &id, &[0]));
            (checked.expect("checked"), settled.map_err(|e| e.code()))
        })
    });
    let (mut allowed, mut settled) = (0, 0);
    for race in races.collect::<Vec<_>>() {
        let (checked, answer) = race.await.unwrap();
        allowed += u32::from(checked);
        match answer {
            Ok(_) => settled += 1,
            Err(code) => assert!(
                matches!(code, Code::Unavailable | Code::NotFound),
                "{code:?}"
            ),
        }
    }
    assert_eq!((allowed, settled), (0, 0), "Checks allowed, Settles made");
}

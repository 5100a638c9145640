//! `GCRA` and `RL.THROTTLE` on the Redis-protocol listener with the Redis store, on a real
//! redis-server and Valkey (the commands' answers are the fast tier's `tests/it/resp_gcra.rs`).

use crate::common::resp_client::RespClient;

/// With `--store redis` (and on Valkey) the three commands share one bucket in the store,
/// decided on the store's clock: the numbers are those of the memory store.
#[cfg(feature = "redis")]
#[test]
fn gcra_and_rl_throttle_share_the_bucket_in_redis_and_valkey() {
    use crate::common::redis_server::RedisServer;
    for store in [RedisServer::start(), RedisServer::start_valkey()] {
        let server = crate::common::serve_with(
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config")),
            &[
                "--resp-listen",
                "127.0.0.1:0",
                "--store",
                "redis",
                "--redis-url",
                &store.url(),
                "--redis-timeout-ms",
                "1000",
            ],
        );
        let mut c = RespClient::connect(&server.resp);
        // 10 per hour, burst 5: 360 s apart, so the wall clock moves nothing here.
        let gcra = ["GCRA", "shared", "5", "10", "3600"];
        assert_eq!(c.call(&gcra).integers(), [0, 6, 5, -1, 360]);
        let rl = ["RL.THROTTLE", "shared", "5", "10", "3600", "3"];
        assert_eq!(c.call(&rl).integers()[..3], [0, 6, 2]);
        let cl = ["CL.THROTTLE", "shared", "5", "10", "3600", "2"];
        assert_eq!(c.call(&cl).integers()[..3], [0, 6, 0]);
        assert_eq!(c.call(&gcra).integers(), [1, 6, 0, 360, 2160]);
        let peek = ["GCRA", "shared", "5", "10", "3600", "TOKENS", "0"];
        assert_eq!(c.call(&peek).integers(), [0, 6, 0, -1, 2160]);
    }
}

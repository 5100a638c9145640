//! Upstream's TestBasicConfig_ExtraTags: with `EXTRA_TAGS` (`foo:bar,a:b`) one request of
//! `basic`/`key1` is counted in `ratelimit.service.rate_limit.basic.key1.total_hits` with
//! both tags, and the one configuration load in `config_load_success` with both tags.
//! Here the tags are labels on every series: upstream's two assertions read the series
//! that carry them (the start's load is `cellrate_config_info`, 1 with the limits in
//! force: cellrate's reloads counter counts reloads only).

use super::base::{start_all, unique, upstream_runtime, Variant};
use crate::common::http_get_async;
use crate::common::ratelimit_answers::request;
use crate::common::redis_server::RedisServer;

/// The value of the one sample named `name` whose labels include every one of `labels`
/// (each `k="v"`), or `None`.
fn labelled(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let mut found = text.lines().filter(|line| {
        line.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('{'))
            && labels.iter().all(|l| line.contains(l))
    });
    let line = found.next()?;
    assert!(found.next().is_none(), "one {name} with {labels:?}");
    line.rsplit_once(' ')?.1.parse().ok()
}

#[tokio::test]
async fn test_basic_config_extra_tags() {
    let redis = RedisServer::start();
    let url = format!("127.0.0.1:{}", redis.port);
    let backend = [("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", url.as_str())];
    let tags = [("EXTRA_TAGS", "foo:bar,a:b")];
    let variant = Variant::new("TestBasicConfig_ExtraTags", &backend, &tags);
    let root = upstream_runtime();
    let started = start_all(root.path(), &[], &[variant]);
    let u = &started[0];
    let value = unique("foo", &u.variant);
    let mut c = u.client().await;
    c.should_rate_limit(request("basic", &[&[("key1", &value)]]))
        .await
        .expect("ShouldRateLimit");
    let addr = u.serving.metrics.parse().unwrap();
    let (code, text) = http_get_async(addr, "/metrics").await;
    assert_eq!(code, 200);
    let with_tags = ["foo=\"bar\"", "a=\"b\""];
    // key1HitCounter: NewCounterWithTags("...basic.key1.total_hits", ExtraTags) == 1.
    let hits = [
        &with_tags[..],
        &["key=\"basic.key1\"", "stat=\"total_hits\""],
    ]
    .concat();
    assert_eq!(
        labelled(&text, "cellrate_ratelimit_hits_total", &hits),
        Some(1.0),
        "{text}"
    );
    // configLoadStat: NewCounterWithTags("ratelimit.service.config_load_success",
    // ExtraTags) == 1, the files loaded once at start. cellrate's reloads counter does not
    // count the start's load; the limits in force are `cellrate_config_info` at 1.
    let in_force = labelled(&text, "cellrate_config_info", &with_tags);
    assert_eq!(in_force, Some(1.0), "{text}");
}

//! Temporary overrides (admin `SetOverride`, `ClearOverride`, `ListOverrides`) on a served
//! cellrate with a fake clock: precedence over the files, what `Inspect` says, expiry,
//! reloads, bounds; and the CLI's `admin override` commands against a process.

use std::time::Duration;

use cellrate::clock::SECOND;
use cellrate::limits::config::LimitTable;
use cellrate::proto::v1 as pb;
use cellrate::server::Settings;
use tonic::Code;

use crate::common::{item, poll_until, remaining, serve, watching, Served};

fn secs(n: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: n,
        nanos: 0,
    })
}

fn deny(name: &str, id: &str, ttl: i64) -> pb::SetOverrideRequest {
    pb::SetOverrideRequest {
        name: name.into(),
        id: id.into(),
        deny: true,
        ttl: secs(ttl),
        comment: "ticket 9".into(),
        author: "ops".into(),
        ..Default::default()
    }
}

async fn allowed(s: &mut Served, name: &str, id: &str) -> bool {
    let r = s
        .decisions
        .check(pb::CheckRequest {
            items: vec![item(name, id, None)],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    r.overall.unwrap().allowed
}

async fn listed(s: &mut Served) -> Vec<(String, String)> {
    s.admin
        .list_overrides(pb::ListOverridesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .map(|e| (e.name, e.id))
        .collect()
}

#[tokio::test]
async fn a_temporary_override_wins_until_it_expires_or_is_cleared() {
    let mut s = Served::start(None).await;
    assert!(allowed(&mut s, "NewOrdersPerAccount", "42").await);
    let set = s
        .admin
        .set_override(deny("NewOrdersPerAccount", "0042", 60))
        .await
        .unwrap()
        .into_inner()
        .entry
        .unwrap();
    assert_eq!((set.id.as_str(), set.deny), ("42", true), "canonical id");
    assert!(!allowed(&mut s, "NewOrdersPerAccount", "42").await);
    let inspected = s
        .admin
        .inspect(pb::InspectRequest {
            items: vec![item("NewOrdersPerAccount", "42", None)],
        })
        .await
        .unwrap()
        .into_inner();
    let source = inspected.items[0].source.clone().unwrap();
    assert_eq!(source.kind(), pb::limit_source::Kind::RuntimeOverride);
    assert_eq!(
        (source.comment.as_str(), source.author.as_str()),
        ("ticket 9", "ops")
    );
    assert_eq!(source.expires_in, secs(60));

    // A limit of its own on a configured key: 2 per second instead of 10.
    let limit = pb::SetOverrideRequest {
        name: "ApiRequestsPerKey".into(),
        id: "key-o".into(),
        burst: 2,
        count: 2,
        period: secs(1),
        ttl: secs(30),
        ..Default::default()
    };
    s.admin.set_override(limit).await.unwrap();
    assert!(allowed(&mut s, "ApiRequestsPerKey", "key-o").await);
    assert!(allowed(&mut s, "ApiRequestsPerKey", "key-o").await);
    assert!(!allowed(&mut s, "ApiRequestsPerKey", "key-o").await);
    assert_eq!(
        listed(&mut s).await,
        [
            ("ApiRequestsPerKey".to_string(), "key-o".to_string()),
            ("NewOrdersPerAccount".to_string(), "42".to_string()),
        ]
    );

    // 31 s on, the API key's has expired; clearing ends the other at once.
    s.clock.advance(31 * SECOND);
    assert_eq!(
        listed(&mut s).await,
        [("NewOrdersPerAccount".to_string(), "42".to_string())]
    );
    assert_eq!(remaining(&mut s, "ApiRequestsPerKey", "key-o").await, 10);
    let cleared = s
        .admin
        .clear_override(pb::ClearOverrideRequest {
            name: "NewOrdersPerAccount".into(),
            id: "42".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(cleared.cleared);
    assert!(allowed(&mut s, "NewOrdersPerAccount", "42").await);
    assert!(listed(&mut s).await.is_empty());
    let metrics = crate::common::http_get_async(s.metrics_addr, "/metrics")
        .await
        .1;
    for (action, n) in [("set", 2.0), ("clear", 1.0)] {
        let series = format!("cellrate_runtime_override_changes_total{{action=\"{action}\"}}");
        assert_eq!(
            crate::common::sample(&metrics, &series),
            Some(n),
            "{series}"
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn reloads_leave_temporary_overrides_in_force() {
    let dir = tempfile::tempdir().unwrap();
    for file in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/config")).unwrap() {
        let file = file.unwrap();
        std::fs::copy(file.path(), dir.path().join(file.file_name())).unwrap();
    }
    let limits = LimitTable::load_dir(dir.path()).unwrap();
    let settings = watching(dir.path(), Duration::from_millis(50));
    let mut s = Served::with_settings(limits, settings).await;
    s.admin
        .set_override(deny("NewOrdersPerAccount", "7", 600))
        .await
        .unwrap();
    let defaults = dir.path().join("defaults.yaml");
    let text = std::fs::read_to_string(&defaults).unwrap();
    std::fs::write(
        &defaults,
        text.replace("burst: 300\n  count: 300", "burst: 50\n  count: 50"),
    )
    .unwrap();
    let burst = poll_until(
        Duration::from_secs(10),
        async || remaining(&mut s, "NewOrdersPerAccount", "8").await,
        |left| *left == 50,
    )
    .await;
    assert_eq!(burst, 50, "the reload took effect");
    assert!(
        !allowed(&mut s, "NewOrdersPerAccount", "7").await,
        "still denied"
    );
    assert_eq!(listed(&mut s).await.len(), 1);
    s.stop().await;
}

#[tokio::test]
async fn bad_overrides_are_invalid_argument_and_change_nothing() {
    let settings = Settings {
        max_runtime_overrides: 1,
        max_override_ttl: 3_600 * SECOND,
        ..Settings::default()
    };
    let limits =
        LimitTable::load_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/config").as_ref()).unwrap();
    let mut s = Served::with_settings(limits, settings).await;
    s.admin
        .set_override(deny("NewOrdersPerAccount", "1", 60))
        .await
        .unwrap();
    let both = pb::SetOverrideRequest {
        unlimited: true,
        ..deny("NewOrdersPerAccount", "2", 60)
    };
    let no_ttl = pb::SetOverrideRequest {
        ttl: None,
        ..deny("NewOrdersPerAccount", "2", 60)
    };
    let zero_limit = pb::SetOverrideRequest {
        deny: false,
        burst: 0,
        count: 5,
        period: secs(1),
        ..deny("NewOrdersPerAccount", "2", 60)
    };
    let cases = [
        (
            deny("NewOrderPerAccount", "2", 60),
            "did you mean \"NewOrdersPerAccount\"?",
        ),
        (deny("NewOrdersPerAccount", "abc", 60), "id: "),
        (
            deny("NewOrdersPerAccount", "2", 7_200),
            "ttl: 7200 s is not 1 s to 3600 s",
        ),
        (both, "give exactly one of"),
        (no_ttl, "ttl: missing"),
        (zero_limit, "burst, count, period"),
        (
            pb::SetOverrideRequest {
                comment: "c".repeat(201),
                ..deny("NewOrdersPerAccount", "2", 60)
            },
            "comment: longer than 200 characters",
        ),
        (
            pb::SetOverrideRequest {
                author: "a".repeat(65),
                ..deny("NewOrdersPerAccount", "2", 60)
            },
            "author: longer than 64 characters",
        ),
        (
            deny(&"N".repeat(129), "2", 60),
            "name: longer than 128 bytes",
        ),
    ];
    for (request, expected) in cases {
        let status = s.admin.set_override(request.clone()).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{request:?}");
        assert!(status.message().contains(expected), "{}", status.message());
    }
    // A valid one beyond the bound: the server's state refuses it, not the request.
    let status = s
        .admin
        .set_override(deny("NewOrdersPerAccount", "2", 60))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains(
            "1 temporary overrides are in force, the most allowed (--max-runtime-overrides)"
        ),
        "{}",
        status.message()
    );
    assert_eq!(
        listed(&mut s).await,
        [("NewOrdersPerAccount".to_string(), "1".to_string())]
    );
    assert!(allowed(&mut s, "NewOrdersPerAccount", "2").await);
    // Replacing the one in force is allowed at the bound.
    s.admin
        .set_override(pb::SetOverrideRequest {
            unlimited: true,
            deny: false,
            ..deny("NewOrdersPerAccount", "1", 60)
        })
        .await
        .unwrap();
    assert!(allowed(&mut s, "NewOrdersPerAccount", "1").await);
    // Not on the decision port.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", s.decisions_addr))
        .unwrap()
        .connect_lazy();
    let mut wrong_port = pb::admin_client::AdminClient::new(channel);
    let status = wrong_port
        .set_override(deny("NewOrdersPerAccount", "3", 60))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);
    s.stop().await;
}

#[test]
fn the_cli_sets_lists_and_clears_overrides() {
    let server = serve();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_cellrate"))
            .args(args)
            .env_clear()
            .env("CELLRATE_ADDR", &server.listen)
            .env("CELLRATE_ADMIN_ADDR", &server.admin)
            .output()
            .unwrap()
    };
    let out = run(&[
        "admin",
        "override",
        "set",
        "NewOrdersPerAccount",
        "42",
        "--deny",
        "--ttl",
        "30m",
        "--comment",
        "ticket 9",
        "--author",
        "ops",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.starts_with("NAME"), "{text}");
    assert!(
        text.contains("NewOrdersPerAccount  42  deny      30m         ops     ticket 9"),
        "{text}"
    );
    let out = run(&["check", "NewOrdersPerAccount", "42"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["admin", "override", "list", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list["replicas"][0]["entries"][0]["id"], "42");
    assert_eq!(list["replicas"][0]["entries"][0]["author"], "ops");
    let out = run(&[
        "admin",
        "override",
        "clear",
        "NewOrdersPerAccount",
        "42",
        "--json",
    ]);
    let cleared: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cleared["cleared"], 1);
    let out = run(&["check", "NewOrdersPerAccount", "42"]);
    assert_eq!(out.status.code(), Some(0));
    // Flags that contradict each other are a usage error before any call.
    let out = run(&[
        "admin",
        "override",
        "set",
        "NewOrdersPerAccount",
        "42",
        "--deny",
        "--unlimited",
        "--ttl",
        "1m",
    ]);
    assert_eq!(out.status.code(), Some(64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_lists_overrides_beyond_grpcs_default_message_size() {
    // 5 000 overrides, each with the longest comment and author in 4-byte characters:
    // a ListOverrides answer of over 5 MB (tonic's clients read 4 MiB by default).
    let settings = Settings {
        max_runtime_overrides: 5_000,
        ..Settings::default()
    };
    let limits =
        LimitTable::load_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/config").as_ref()).unwrap();
    let mut s = Served::with_settings(limits, settings).await;
    let (comment, author) = ("\u{1D11E}".repeat(200), "\u{1D11E}".repeat(64));
    for i in 0..5_000 {
        let request = pb::SetOverrideRequest {
            comment: comment.clone(),
            author: author.clone(),
            ..deny("NewOrdersPerAccount", &(i + 1).to_string(), 600)
        };
        s.admin.set_override(request).await.unwrap();
    }
    let admin = s.admin_addr.to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_cellrate"))
            .args([
                "admin",
                "override",
                "list",
                "--json",
                "--admin-addr",
                &admin,
            ])
            .env_clear()
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.len() > 5_000_000, "{} bytes", out.stdout.len());
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        list["replicas"][0]["entries"].as_array().unwrap().len(),
        5_000
    );
    s.stop().await;
}

/// A limit of envoyproxy/ratelimit's format, 2 a minute per user, and a second one.
const RATELIMIT: &str = "
domain: rl
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: team
    rate_limit: {name: teams, unit: hour, requests_per_unit: 1}
";

/// ShouldRateLimit for `user` in domain `rl`: (code, `current_limit.requests_per_unit`,
/// `limit_remaining`).
async fn rl_user(s: &mut Served, user: &str) -> (i32, Option<u32>, u32) {
    let r = s
        .envoy
        .should_rate_limit(
            envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
                domain: "rl".into(),
                descriptors: vec![crate::common::descriptor(&[("user", user)])],
                hits_addend: 0,
            },
        )
        .await
        .expect("answered")
        .into_inner();
    let status = &r.statuses[0];
    assert_eq!(r.overall_code, status.code);
    let limit = status.current_limit.as_ref().map(|l| l.requests_per_unit);
    (status.code, limit, status.limit_remaining)
}

fn rl_override(id: &str, ttl: i64) -> pb::SetOverrideRequest {
    pb::SetOverrideRequest {
        name: "rl.user".into(),
        id: id.into(),
        ttl: secs(ttl),
        comment: "incident 4".into(),
        author: "ops".into(),
        ..Default::default()
    }
}

async fn served_ratelimit(max_runtime_overrides: usize) -> Served {
    let dir = crate::common::directory(&[("rl.yaml", RATELIMIT)]);
    let limits = LimitTable::load_dir(dir.path()).unwrap();
    let settings = Settings {
        max_runtime_overrides,
        ..Settings::default()
    };
    Served::with_settings(limits, settings).await
}

/// A bucket of a limit of envoyproxy/ratelimit's format, named by the limit's label and the
/// bucket's readable name as `top` shows them, takes a temporary override as a configured
/// name's id does: a deny, a higher limit (a count a minute, the window the limit counts
/// in), unlimited, each changing ShouldRateLimit's answers for that bucket only, until its
/// TTL (on the fake clock); `list`, `inspect` and `clear` take the same pair. What does not
/// fit is INVALID_ARGUMENT and changes nothing.
#[tokio::test]
async fn a_ratelimit_format_bucket_takes_a_temporary_override_until_its_ttl() {
    let mut s = served_ratelimit(10).await;
    const OK: i32 = 1;
    const OVER: i32 = 2;
    assert_eq!(rl_user(&mut s, "alice").await, (OK, Some(2), 1));
    assert_eq!(rl_user(&mut s, "bob").await, (OK, Some(2), 1));

    let deny = pb::SetOverrideRequest {
        deny: true,
        ..rl_override("rl/user=alice", 600)
    };
    let set = s.admin.set_override(deny).await.unwrap().into_inner();
    let entry = set.entry.unwrap();
    assert_eq!(
        (entry.name.as_str(), entry.id.as_str()),
        ("rl.user", "rl/user=alice")
    );
    assert!(entry.deny);
    assert_eq!(rl_user(&mut s, "alice").await.0, OVER);
    assert_eq!(rl_user(&mut s, "alice").await.0, OVER);
    assert_eq!(
        rl_user(&mut s, "bob").await,
        (OK, Some(2), 0),
        "bob's bucket as before"
    );
    let inspected = s
        .admin
        .inspect(pb::InspectRequest {
            items: vec![item("rl.user", "rl/user=alice", None)],
        })
        .await
        .unwrap()
        .into_inner();
    let source = inspected.items[0].source.clone().unwrap();
    assert_eq!(source.kind(), pb::limit_source::Kind::RuntimeOverride);
    assert_eq!(
        (source.comment.as_str(), source.author.as_str()),
        ("incident 4", "ops")
    );

    // A higher limit: 10 a minute, counted in the same window (alice's one hit so far; the
    // denied ones spent nothing).
    let higher = pb::SetOverrideRequest {
        count: 10,
        ..rl_override("rl/user=alice", 600)
    };
    let entry = s
        .admin
        .set_override(higher)
        .await
        .unwrap()
        .into_inner()
        .entry
        .unwrap();
    assert_eq!((entry.count, entry.calendar.as_deref()), (10, Some("1m")));
    assert_eq!(rl_user(&mut s, "alice").await, (OK, Some(10), 8));
    assert_eq!(rl_user(&mut s, "alice").await, (OK, Some(10), 7));
    assert_eq!(
        rl_user(&mut s, "bob").await,
        (OVER, Some(2), 0),
        "bob's limit stays 2"
    );

    // Unlimited for 10 s, replacing it: alice passes whatever her count.
    let unlimited = pb::SetOverrideRequest {
        unlimited: true,
        ..rl_override("rl/user=alice", 10)
    };
    s.admin.set_override(unlimited).await.unwrap();
    for _ in 0..12 {
        assert_eq!(rl_user(&mut s, "alice").await, (OK, None, 0));
    }
    assert_eq!(rl_user(&mut s, "bob").await.0, OVER);
    assert_eq!(
        listed(&mut s).await,
        [("rl.user".to_string(), "rl/user=alice".to_string())]
    );

    // Its TTL ends it: the file's 2 a minute again, on alice's 3 hits of this minute
    // (T0 is 20 s into a minute; 11 s on is the same minute).
    s.clock.advance(11 * SECOND);
    assert!(listed(&mut s).await.is_empty());
    assert_eq!(rl_user(&mut s, "alice").await, (OVER, Some(2), 0));

    // Cleared before its TTL: the same.
    let deny = pb::SetOverrideRequest {
        deny: true,
        ..rl_override("rl/user=carol", 600)
    };
    s.admin.set_override(deny).await.unwrap();
    assert_eq!(rl_user(&mut s, "carol").await.0, OVER);
    let clear = pb::ClearOverrideRequest {
        name: "rl.user".into(),
        id: "rl/user=carol".into(),
    };
    assert!(
        s.admin
            .clear_override(clear)
            .await
            .unwrap()
            .into_inner()
            .cleared
    );
    assert_eq!(rl_user(&mut s, "carol").await, (OK, Some(2), 1));

    // What does not fit: INVALID_ARGUMENT, nothing set.
    let gcra = pb::SetOverrideRequest {
        burst: 5,
        count: 5,
        period: secs(1),
        ..rl_override("rl/user=dave", 60)
    };
    let hourly = pb::SetOverrideRequest {
        count: 5,
        calendar: "1h".into(),
        ..rl_override("rl/user=dave", 60)
    };
    let deny = |name: &str, id: &str| pb::SetOverrideRequest {
        name: name.into(),
        deny: true,
        ..rl_override(id, 60)
    };
    let cases = [
        (gcra, "counts in fixed windows of its unit"),
        (hourly, "counts in windows of its unit (1m)"),
        (deny("rl.user", "rl/team=a"), "names no bucket of rl.user"),
        (deny("rl.user", "rl/user"), "names no bucket of rl.user"),
        (
            deny("rl.user", "rl/user=a%zz"),
            "names no bucket of rl.user",
        ),
        (deny("teams", "rl/user=dave"), "names no bucket of teams"),
        (deny("rl.usr", "rl/user=dave"), "name: "),
        (
            pb::SetOverrideRequest {
                ttl: secs(0),
                ..deny("rl.user", "rl/user=dave")
            },
            "ttl: 0 s",
        ),
    ];
    for (request, expected) in cases {
        let status = s.admin.set_override(request.clone()).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{request:?}");
        assert!(status.message().contains(expected), "{}", status.message());
    }
    assert!(listed(&mut s).await.is_empty());
    assert_eq!(rl_user(&mut s, "dave").await, (OK, Some(2), 1));

    // The metrics name the limit by its label (the bucket's digest is in no label).
    let metrics = crate::common::http_get_async(s.metrics_addr, "/metrics")
        .await
        .1;
    let denied = "cellrate_decisions_total{api=\"envoy\",limit=\"rl.user\",result=\"denied\"}";
    assert!(
        crate::common::sample(&metrics, denied).is_some_and(|n| n >= 5.0),
        "{metrics}"
    );
    let hex_run = |line: &str| {
        line.split(|c: char| !c.is_ascii_hexdigit())
            .any(|run| run.len() >= 64)
    };
    assert!(!metrics.lines().any(hex_run), "{metrics}");
    s.stop().await;
}

/// `--max-runtime-overrides` bounds the overrides of ratelimit-format buckets with the
/// others: an operator (or a script gone wrong) setting one per bucket stops at the bound,
/// and a bucket past it is answered by its file's limit.
#[tokio::test]
async fn overrides_of_ratelimit_format_buckets_stop_at_the_bound() {
    let mut s = served_ratelimit(5).await;
    let mut refused = 0;
    for i in 0..200 {
        let deny = pb::SetOverrideRequest {
            deny: true,
            ..rl_override(&format!("rl/user=u{i}"), 600)
        };
        match s.admin.set_override(deny).await {
            Ok(_) => assert!(i < 5, "set {i}"),
            Err(status) => {
                assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
                assert!(status.message().contains("--max-runtime-overrides"));
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 195);
    assert_eq!(listed(&mut s).await.len(), 5);
    assert_eq!(rl_user(&mut s, "u4").await.0, 2, "within the bound: denied");
    assert_eq!(
        rl_user(&mut s, "u5").await.0,
        1,
        "past it: the file's limit"
    );
    // One bound for both kinds.
    let status = s
        .admin
        .set_override(deny("NewOrdersPerAccount", "1", 60))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    // Replacing one in force is allowed at the bound.
    let unlimited = pb::SetOverrideRequest {
        unlimited: true,
        ..rl_override("rl/user=u4", 600)
    };
    s.admin.set_override(unlimited).await.unwrap();
    assert_eq!(rl_user(&mut s, "u4").await.0, 1);
    s.stop().await;
}

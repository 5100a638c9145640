//! envoyproxy/ratelimit's file format (#36): a limits directory holding its files (alone, or
//! beside cellrate's own) answers ShouldRateLimit as envoyproxy/ratelimit does by default,
//! fixed windows aligned to the unit and every hit counted on every descriptor, and with
//! cellrate's GCRA on request. Through a real gRPC client, on a fake clock that starts on a
//! whole second (1 700 000 000 s).

use std::process::Command;

use crate::common::ratelimit_format::{served, OK, OVER};
use crate::common::{descriptor, directory, Served};
use cellrate::clock::SECOND;
use cellrate::limits::config::LimitTable;
use cellrate::service::envoy::RatelimitCounting;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// A config in envoyproxy/ratelimit's format, written for these tests.
const CONFIG: &str = "
domain: rl
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bar
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: bay
    value: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: specific
    rate_limit: {name: specific, unit: minute, requests_per_unit: 10, replaces: [{name: general}]}
  - key: general
    rate_limit: {name: general, unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
";

async fn ask(s: &mut Served, descriptors: Vec<RateLimitDescriptor>) -> RateLimitResponse {
    s.envoy
        .should_rate_limit(RateLimitRequest {
            domain: "rl".to_string(),
            descriptors,
            hits_addend: 0,
        })
        .await
        .expect("answered")
        .into_inner()
}

async fn one(s: &mut Served, entries: &[(&str, &str)]) -> RateLimitResponse {
    ask(s, vec![descriptor(entries)]).await
}

#[tokio::test]
async fn its_files_answer_as_envoyproxy_ratelimit_does() {
    // The directory holds only its file: a complete configuration.
    let dir = directory(&[("config.yaml", CONFIG)]);
    let mut s = served(dir.path(), RatelimitCounting::FixedWindow).await;
    let ip = [("remote_address", "10.0.0.1")];
    for left in [1, 0] {
        let r = one(&mut s, &ip).await;
        assert_eq!(r.overall_code, OK);
        let status = &r.statuses[0];
        assert_eq!(status.limit_remaining, left);
        let current = status.current_limit.as_ref().unwrap();
        assert_eq!(
            (current.requests_per_unit, current.unit),
            (2, Unit::Second as i32)
        );
        assert_eq!(status.duration_until_reset.unwrap().seconds, 1);
    }
    assert_eq!(one(&mut s, &ip).await.overall_code, OVER);
    // Every value of a key-only entry has its own counter.
    assert_eq!(
        one(&mut s, &[("remote_address", "10.0.0.2")])
            .await
            .overall_code,
        OK
    );

    // Every hit counts on every descriptor, even in a request that is over the limit.
    let both = vec![descriptor(&ip), descriptor(&[("foo", "x")])];
    let r = ask(&mut s, both).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].code, r.statuses[1].code),
        (OVER, OVER, OK)
    );
    assert_eq!(r.statuses[1].limit_remaining, 1);
    assert_eq!(
        one(&mut s, &[("foo", "x")]).await.statuses[0].limit_remaining,
        0
    );

    // The window is aligned to the unit: the next second starts afresh.
    s.clock.advance(SECOND);
    assert_eq!(one(&mut s, &ip).await.overall_code, OK);

    // Nested entries, and a level that does not match: no limit, nothing counted.
    let nested = [("source_cluster", "proxy"), ("destination_cluster", "bar")];
    for _ in 0..3 {
        assert_eq!(one(&mut s, &nested).await.overall_code, OK);
    }
    assert_eq!(one(&mut s, &nested).await.overall_code, OVER);
    let other = [("source_cluster", "proxy"), ("destination_cluster", "baz")];
    let r = one(&mut s, &other).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].current_limit.clone()),
        (OK, None)
    );

    // share_threshold: every path under /api/ counts in one bucket.
    assert_eq!(one(&mut s, &[("path", "/api/a")]).await.overall_code, OK);
    assert_eq!(one(&mut s, &[("path", "/api/b")]).await.overall_code, OK);
    assert_eq!(one(&mut s, &[("path", "/api/c")]).await.overall_code, OVER);

    // shadow_mode: over the limit, answered OK.
    for _ in 0..3 {
        assert_eq!(one(&mut s, &[("bay", "shadow")]).await.overall_code, OK);
    }
    // replaces: the general limit (1 a minute) is left out when the specific one matches.
    let replaced = || {
        vec![
            descriptor(&[("specific", "a")]),
            descriptor(&[("general", "a")]),
        ]
    };
    for _ in 0..3 {
        assert_eq!(ask(&mut s, replaced()).await.overall_code, OK);
    }
    // unlimited: never over, answered as there: no limit, 4 294 967 295 remaining.
    for _ in 0..5 {
        let r = one(&mut s, &[("free", "a")]).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(
            r.statuses,
            [envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus {
                code: OK,
                limit_remaining: u32::MAX,
                ..Default::default()
            }]
        );
    }
    // quota_mode: a quota over its limit denies only when every quota is over.
    let quotas = || {
        vec![
            descriptor(&[("quota_a", "q")]),
            descriptor(&[("quota_b", "q")]),
        ]
    };
    assert_eq!(ask(&mut s, quotas()).await.overall_code, OK);
    let r = ask(&mut s, quotas()).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].code, r.statuses[1].code),
        (OK, OVER, OK)
    );
    assert_eq!(ask(&mut s, quotas()).await.overall_code, OK);
    assert_eq!(
        ask(&mut s, quotas()).await.overall_code,
        OVER,
        "both quotas over"
    );
    // Any other descriptor over the limit still denies.
    let with_ip = vec![descriptor(&[("quota_a", "r")]), descriptor(&ip)];
    assert_eq!(ask(&mut s, with_ip.clone()).await.overall_code, OK);
    assert_eq!(ask(&mut s, with_ip).await.overall_code, OVER);

    // A descriptor's own limit (Envoy Gateway's per-tenant limits) replaces the file's.
    let mut own = descriptor(&[("tenant", "t1")]);
    own.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour as i32,
    });
    assert_eq!(ask(&mut s, vec![own.clone()]).await.overall_code, OK);
    let r = ask(&mut s, vec![own]).await;
    assert_eq!(r.overall_code, OVER);
    let current = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (current.requests_per_unit, current.unit),
        (1, Unit::Hour as i32)
    );
    s.stop().await;
}

/// `--ratelimit-counting gcra`: the same files decided by cellrate's GCRA (burst =
/// requests_per_unit), all-or-nothing: a denied request spends nothing.
#[tokio::test]
async fn on_request_the_same_files_count_by_gcra_all_or_nothing() {
    let dir = directory(&[("config.yaml", CONFIG)]);
    let mut s = served(dir.path(), RatelimitCounting::Gcra).await;
    let ip = [("remote_address", "10.0.0.1")];
    assert_eq!(one(&mut s, &ip).await.overall_code, OK);
    assert_eq!(one(&mut s, &ip).await.overall_code, OK);
    let both = vec![descriptor(&ip), descriptor(&[("foo", "x")])];
    assert_eq!(ask(&mut s, both).await.overall_code, OVER);
    // foo spent nothing in the denied request.
    assert_eq!(
        one(&mut s, &[("foo", "x")]).await.statuses[0].limit_remaining,
        1
    );
    // GCRA refills continuously: one token after half a second, not a whole window.
    s.clock.advance(SECOND / 2);
    assert_eq!(one(&mut s, &ip).await.overall_code, OK);
    assert_eq!(one(&mut s, &ip).await.overall_code, OVER);
    s.stop().await;
}

#[tokio::test]
async fn beside_cellrates_own_files_and_refused_as_envoyproxy_ratelimit_refuses() {
    // Beside cellrate's own files: both decide, each its domains.
    let dir = directory(&[
        ("config.yaml", CONFIG),
        ("defaults.yaml", "NewOrdersPerAccount: {burst: 1, count: 1, period: 1h}\n"),
        (
            "descriptors.yaml",
            "edge:\n  - match: [{key: account}]\n    limits: [NewOrdersPerAccount]\n    id: \"{account}\"\n",
        ),
    ]);
    let table = LimitTable::load_dir(dir.path()).unwrap();
    assert!(table.ratelimit().has_domain("rl"));
    assert!(table.descriptors().has_domain("edge"));

    // One domain in both formats is refused; so is every broken file, naming file and entry.
    let both =
        "rl:\n  - match: [{key: foo}]\n    limits: [NewOrdersPerAccount]\n    id: \"{foo}\"\n";
    let e = LimitTable::from_files(&[
        ("config.yaml".into(), CONFIG.into()),
        ("descriptors.yaml".into(), both.into()),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("descriptors.yaml: rl: this domain is also configured"),
        "{e}"
    );
    for (text, says) in [
        ("domain: rl\ndescriptors: [{key: a, rate_limit: {unit: fortnight, requests_per_unit: 1}}]\n", "bad.yaml: rl.a: invalid rate limit unit 'fortnight'"),
        ("domain: rl\ndescriptors: [{key: a, ratelimit: {unit: second}}]\n", "bad.yaml: descriptors[0]: unknown field `ratelimit`"),
        ("domain: rl\ndescriptors: [{key: a}, {key: a}]\n", "bad.yaml: rl.a: duplicate descriptor composite key 'rl.a'"),
    ] {
        let e = LimitTable::from_files(&[("bad.yaml".into(), text.into())])
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{text}: {e}");
    }
    let e = LimitTable::from_files(&[
        ("a.yaml".into(), "domain: rl\n".into()),
        ("b.yaml".into(), "domain: rl\n".into()),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("b.yaml: duplicate domain 'rl' in config file"),
        "{e}"
    );
}

/// `cellrate validate` checks its files with the same file-and-entry errors.
#[test]
fn validate_checks_its_files() {
    let good = directory(&[("config.yaml", CONFIG)]);
    let out = Command::new(env!("CARGO_BIN_EXE_cellrate"))
        .arg("validate")
        .arg(good.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let bad = directory(&[(
        "config.yaml",
        "domain: rl\ndescriptors: [{key: a, rate_limit: {unlimited: true, unit: second}}]\n",
    )]);
    let out = Command::new(env!("CARGO_BIN_EXE_cellrate"))
        .arg("validate")
        .arg(bad.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("config.yaml: rl.a: should not specify rate limit unit when unlimited"),
        "{said}"
    );
}

/// envoyproxy/ratelimit's per-descriptor statistics, under its statistics keys: by
/// default the configured key (bounded by the config), with `detailed_metric` the request's
/// values (bounded by a cap on keys).
#[tokio::test]
async fn its_statistics_are_counted_per_descriptor() {
    use crate::common::{http_get_async, sample};
    let config = "
domain: rl
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: bay
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    let dir = directory(&[("config.yaml", config)]);
    let mut s = served(dir.path(), RatelimitCounting::FixedWindow).await;
    for _ in 0..3 {
        one(&mut s, &[("ip", "10.0.0.1")]).await;
    }
    one(&mut s, &[("ip", "10.0.0.2")]).await;
    for _ in 0..2 {
        one(&mut s, &[("bay", "x")]).await;
    }
    one(&mut s, &[("user", "alice")]).await;
    let (_, metrics) = http_get_async(s.metrics_addr, "/metrics").await;
    let stat = |key: &str, stat: &str| {
        sample(
            &metrics,
            &format!("cellrate_ratelimit_hits_total{{key=\"{key}\",stat=\"{stat}\"}}"),
        )
    };
    // Every ip counts under the configured key: 4 hits, 1 over, 3 within; the 2nd hit of
    // 10.0.0.1 was past 80 % of 2.
    assert_eq!(stat("rl.ip", "total_hits"), Some(4.0));
    assert_eq!(stat("rl.ip", "over_limit"), Some(1.0));
    assert_eq!(stat("rl.ip", "within_limit"), Some(3.0));
    assert_eq!(stat("rl.ip", "near_limit"), Some(1.0));
    // Shadow mode: over the limit and answered OK, counted as both.
    assert_eq!(stat("rl.bay", "over_limit"), Some(1.0));
    assert_eq!(stat("rl.bay", "shadow_mode"), Some(1.0));
    // detailed_metric: the request's value in the key.
    assert_eq!(stat("rl.user_alice", "total_hits"), Some(1.0));
    assert_eq!(stat("rl.user", "total_hits"), None);
    s.stop().await;
}

/// Run as `ratelimit`, every bad variable found by trying each through the binary exits 78
/// naming the variable, before any port is bound; these exited 64 naming the `cellrate
/// serve` flag they became (a TLS path set empty, a client certificate without its key, a
/// bad extra xDS header, a backoff out of range), or 78 naming the flags.
/// Variables: (name, value).
type Vars<'v> = &'v [(&'v str, &'v str)];

#[test]
fn run_as_ratelimit_a_bad_variable_exits_78_naming_it() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("config")).unwrap();
    let bin = root.path().join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_cellrate"), &bin).unwrap();
    let memory = [("BACKEND_TYPE", "memory")];
    let xds = [("BACKEND_TYPE", "memory"), ("CONFIG_TYPE", "GRPC_XDS_SOTW")];
    let redis = [("REDIS_URL", "127.0.0.1:6379"), ("REDIS_TLS", "true")];
    let cases: &[(Vars, Vars, &str)] = &[
        (
            &memory,
            &[
                ("GRPC_SERVER_USE_TLS", "true"),
                ("GRPC_SERVER_TLS_CERT", ""),
                ("GRPC_SERVER_TLS_KEY", ""),
            ],
            "GRPC_SERVER_TLS_CERT",
        ),
        (
            &redis,
            &[("REDIS_TLS_CLIENT_CERT", "/c.pem")],
            "REDIS_TLS_CLIENT_CERT",
        ),
        (
            &redis,
            &[("REDIS_TLS_CLIENT_KEY", "/c.key")],
            "REDIS_TLS_CLIENT_KEY",
        ),
        (
            &[("BACKEND_TYPE", "redis")],
            &[("REDIS_URL", "localhost:abc")],
            "REDIS_URL",
        ),
        (
            &[("BACKEND_TYPE", "redis"), ("REDIS_TYPE", "cluster")],
            &[("REDIS_URL", "a:1, not a host")],
            "REDIS_URL",
        ),
        (
            &xds,
            &[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "bad name:v")],
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        ),
        (
            &xds,
            &[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-a:b\u{1}c")],
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        ),
        (
            &xds,
            &[("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "0s")],
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        ),
        (
            &xds,
            &[("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1000d")],
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        ),
        (
            &xds,
            &[
                ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s"),
                ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1s"),
            ],
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL is longer than XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        ),
        (
            &xds,
            &[
                ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c.pem"),
            ],
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        ),
    ];
    for (base, bad, named) in cases {
        let out = Command::new(&bin)
            .env_clear()
            .env("RUNTIME_ROOT", root.path())
            .envs(base.iter().chain(bad.iter()).copied())
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", "0")
            .env("HOST", "127.0.0.1")
            .env("PORT", "0")
            .env("CELLRATE_ADMIN_LISTEN", "127.0.0.1:0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{bad:?}: {stderr}");
        assert!(stderr.contains(named), "{bad:?} names {named}: {stderr}");
        assert!(!stderr.contains("--"), "{bad:?} names no flag: {stderr}");
        assert!(
            !stderr.contains("serving"),
            "{bad:?} refused before serving: {stderr}"
        );
    }
}

/// envoyproxy/ratelimit's files may have any name, `quota.yaml` or `names.yaml` too (one of
/// cellrate's own names): a file with a top-level `domain` of text is read in its format,
/// whatever its name; cellrate's own `quota.yaml` still reads as RLQS rules.
#[tokio::test]
async fn an_upstream_file_named_as_one_of_ours_is_read_in_its_format() {
    let upstream = "domain: rl\ndescriptors:\n  - key: foo\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    for name in ["quota.yaml", "names.yaml", "descriptors.yaml"] {
        let dir = directory(&[(name, upstream)]);
        let mut s = served(dir.path(), RatelimitCounting::FixedWindow).await;
        assert_eq!(
            one(&mut s, &[("foo", "x")]).await.overall_code,
            OK,
            "{name}"
        );
        assert_eq!(
            one(&mut s, &[("foo", "x")]).await.overall_code,
            OVER,
            "{name}"
        );
        s.stop().await;
    }
    // cellrate's own quota.yaml: RLQS rules per domain, a domain named `domain` included.
    let ours = directory(&[
        ("names.yaml", "RequestsPerTenant: {number: 101, format: string}\n"),
        ("defaults.yaml", "RequestsPerTenant: {burst: 5, count: 5, period: 1s}\n"),
        (
            "quota.yaml",
            "domain:\n  - match: [{key: tenant}]\n    limits: [RequestsPerTenant]\n    id: \"{tenant}\"\n",
        ),
    ]);
    let table = LimitTable::load_dir(ours.path()).expect("cellrate's quota.yaml loads");
    assert!(table.ratelimit().is_empty());
}

/// A statsd mapping (`PROMETHEUS_MAPPER_YAML`) that is malformed, too large or missing
/// stops startup with exit 78, the error naming the file and what is wrong in it, before
/// any port is bound.
#[test]
fn a_bad_statsd_mapping_stops_startup_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("config")).unwrap();
    std::fs::write(dir.path().join("config/rl.yaml"), CONFIG).unwrap();
    let bin = dir.path().join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_cellrate"), &bin).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let cases = [
        (
            write("bad.yaml", "mappings:\n  - {match: 'a.*', name: 'a-b'}\n"),
            "mappings[0]",
        ),
        (write("big.yaml", &"#".repeat(300 * 1024)), "bytes: at most"),
        (
            dir.path().join("missing.yaml").display().to_string(),
            "reading",
        ),
    ];
    for (path, says) in cases {
        let out = Command::new(&bin)
            .env_clear()
            .env("RUNTIME_ROOT", dir.path())
            .env("BACKEND_TYPE", "memory")
            .env("USE_PROMETHEUS", "true")
            .env("PROMETHEUS_ADDR", "127.0.0.1:0")
            .env("PROMETHEUS_MAPPER_YAML", &path)
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", "0")
            .env("HOST", "127.0.0.1")
            .env("PORT", "0")
            .env("CELLRATE_ADMIN_LISTEN", "127.0.0.1:0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{path}: {stderr}");
        assert!(stderr.contains(&path), "names {path}: {stderr}");
        assert!(stderr.contains("PROMETHEUS_MAPPER_YAML"), "{stderr}");
        assert!(stderr.contains(says), "{path}: {says}: {stderr}");
        assert!(!stderr.contains("cellrate serving"), "{stderr}");
    }
}

/// Statsd mappings within the file's bounds that were not bounded in memory, each now
/// refused at start naming the bound (before: served): 500 regular expressions of 20
/// word characters (42 KB of file, 1 MiB compiled each: about 1 GB resident at start), a
/// label template of 2 048 `$0` (each new statistics key's series about 50 MB), and a
/// FIFO at the path (startup waited on it for ever).
#[test]
fn a_mapping_that_would_take_a_gigabyte_or_hang_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let rules: String = (0..500)
        .map(|i| format!("  - {{match: '(\\w{{20}})x{i}', match_type: regex, name: m{i}}}\n"))
        .collect();
    let heavy = dir.path().join("heavy.yaml");
    std::fs::write(&heavy, format!("mappings:\n{rules}")).unwrap();
    let repeated = dir.path().join("repeated.yaml");
    let template = "$0".repeat(2_048);
    let rule =
        format!("mappings:\n  - {{match: 'ratelimit.*', name: r, labels: {{l: '{template}'}}}}\n");
    std::fs::write(&repeated, rule).unwrap();
    let fifo = dir.path().join("fifo.yaml");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo");
    let config = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config"));
    let cases = [
        (heavy, "for the whole file"),
        (repeated, "at most 16 `$`"),
        (fifo, "FIFO"),
    ];
    for (path, says) in cases {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cellrate"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .args(["--metrics-listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .arg("--ratelimit-stats-mapping")
            .arg(&path)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let lines = crate::common::stderr_lines(&mut child);
        let mut said = String::new();
        while let Ok(line) = lines.recv_timeout(std::time::Duration::from_secs(30)) {
            if line.contains("cellrate serving") {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{}: served, the mapping accepted", path.display());
            }
            said.push_str(&line);
        }
        let _ = child.kill();
        let status = child.wait().unwrap();
        assert!(!status.success(), "{}: {status}", path.display());
        assert!(said.contains(says), "{}: {says}: {said}", path.display());
    }
}

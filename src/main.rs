//! The `cellrate` binary: parse flags, start tracing, run a command, map failures to exit
//! codes, one set for every command (sysexits.h): 0 success, 64 the command line is wrong
//! (an unknown flag, a bad or missing value), 78 the configuration is (the limits
//! directory, the TLS files), 1 anything else (a port in use, a runtime failure).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use cellrate::cli::{Cli, Command, LogFormat, ServeArgs, StoreKind};
use cellrate::limits::config::LimitTable;
use cellrate::server::StoreSettings;
use cellrate::store::redis::{Coalescing, RedisSettings};

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// EX_USAGE from sysexits.h: the command line is wrong.
const EXIT_USAGE: u8 = 64;
/// EX_CONFIG from sysexits.h: the configuration is wrong.
const EXIT_CONFIG: u8 = 78;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout and succeed; anything else is a usage error.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    init_tracing(cli.log_format);
    match cli.command {
        Command::Validate { dir } => match LimitTable::load_dir(&dir) {
            Ok(table) => {
                println!(
                    "OK: {} ({} overrides, version {})",
                    dir.display(),
                    table.override_count(),
                    table.version()
                );
                ExitCode::SUCCESS
            }
            Err(errors) => {
                for error in &errors.0 {
                    println!("{error}");
                }
                ExitCode::from(EXIT_CONFIG)
            }
        },
        Command::Serve(args) => serve(*args),
        Command::Check(args) => ExitCode::from(cellrate::cli::client::run_check(args).code()),
        Command::Refund(args) => ExitCode::from(cellrate::cli::client::run_refund(args).code()),
        Command::Admin { command } => {
            ExitCode::from(cellrate::cli::client::run_admin(command).code())
        }
        Command::Simulate(args) => {
            if let Some(dir) = &args.config {
                if let Err(errors) = LimitTable::load_dir(dir) {
                    for error in &errors.0 {
                        eprintln!("cellrate simulate: {error}");
                    }
                    return ExitCode::from(EXIT_CONFIG);
                }
            }
            let script = match cellrate::cli::simulate::Script::from_args(
                &args.limits,
                args.config.as_deref(),
            ) {
                Ok(script) => script,
                Err(e) => {
                    eprintln!("cellrate simulate: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let (stdin, stdout) = (std::io::stdin().lock(), std::io::stdout().lock());
            match script.run(stdin, stdout) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("cellrate simulate: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    // Bad configuration or flags exit (78, 64) before any port is bound.
    let limits = match LimitTable::load_dir(&args.config) {
        Ok(limits) => limits,
        Err(errors) => {
            for error in &errors.0 {
                tracing::error!(%error, "invalid limits configuration");
            }
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let store = match store_settings(&args, &limits) {
        Ok(store) => store,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "invalid store settings");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let tls = match read_tls(&args) {
        Ok(tls) => tls,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "invalid TLS settings");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if args
        .resp_token
        .as_deref()
        .is_some_and(|t| t.trim().is_empty())
    {
        tracing::error!(
            "--resp-token (CELLRATE_RESP_TOKEN) is empty: set a real token, or unset it to \
             serve the Redis protocol without authentication"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    if let Some(token) = &args.admin_token {
        if token.trim().is_empty() {
            tracing::error!(
                "--admin-token (CELLRATE_ADMIN_TOKEN) is empty: set a real token, or unset it \
                 to serve admin RPCs without one"
            );
            return ExitCode::from(EXIT_USAGE);
        }
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve_async(args, limits, tls, store)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "cellrate stopped");
            ExitCode::FAILURE
        }
    }
}

/// Reads the TLS files named by the flags.
fn read_tls(args: &ServeArgs) -> anyhow::Result<Option<cellrate::server::admin::TlsPem>> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("reading {}", path.display()))
    };
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    Ok(Some(cellrate::server::admin::TlsPem {
        cert: read(cert)?,
        key: read(key)?,
        admin_client_ca: args.admin_client_ca.as_deref().map(read).transpose()?,
    }))
}

/// The store the flags describe.
fn store_settings(args: &ServeArgs, limits: &LimitTable) -> anyhow::Result<StoreSettings> {
    if args.store == StoreKind::Memory {
        return Ok(StoreSettings::Memory);
    }
    if !cfg!(feature = "redis") {
        return Err(cellrate::server::no_redis().into());
    }
    if args.redis_url.is_none() && args.redis_cluster_nodes.is_empty() {
        anyhow::bail!("--store redis needs --redis-url or --redis-cluster-nodes");
    }
    let tag_by_id = if args.redis_tag_by_id.iter().any(|n| n == "*") {
        None
    } else {
        let mut numbers = std::collections::HashSet::new();
        for name in &args.redis_tag_by_id {
            let found = limits
                .names()
                .get(name)
                .with_context(|| format!("--redis-tag-by-id: {}", limits.names().unknown(name)))?;
            numbers.insert(found.number);
        }
        Some(numbers)
    };
    Ok(StoreSettings::Redis {
        settings: Box::new(RedisSettings {
            url: args.redis_url.clone(),
            cluster_nodes: args.redis_cluster_nodes.clone(),
            prefix: args.redis_prefix.clone(),
            timeout: Duration::from_millis(args.redis_timeout_ms.max(1)),
            clock: args.redis_clock,
            failure: args.redis_failure_policy,
            local_divisor: args.redis_local_divisor.max(1),
            tag_by_id,
            deny_cache: args.redis_deny_cache,
            override_sync: Duration::from_millis(args.redis_override_sync_ms),
            // Small values: clap checked their ranges.
            coalescing: Coalescing {
                calls_in_flight: args.redis_calls_in_flight as usize,
                call_items: args.redis_call_max_items as usize,
                call_bytes: args.redis_call_max_bytes as usize,
                queued_items: args.redis_queue_max_items as usize,
            },
            ..RedisSettings::default()
        }),
        required_for_ready: args.redis_required_for_ready,
    })
}

async fn serve_async(
    args: ServeArgs,
    limits: LimitTable,
    tls: Option<cellrate::server::admin::TlsPem>,
    store: StoreSettings,
) -> anyhow::Result<()> {
    // Installed before the ports are announced, so that an early SIGTERM still drains.
    let shutdown = cellrate::server::shutdown::signal();
    let decisions = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding --listen {}", args.listen))?;
    let admin = tokio::net::TcpListener::bind(args.admin_listen)
        .await
        .with_context(|| format!("binding --admin-listen {}", args.admin_listen))?;
    let metrics = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding --metrics-listen {}", args.metrics_listen))?;
    let resp = match args.resp_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding --resp-listen {addr}"))?,
        ),
        None => None,
    };
    let settings = cellrate::server::Settings {
        max_buckets: args.max_buckets,
        caller_bucket_share: usize::from(args.caller_limit_bucket_share),
        caller: cellrate::service::CallerLimits {
            enabled: args.caller_limits,
            max_period: args.caller_limit_max_period,
            max_burst: args.caller_limit_max_burst,
        },
        max_runtime_overrides: args.max_runtime_overrides,
        max_override_ttl: args.max_override_ttl,
        rlqs: cellrate::service::rlqs::RlqsSettings {
            max_streams: args.rlqs_max_streams,
            max_buckets: args.rlqs_max_buckets,
            max_buckets_per_stream: args.rlqs_max_buckets_per_stream,
            assignment_ttl: Duration::from_secs(args.rlqs_assignment_ttl_seconds),
            idle: Duration::from_secs(args.rlqs_idle_seconds),
            sync: Duration::from_millis(args.rlqs_sync_ms),
        },
        grace: Duration::from_secs(args.grace_seconds),
        shutdown_delay: Duration::from_secs(args.shutdown_delay_seconds),
        reload: Some(cellrate::server::reload::ReloadSettings {
            dir: args.config.clone(),
            watch: args.watch_config,
            debounce: Duration::from_millis(args.reload_debounce_ms),
            interval: Duration::from_secs(args.reload_interval_seconds.max(1)),
            sighup: true,
        }),
        admin_token: args.admin_token.clone(),
        resp: cellrate::resp::RespSettings {
            token: args.resp_token.clone(),
            ..Default::default()
        },
        tls,
        store,
        server: server_limits(&args),
        envoy: cellrate::service::envoy::EnvoyOptions {
            headers: args.rate_limit_headers,
            shadow: args.shadow,
        },
        ..Default::default()
    };
    cellrate::server::run(
        limits,
        cellrate::server::Listeners {
            decisions,
            admin,
            metrics: Some(metrics),
            resp,
        },
        Arc::new(cellrate::clock::SystemClock),
        settings,
        shutdown,
    )
    .await?;
    tracing::info!("cellrate stopped");
    Ok(())
}

/// The listeners' bounds and timeouts the flags describe.
fn server_limits(args: &ServeArgs) -> cellrate::server::ServerLimits {
    let connections = |max_connections| cellrate::server::listener::ConnectionLimits {
        max_connections,
        handshake_timeout: Duration::from_secs(args.handshake_timeout_seconds.max(1)),
        idle_timeout: Duration::from_secs(args.idle_timeout_seconds.max(1)),
        ..Default::default()
    };
    cellrate::server::ServerLimits {
        decisions: connections(args.max_connections),
        admin: connections(args.admin_max_connections),
        metrics: cellrate::server::listener::ConnectionLimits {
            // HTTP/1 scrapes and probes come and go: idle connections are not kept long.
            idle_timeout: Duration::from_secs(args.idle_timeout_seconds.clamp(1, 60)),
            ..connections(args.metrics_max_connections)
        },
        resp: connections(args.resp_max_connections),
        max_streams_per_connection: args.max_streams_per_connection.max(1),
        max_in_flight: args.max_in_flight.max(1),
        request_timeout: Duration::from_millis(args.request_timeout_ms.max(1)),
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal: a file or a log collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

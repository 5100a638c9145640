//! The `cellrate` binary: parse flags, start tracing, run a command, map failures to exit
//! codes, one set for every command (sysexits.h): 0 success, 64 the command line is wrong
//! (an unknown flag, a bad or missing value), 78 the configuration is (the limits
//! directory, the TLS files), 1 anything else (a port in use, a runtime failure).

use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, FromArgMatches};

use cellrate::cli::{Cli, Command, LogFormat, ServeArgs};
use cellrate::limits::config::{read_files, LimitTable, Sources};
use cellrate::server::StoreSettings;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: cellrate_alloc::MiMalloc = cellrate_alloc::MiMalloc;

/// The command line, whose `--version` names the time zone database built in (the one
/// calendar windows in a `timezone` use): `cellrate 0.1.0 (tzdb 2026f)`.
fn cli_command() -> clap::Command {
    let version = format!(
        "{} (tzdb {})",
        env!("CARGO_PKG_VERSION"),
        cellrate::clock::TZDB_VERSION
    );
    Cli::command().version(&*Box::leak(version.into_boxed_str()))
}

/// EX_USAGE from sysexits.h: the command line is wrong.
const EXIT_USAGE: u8 = 64;
/// EX_CONFIG from sysexits.h: the configuration is wrong.
const EXIT_CONFIG: u8 = 78;

/// `cli`, noting in `serve`'s arguments which values are defaults no flag or variable gave
/// (`matches` says).
fn with_defaults_noted(matches: &clap::ArgMatches, mut cli: Cli) -> Result<Cli, clap::Error> {
    if let (Command::Serve(args), Some(serve)) =
        (&mut cli.command, matches.subcommand_matches("serve"))
    {
        args.admin_listen_defaulted =
            serve.value_source("admin_listen") == Some(clap::parser::ValueSource::DefaultValue);
    }
    Ok(cli)
}

fn main() -> ExitCode {
    // Run as `ratelimit` (the image's /bin/ratelimit, where envoyproxy/ratelimit was).
    let argv0 = std::env::args_os().next().unwrap_or_default();
    if std::path::Path::new(&argv0).file_name() == Some(std::ffi::OsStr::new("ratelimit")) {
        return as_ratelimit(true);
    }
    let cli = match cli_command()
        .try_get_matches()
        .and_then(|m| with_defaults_noted(&m, Cli::from_arg_matches(&m)?))
    {
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
    init_tracing(cli.log_format, None);
    match cli.command {
        Command::Validate { dir, merge_domains } => {
            match read_files(&dir, false).and_then(|files| {
                LimitTable::from_sources(Sources {
                    files: Arc::new(files),
                    xds: Arc::default(),
                    merge_domains,
                })
            }) {
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
            }
        }
        Command::Serve(args) => serve(*args),
        Command::Ratelimit => as_ratelimit(false),
        Command::Check(args) => ExitCode::from(cellrate::cli::client::run_check(args).code()),
        Command::Refund(args) => ExitCode::from(cellrate::cli::client::run_refund(args).code()),
        Command::Settle(args) => ExitCode::from(cellrate::cli::client::run_settle(args).code()),
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

/// What envoyproxy/ratelimit's environment means: `cellrate serve`'s arguments, the log
/// format, the translation (warnings, log level) and the flags as text.
struct AsRatelimit {
    args: Box<ServeArgs>,
    format: LogFormat,
    translated: cellrate::cli::ratelimit_env::Translated,
    flags: String,
}

/// envoyproxy/ratelimit's environment as [`AsRatelimit`], or the exit code and why not.
fn ratelimit_args() -> Result<AsRatelimit, (u8, String)> {
    let translated =
        cellrate::cli::ratelimit_env::translate(|n| std::env::var(n).ok()).map_err(|e| {
            (
                EXIT_CONFIG,
                format!("cellrate (as envoyproxy/ratelimit): {e}"),
            )
        })?;
    let mut argv = vec!["cellrate".to_string(), "serve".to_string()];
    if translated.json_logs {
        argv.extend(["--log-format".to_string(), "json".to_string()]);
    }
    argv.extend(translated.flags.iter().cloned());
    match (cli_command().try_get_matches_from(&argv))
        .and_then(|m| with_defaults_noted(&m, Cli::from_arg_matches(&m)?))
    {
        Ok(Cli {
            command: Command::Serve(args),
            log_format,
        }) => Ok(AsRatelimit {
            args,
            format: log_format,
            flags: argv[2..].join(" "),
            translated,
        }),
        Ok(_) => Err((EXIT_USAGE, "not a serve command".to_string())),
        // The flags come from the environment (`translate` checks what it can, naming the
        // variable): whatever still does not parse is configuration, not a command line.
        Err(e) => Err((
            EXIT_CONFIG,
            format!("cellrate (as envoyproxy/ratelimit): the environment's flags: {e}"),
        )),
    }
}

/// Serves as envoyproxy/ratelimit (run as `ratelimit`, or `cellrate ratelimit`); starts
/// logging unless `main` has, with the environment's level and format.
fn as_ratelimit(logging: bool) -> ExitCode {
    let AsRatelimit {
        mut args,
        format,
        translated,
        flags,
    } = match ratelimit_args() {
        Ok(parts) => parts,
        Err((code, why)) => {
            if logging {
                eprintln!("{why}");
            } else {
                tracing::error!("{why}");
            }
            return ExitCode::from(code);
        }
    };
    if logging {
        init_tracing(format, translated.log_level.as_deref());
    }
    // Over xDS, upstream reads no file: neither does cellrate (no directory, no reloads).
    args.no_limits_dir = translated.xds_only;
    tracing::info!(flags, "serving as envoyproxy/ratelimit");
    for warning in &translated.warnings {
        tracing::warn!("{warning}");
    }
    serve(*args)
}

fn serve(args: ServeArgs) -> ExitCode {
    // Bad configuration or flags exit (78, 64) before any port is bound.
    let xds = match args.xds.settings() {
        Ok(xds) => xds,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "invalid xDS settings");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if xds.is_some() && !args.no_limits_dir && !args.config.exists() {
        tracing::warn!(dir = %args.config.display(), "the limits directory does not exist: limits come from xDS alone");
    }
    let files = match args.no_limits_dir {
        true => Ok(Vec::new()),
        false => read_files(&args.config, xds.is_some()),
    };
    let limits = match files.and_then(|files| {
        LimitTable::from_sources(Sources {
            files: Arc::new(files),
            xds: Arc::default(),
            merge_domains: args.merge_domains,
        })
    }) {
        Ok(limits) => limits,
        Err(errors) => {
            for error in &errors.0 {
                tracing::error!(%error, "invalid limits configuration");
            }
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let store = match args.store(&limits) {
        Ok(store) => store,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "invalid store settings");
            return ExitCode::from(match e.is::<cellrate::cli::redis_args::TlsFileError>() {
                true => EXIT_CONFIG,
                false => EXIT_USAGE,
            });
        }
    };
    let tls = match args.tls() {
        Ok(tls) => tls,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "invalid TLS settings");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let stats_mapping = match args.stats_mapping() {
        Ok(mapping) => mapping,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "invalid statistics mapping");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(e) = args.check_tokens() {
        tracing::error!("{e}");
        return ExitCode::from(EXIT_USAGE);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    let parts = (tls, store, xds, stats_mapping);
    match runtime.block_on(serve_async(args, limits, parts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "cellrate stopped");
            // A path that holds another file is the configuration's fault.
            match e.is::<cellrate::server::unix_socket::UnixSocketError>() {
                true => ExitCode::from(EXIT_CONFIG),
                false => ExitCode::FAILURE,
            }
        }
    }
}

/// What `serve` read and checked before the runtime started: TLS files, the store, xDS,
/// the statistics mapping.
type ServeParts = (
    Option<cellrate::server::admin::TlsPem>,
    StoreSettings,
    Option<cellrate::server::xds::XdsSettings>,
    Option<Arc<cellrate::observe::metrics::StatsdMapping>>,
);

async fn serve_async(
    args: ServeArgs,
    limits: LimitTable,
    (tls, store, xds, stats_mapping): ServeParts,
) -> anyhow::Result<()> {
    // Installed before the ports are announced, so that an early SIGTERM still drains.
    let shutdown = cellrate::server::shutdown::signal();
    let listeners = args.bind().await?;
    let settings = cellrate::server::Settings {
        xds,
        stats_mapping,
        ..args.settings(tls, store)
    };
    let clock = Arc::new(cellrate::clock::SystemClock);
    cellrate::server::run(limits, listeners, clock, settings, shutdown).await?;
    tracing::info!("cellrate stopped");
    Ok(())
}

/// The libraries whose debug lines are their own workings (HTTP/2 frames, connection
/// states, TLS records, pool moves), not cellrate's: a level of debug or trace keeps them
/// at info. RUST_LOG names them when they are wanted (`RUST_LOG=debug,h2=trace`).
const QUIET_LIBRARIES: [&str; 8] = [
    "h2",
    "hyper",
    "hyper_util",
    "tower",
    "tonic",
    "rustls",
    "redis",
    "tokio_util",
];

/// The filter of a plain level (`LOG_LEVEL`, `--log-level`): that level for cellrate, and
/// at most info for [`QUIET_LIBRARIES`].
fn level_filter(level: &str) -> String {
    let mut filter = level.to_string();
    if matches!(level, "debug" | "trace") {
        for library in QUIET_LIBRARIES {
            filter.push_str(&format!(",{library}=info"));
        }
    }
    filter
}

/// Logging: RUST_LOG's filter, else `level` (the libraries under cellrate held at info, see
/// [`level_filter`]), else info.
fn init_tracing(format: LogFormat, level: Option<&str>) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(level_filter(level.unwrap_or("info")))
    });
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

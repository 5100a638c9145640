//! The `cellrate` binary: parse flags, start tracing, run a command, map failures to exit
//! codes, one set for every command (sysexits.h): 0 success, 64 the command line is wrong
//! (an unknown flag, a bad or missing value), 78 the configuration is (the limits
//! directory, the TLS files), 1 anything else (a port in use, a runtime failure).

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use cellrate::cli::{Cli, Command, LogFormat, ServeArgs};
use cellrate::limits::config::LimitTable;
use cellrate::server::StoreSettings;

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
    let store = match args.store(&limits) {
        Ok(store) => store,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "invalid store settings");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let tls = match args.tls() {
        Ok(tls) => tls,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "invalid TLS settings");
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
    match runtime.block_on(serve_async(args, limits, tls, store)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "cellrate stopped");
            ExitCode::FAILURE
        }
    }
}

async fn serve_async(
    args: ServeArgs,
    limits: LimitTable,
    tls: Option<cellrate::server::admin::TlsPem>,
    store: StoreSettings,
) -> anyhow::Result<()> {
    // Installed before the ports are announced, so that an early SIGTERM still drains.
    let shutdown = cellrate::server::shutdown::signal();
    let listeners = args.bind().await?;
    let settings = args.settings(tls, store);
    let clock = Arc::new(cellrate::clock::SystemClock);
    cellrate::server::run(limits, listeners, clock, settings, shutdown).await?;
    tracing::info!("cellrate stopped");
    Ok(())
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

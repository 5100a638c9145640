//! Command-line flags (each with an environment fallback). No logic here.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "cellrate",
    version,
    about = "Exact GCRA rate-limit decisions over gRPC"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// Log format.
    #[arg(
        long,
        global = true,
        env = "CELLRATE_LOG_FORMAT",
        default_value = "human"
    )]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve decisions (and the admin API on its own listener).
    Serve(ServeArgs),
    /// Check a limits directory: prints OK or every error; exit 0, or 64 if invalid.
    Validate {
        /// The limits directory.
        dir: PathBuf,
    },
    /// Run limits over a scripted timeline (JSON lines on stdin) on a fake clock.
    Simulate(SimulateArgs),
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Decision listener: cellrate.v1.RateLimiter, health, reflection.
    #[arg(long, env = "CELLRATE_LISTEN", default_value = "0.0.0.0:8081")]
    pub listen: SocketAddr,

    /// Admin listener: cellrate.v1.Admin (Reset, Inspect), health, reflection.
    #[arg(long, env = "CELLRATE_ADMIN_LISTEN", default_value = "127.0.0.1:8082")]
    pub admin_listen: SocketAddr,

    /// The limits directory.
    #[arg(long, env = "CELLRATE_CONFIG", default_value = "config/")]
    pub config: PathBuf,

    /// Bound on live buckets in the memory store.
    #[arg(long, env = "CELLRATE_MAX_BUCKETS", default_value_t = crate::store::memory::DEFAULT_MAX_BUCKETS)]
    pub max_buckets: usize,

    /// Rate-limit headers in Envoy responses (Retry-After is always sent on OVER_LIMIT).
    #[arg(
        long,
        env = "CELLRATE_RATE_LIMIT_HEADERS",
        value_enum,
        default_value = "off"
    )]
    pub rate_limit_headers: crate::service::envoy::HeaderStyle,

    /// Global shadow mode for Envoy: decide, spend and count, but always answer OK.
    #[arg(long, env = "CELLRATE_SHADOW")]
    pub shadow: bool,

    /// Seconds that in-flight RPCs may take to finish after SIGTERM.
    #[arg(long, env = "CELLRATE_GRACE_SECONDS", default_value_t = 10)]
    pub grace_seconds: u64,
}

#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// A limit to simulate, LABEL=BURST/COUNT/PERIOD, e.g. api=20/20/1s (repeatable).
    #[arg(long = "limit", value_name = "LABEL=BURST/COUNT/PERIOD")]
    pub limits: Vec<String>,

    /// A limits directory; buckets are then written Name:id.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

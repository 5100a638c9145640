//! Command-line flags (each with an environment fallback). No logic here. A `serve` flag's
//! default is read from the default of the setting it sets (`Settings::default()` and its
//! parts), so that it is written once: the in-process tests serve with those.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use super::flag_values::{
    parse_auth_addresses, parse_bucket_bytes, parse_client_san, parse_connection_age,
    parse_connection_grace, parse_period, parse_settle_max, parse_settle_window,
};
use crate::limits::duration::format_duration;
use crate::server::{ServerLimits, Settings};
use crate::service::rlqs::RlqsSettings;
use crate::service::CallerLimits;

/// The admin listener's address unless `--admin-listen` says otherwise (loopback only:
/// the admin API is for operators), and where `cellrate client` looks for it.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8082";

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
pub enum StoreKind {
    Memory,
    Redis,
    /// envoyproxy/ratelimit's fixed windows in memcached (its `BACKEND_TYPE=memcache`).
    Memcache,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve decisions (and the admin API on its own listener).
    Serve(Box<ServeArgs>),
    /// Check a limits directory: prints OK or every error; exit 0, or 78 if invalid.
    Validate {
        /// The limits directory.
        dir: PathBuf,
        /// Merge files of one domain in envoyproxy/ratelimit's format, as `serve
        /// --merge-domains` does.
        #[arg(long)]
        merge_domains: bool,
    },
    /// Run limits over a scripted timeline (JSON lines on stdin) on a fake clock.
    Simulate(SimulateArgs),
    /// Serve as envoyproxy/ratelimit does, configured by its environment variables (also
    /// what the binary does when run as `ratelimit`, e.g. the image's /bin/ratelimit).
    Ratelimit,
    /// Ask a running cellrate to spend (or only check) one bucket: exit 0 allowed, 2 denied.
    Check(ClientCheckArgs),
    /// Give tokens back to one bucket of a running cellrate.
    Refund(ClientItemArgs),
    /// Settle a check made with --request-id at what the work actually cost, once.
    Settle(ClientSettleArgs),
    /// Admin RPCs of a running cellrate, on its admin listener.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// A bucket as it stands, without spending.
    Inspect(ClientItemArgs),
    /// Empty a bucket (it is full again).
    Reset(ClientItemArgs),
    /// Who is being limited: the most denied ids per limit name (several --admin-addr:
    /// replicas merged).
    Top(TopArgs),
    /// Temporary overrides: set, clear, list (on every --admin-addr given).
    Override {
        #[command(subcommand)]
        command: OverrideCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum OverrideCommand {
    /// Give one id a limit, the allow list or the deny list until the TTL runs out.
    Set(OverrideSetArgs),
    /// Remove one id's temporary override.
    Clear(ClientItemArgs),
    /// The temporary overrides in force.
    List(OverrideListArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct OverrideSetArgs {
    /// The limit's name.
    pub name: String,
    /// The id.
    pub id: String,
    /// A limit: burst (with --count and --period).
    #[arg(long, requires_all = ["count", "period"], conflicts_with_all = ["unlimited", "deny"])]
    pub burst: Option<u64>,
    /// A limit: tokens refilled per period (or, with --calendar, allowed per window).
    #[arg(long, conflicts_with_all = ["unlimited", "deny"])]
    pub count: Option<u64>,
    /// A limit: the period (e.g. 1s, 1h).
    #[arg(long, requires = "burst", value_parser = parse_period)]
    pub period: Option<i64>,
    /// A calendar limit: --count per UTC window, one of 1s, 1m, 1h, 1d, 1mo, 1y.
    #[arg(long, requires = "count", conflicts_with_all = ["burst", "period", "unlimited", "deny"])]
    pub calendar: Option<String>,
    /// Always allowed.
    #[arg(long, conflicts_with = "deny")]
    pub unlimited: bool,
    /// Always denied.
    #[arg(long)]
    pub deny: bool,
    /// How long it holds (e.g. 30m, 2h).
    #[arg(long, value_parser = parse_period)]
    pub ttl: i64,
    /// Why (logged, reported by inspect).
    #[arg(long, default_value = "")]
    pub comment: String,
    /// Who (default: $USER, else $LOGNAME, else "uid N" for this process's user).
    #[arg(long, env = "USER")]
    pub author: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct OverrideListArgs {
    /// Only this limit name.
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct TopArgs {
    /// The window in minutes, ending now (1 to 15).
    #[arg(long, default_value_t = 5, conflicts_with = "in_flight")]
    pub minutes: u32,
    /// Ids per name (1 to 32).
    #[arg(long, default_value_t = 10)]
    pub limit: u32,
    /// Only this limit name.
    #[arg(long)]
    pub name: Option<String>,
    /// Instead of denials: the ids holding the most leases of concurrency limits now
    /// (memory store).
    #[arg(long)]
    pub in_flight: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// How the client commands reach a server.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// The decision listener (`host:port`, or a URL).
    #[arg(long, env = "CELLRATE_ADDR", default_value = "127.0.0.1:8081")]
    pub addr: String,

    /// The admin listener (`host:port`, or a URL). `admin top` takes several (repeat the
    /// flag, or separate with commas) and merges the replicas' counts.
    #[arg(
        long,
        env = "CELLRATE_ADMIN_ADDR",
        default_value = DEFAULT_ADMIN_LISTEN,
        value_delimiter = ','
    )]
    pub admin_addr: Vec<String>,

    /// Bearer token for admin RPCs (the server's variable).
    #[arg(long, env = "CELLRATE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// PEM CA certificate: connect with TLS, trusting this CA.
    #[arg(long, env = "CELLRATE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,

    /// The name the server's certificate must carry (default: the address's host).
    #[arg(long, env = "CELLRATE_TLS_DOMAIN", requires = "tls_ca")]
    pub tls_domain: Option<String>,

    /// PEM client certificate, for an admin listener that requires one (with --client-key).
    #[arg(long, env = "CELLRATE_CLIENT_CERT", requires_all = ["client_key", "tls_ca"])]
    pub client_cert: Option<PathBuf>,

    /// PEM key of the client certificate.
    #[arg(long, env = "CELLRATE_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,

    /// Seconds to wait for the server's answer.
    #[arg(long, env = "CELLRATE_CLIENT_TIMEOUT_SECONDS", default_value_t = 10)]
    pub timeout_seconds: u64,

    /// Print JSON (one object) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One bucket of a configured limit.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientItemArgs {
    /// The limit's name, e.g. NewOrdersPerAccount.
    pub name: String,
    /// The id, e.g. an account number.
    pub id: String,
    /// Tokens (default 1).
    #[arg(long)]
    pub cost: Option<u64>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ClientCheckArgs {
    #[command(flatten)]
    pub item: ClientItemArgs,
    /// check-and-spend (default), check-only (what a spend would get; spends nothing),
    /// spend-only (best effort: spent when the bucket has the tokens) or charge (always
    /// recorded, into debt if need be: a cost known only afterwards); on a concurrency
    /// limit acquire or release, with --lease-id.
    #[arg(long, value_enum, default_value = "check-and-spend")]
    pub mode: ClientMode,
    /// The lease an acquire takes or a release frees (1-128 printable ASCII bytes).
    #[arg(long)]
    pub lease_id: Option<String>,
    /// Keep an allowed check under this id, to settle it later (`cellrate settle`).
    #[arg(long)]
    pub request_id: Option<String>,
    /// Also show the HTTP rate-limit headers of the answer in this style (the native
    /// API's CheckRequest.headers): off, draft03, ietf, ratelimit or openai.
    #[arg(long, value_enum, default_value = "off")]
    pub headers: crate::service::headers::HeaderStyle,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ClientSettleArgs {
    /// The request id a check was kept under.
    pub request_id: String,
    /// What the work actually cost (the check's cost is charged or refunded to it).
    pub cost: u64,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClientMode {
    CheckAndSpend,
    CheckOnly,
    SpendOnly,
    Charge,
    Acquire,
    Release,
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Decision listener: cellrate.v1.RateLimiter, health, reflection.
    #[arg(long, env = "CELLRATE_LISTEN", default_value = "0.0.0.0:8081")]
    pub listen: SocketAddr,

    /// Serve the decision listener on this Unix socket instead of --listen (made mode
    /// 0660, removed at shutdown; a stale socket there is replaced, any other file is
    /// left and startup stops).
    #[arg(long, env = "CELLRATE_GRPC_UDS")]
    pub grpc_uds: Option<PathBuf>,

    /// Admin listener: cellrate.v1.Admin (Reset, Inspect, Top, SetOverride, ClearOverride,
    /// ListOverrides), health, reflection.
    #[arg(long, env = "CELLRATE_ADMIN_LISTEN", default_value = DEFAULT_ADMIN_LISTEN)]
    pub admin_listen: SocketAddr,
    /// `admin_listen` given by neither flag nor variable: taken, it moves (`serve.rs`).
    #[arg(skip)]
    pub admin_listen_defaulted: bool,

    /// Metrics listener (HTTP): /metrics, /healthz, /readyz.
    #[arg(long, env = "CELLRATE_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    pub metrics_listen: SocketAddr,

    /// A second HTTP listener with the same routes (/healthcheck for envoyproxy/ratelimit's
    /// probes; off unless given).
    #[arg(long, env = "CELLRATE_HEALTH_LISTEN")]
    pub health_listen: Option<SocketAddr>,

    /// envoyproxy/ratelimit's per-descriptor statistics also under the names and labels
    /// of a statsd_exporter mapping: `ratelimit` (envoyproxy/ratelimit's own:
    /// `ratelimit_service_rate_limit_total_hits{domain,key1,key2}` ...), or the path of a
    /// mapping file (its `PROMETHEUS_MAPPER_YAML`). Off unless given.
    #[arg(long, env = "CELLRATE_RATELIMIT_STATS_MAPPING")]
    pub ratelimit_stats_mapping: Option<String>,

    /// envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG: files of one domain in its format are
    /// merged (a top-level descriptor given twice is still refused) instead of refused.
    #[arg(long, env = "CELLRATE_MERGE_DOMAINS", default_value_t = false, action = clap::ArgAction::Set)]
    pub merge_domains: bool,

    /// Readiness (`/readyz`, `/healthcheck`) also needs limits in force: not ready until a
    /// load (files or xDS) holds a limit, nor while one holds none.
    #[arg(long, env = "CELLRATE_READY_NEEDS_LIMITS", default_value_t = false, action = clap::ArgAction::Set)]
    pub ready_needs_limits: bool,

    /// Keep envoyproxy/ratelimit's per-descriptor statistics (`cellrate_ratelimit_hits_total`
    /// and their mapped series); `false` is its DISABLE_STATS.
    #[arg(long, env = "CELLRATE_RATELIMIT_STATS", default_value_t = true, action = clap::ArgAction::Set)]
    pub ratelimit_stats: bool,

    /// Labels on every series, `name:value,name:value` (envoyproxy/ratelimit's
    /// EXTRA_TAGS): at most 16, each value printable, without `,` or `:`, at most 256
    /// bytes; a series with a label of that name keeps its own.
    #[arg(long, env = "CELLRATE_METRICS_LABELS", default_value = "", value_parser = crate::observe::metrics::ExtraLabels::parse)]
    pub metrics_labels: crate::observe::metrics::ExtraLabels,

    /// The path the metrics are served at on the metrics (and health) listener:
    /// `/` then letters, digits and `/_.~-`, at most 256 bytes, not a probe's path.
    #[arg(long, env = "CELLRATE_METRICS_PATH", default_value = "/metrics", value_parser = super::serve::parse_metrics_path)]
    pub metrics_path: String,

    /// Redis-protocol listener: `CL.THROTTLE` as redis-cell answers it, for any Redis
    /// client. Off unless given.
    #[arg(long, env = "CELLRATE_RESP_LISTEN")]
    pub resp_listen: Option<SocketAddr>,

    /// Token Redis clients must give (`AUTH <token>`, or `HELLO 3 AUTH default <token>`)
    /// before any command on the Redis-protocol listener.
    #[arg(long, env = "CELLRATE_RESP_TOKEN", hide_env_values = true)]
    pub resp_token: Option<String>,

    /// Open connections at most on the Redis-protocol listener.
    #[arg(long, env = "CELLRATE_RESP_MAX_CONNECTIONS", default_value_t = ServerLimits::default().resp.max_connections)]
    pub resp_max_connections: usize,

    /// With --resp-token: wrong tokens one client address may give at once, across its
    /// connections (then one more every period / burst).
    #[arg(long, env = "CELLRATE_RESP_AUTH_FAILURE_BURST", default_value_t = crate::resp::lockout::FAILURE_BURST, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub resp_auth_failure_burst: u64,

    /// With --resp-token: seconds for an address's allowance of wrong tokens to refill.
    #[arg(long, env = "CELLRATE_RESP_AUTH_FAILURE_PERIOD_SECONDS", default_value_t = crate::resp::lockout::FAILURE_PERIOD.as_secs(), value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub resp_auth_failure_period_seconds: u64,

    /// With --resp-token: client addresses whose wrong tokens are counted apart; beyond,
    /// the others share one allowance.
    #[arg(long, env = "CELLRATE_RESP_AUTH_MAX_ADDRESSES", default_value_t = crate::resp::lockout::MAX_ADDRESSES, value_parser = parse_auth_addresses)]
    pub resp_auth_max_addresses: usize,

    /// The limits directory (reloaded when it changes, on SIGHUP and on a timer).
    #[arg(long, env = "CELLRATE_CONFIG", default_value = "config/")]
    pub config: PathBuf,

    /// No limits directory at all (`--config` unread): limits from xDS alone. Not a flag:
    /// set by the `ratelimit` personality for `CONFIG_TYPE=GRPC_XDS_SOTW`.
    #[arg(skip)]
    pub no_limits_dir: bool,

    /// Watch the limits directory for changes (false: SIGHUP and the timer only).
    #[arg(long, env = "CELLRATE_WATCH_CONFIG", default_value_t = true, action = clap::ArgAction::Set)]
    pub watch_config: bool,

    /// Re-read the limits directory this often, whatever the watcher says.
    #[arg(long, env = "CELLRATE_RELOAD_INTERVAL_SECONDS", default_value_t = 60)]
    pub reload_interval_seconds: u64,

    /// Quiet time after the last file event before a reload, in milliseconds.
    #[arg(long, env = "CELLRATE_RELOAD_DEBOUNCE_MS", default_value_t = 200)]
    pub reload_debounce_ms: u64,

    /// Bearer token required on every admin RPC (Reset, Inspect, Top, SetOverride,
    /// ClearOverride, ListOverrides).
    #[arg(long, env = "CELLRATE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// TLS certificate (PEM) for both gRPC listeners; needs --tls-key.
    #[arg(long, env = "CELLRATE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// TLS private key (PEM) for both gRPC listeners; needs --tls-cert.
    #[arg(long, env = "CELLRATE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// CA (PEM) whose client certificates the admin listener requires (mTLS); needs TLS.
    #[arg(long, env = "CELLRATE_ADMIN_CLIENT_CA", requires = "tls_cert")]
    pub admin_client_ca: Option<PathBuf>,

    /// CA (PEM) whose client certificates the decision listener requires (mTLS).
    #[arg(long, env = "CELLRATE_CLIENT_CA", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,

    /// The name (a DNS name or an IP address) a decision-listener client certificate must
    /// bear among its subject alternative names, besides being signed by --client-ca.
    #[arg(long, env = "CELLRATE_CLIENT_SAN", requires = "client_ca", value_parser = parse_client_san)]
    pub client_san: Option<String>,

    /// Where buckets live: this process's memory, Redis shared by replicas, or memcached
    /// (envoyproxy/ratelimit's fixed windows only).
    #[arg(long, env = "CELLRATE_STORE", value_enum, default_value = "memory")]
    pub store: StoreKind,

    #[command(flatten)]
    pub redis: super::redis_args::RedisArgs,

    #[command(flatten)]
    pub memcache: super::memcache_args::MemcacheArgs,

    /// Bound on live buckets in the memory store (Redis: on the keys a replica writes).
    #[arg(long, env = "CELLRATE_MAX_BUCKETS", default_value_t = crate::store::memory::DEFAULT_MAX_BUCKETS)]
    pub max_buckets: usize,

    #[command(flatten)]
    pub shares: super::shares::ShareArgs,

    /// The memory store's snapshot file: its buckets are restored from it at start (a
    /// missing or unusable file: one warning, an empty store) and written to it at graceful
    /// shutdown, so that a restart does not refill every bucket.
    #[arg(long, env = "CELLRATE_SNAPSHOT_FILE")]
    pub snapshot_file: Option<PathBuf>,

    /// With --snapshot-file: also write it this often while serving, in seconds (a crash
    /// then loses at most this much); 0: only at shutdown.
    #[arg(long, env = "CELLRATE_SNAPSHOT_INTERVAL_SECONDS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub snapshot_interval_seconds: u64,

    /// Accept limits given by callers (native inline limits, Envoy descriptor `limit`s).
    /// Off: inline limits are INVALID_ARGUMENT and descriptor limits are ignored.
    #[arg(long, env = "CELLRATE_CALLER_LIMITS", default_value_t = CallerLimits::default().enabled, action = clap::ArgAction::Set)]
    pub caller_limits: bool,

    /// Longest period (and time to refill a full burst) of a caller-given limit, e.g. 1h.
    /// The default takes every Envoy unit up to YEAR and redis-cell's yearly quotas.
    #[arg(long, env = "CELLRATE_CALLER_LIMIT_MAX_PERIOD", default_value = format_duration(CallerLimits::default().max_period), value_parser = parse_period)]
    pub caller_limit_max_period: i64,

    /// Largest burst of a caller-given limit.
    #[arg(long, env = "CELLRATE_CALLER_LIMIT_MAX_BURST", default_value_t = CallerLimits::default().max_burst)]
    pub caller_limit_max_burst: u64,

    /// Temporary overrides (admin SetOverride) in force at most.
    #[arg(long, env = "CELLRATE_MAX_RUNTIME_OVERRIDES", default_value_t = Settings::default().max_runtime_overrides)]
    pub max_runtime_overrides: usize,

    /// Longest lifetime of a temporary override (e.g. 7d).
    #[arg(long, env = "CELLRATE_MAX_OVERRIDE_TTL", default_value = format_duration(Settings::default().max_override_ttl), value_parser = parse_period)]
    pub max_override_ttl: i64,

    /// How long a Check made with a request id is kept for Settle (1s to 7d).
    #[arg(long, env = "CELLRATE_SETTLE_WINDOW", default_value = format_duration(Settings::default().settle_window), value_parser = parse_settle_window)]
    pub settle_window: i64,

    /// Checks kept for Settle at most (each at most 1 KiB); beyond, the oldest that are no live holds are pushed out.
    #[arg(long, env = "CELLRATE_SETTLE_MAX_RECORDS", default_value_t = Settings::default().settle_max_records, value_parser = parse_settle_max)]
    pub settle_max_records: usize,

    /// Envoy RLQS streams open at once, at most (more are RESOURCE_EXHAUSTED).
    #[arg(long, env = "CELLRATE_RLQS_MAX_STREAMS", default_value_t = RlqsSettings::default().max_streams)]
    pub rlqs_max_streams: usize,

    /// Envoy RLQS buckets tracked over every stream, at most (more get no assignment).
    #[arg(long, env = "CELLRATE_RLQS_MAX_BUCKETS", default_value_t = RlqsSettings::default().max_buckets)]
    pub rlqs_max_buckets: usize,

    /// Envoy RLQS buckets tracked per stream, at most.
    #[arg(long, env = "CELLRATE_RLQS_MAX_BUCKETS_PER_STREAM", default_value_t = RlqsSettings::default().max_buckets_per_stream)]
    pub rlqs_max_buckets_per_stream: usize,

    /// Bytes of RLQS bucket ids tracked at most, over every stream (each id's text plus
    /// 128); a new bucket beyond is refused as beyond --rlqs-max-buckets is.
    #[arg(long, env = "CELLRATE_RLQS_MAX_BUCKET_BYTES", default_value_t = RlqsSettings::default().max_bucket_bytes, value_parser = parse_bucket_bytes)]
    pub rlqs_max_bucket_bytes: usize,

    /// Lifetime of an RLQS assignment in Envoy, in seconds.
    #[arg(long, env = "CELLRATE_RLQS_ASSIGNMENT_TTL_SECONDS", default_value_t = RlqsSettings::default().assignment_ttl.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub rlqs_assignment_ttl_seconds: u64,

    /// An RLQS stream silent this long is ended, and a bucket without requests this long is
    /// abandoned, in seconds.
    #[arg(long, env = "CELLRATE_RLQS_IDLE_SECONDS", default_value_t = RlqsSettings::default().idle.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub rlqs_idle_seconds: u64,

    /// With --store redis: how often each replica exchanges its RLQS demand with the others,
    /// in milliseconds.
    #[arg(long, env = "CELLRATE_RLQS_SYNC_MS", default_value_t = RlqsSettings::default().sync.as_millis() as u64, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub rlqs_sync_ms: u64,

    #[command(flatten)]
    pub buckets: super::bucket_args::BucketArgs,

    #[command(flatten)]
    pub envoy: super::envoy_args::EnvoyArgs,

    /// Open connections at most on the decision listener (more wait in the backlog).
    #[arg(long, env = "CELLRATE_MAX_CONNECTIONS", default_value_t = ServerLimits::default().decisions.max_connections)]
    pub max_connections: usize,

    /// Open connections at most on the admin listener.
    #[arg(long, env = "CELLRATE_ADMIN_MAX_CONNECTIONS", default_value_t = ServerLimits::default().admin.max_connections)]
    pub admin_max_connections: usize,

    /// Open connections at most on the metrics listener.
    #[arg(long, env = "CELLRATE_METRICS_MAX_CONNECTIONS", default_value_t = ServerLimits::default().metrics.max_connections)]
    pub metrics_max_connections: usize,

    /// Open connections from one client address at most, on every listener (an IPv6
    /// address counts by its /64), and never more than a quarter of that listener's own
    /// bound (at least 1); more are closed as they are accepted. 0: no per-address bound.
    /// Raise it when many clients reach cellrate through one NAT or proxy address.
    #[arg(long, env = "CELLRATE_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = crate::server::listener::DEFAULT_MAX_PER_ADDRESS)]
    pub max_connections_per_address: usize,

    /// Seconds a new connection has to send its first bytes (HTTP/1: its headers; TLS: its
    /// whole handshake).
    #[arg(long, env = "CELLRATE_HANDSHAKE_TIMEOUT_SECONDS", default_value_t = ServerLimits::default().decisions.handshake_timeout.as_secs())]
    pub handshake_timeout_seconds: u64,

    /// Seconds without a byte from a gRPC client before its connection is closed.
    #[arg(long, env = "CELLRATE_IDLE_TIMEOUT_SECONDS", default_value_t = ServerLimits::default().decisions.idle_timeout.as_secs())]
    pub idle_timeout_seconds: u64,

    /// Concurrent HTTP/2 streams per gRPC connection.
    #[arg(long, env = "CELLRATE_MAX_STREAMS_PER_CONNECTION", default_value_t = ServerLimits::default().max_streams_per_connection)]
    pub max_streams_per_connection: u32,

    /// Requests handled at once per gRPC listener; more get UNAVAILABLE at once.
    #[arg(long, env = "CELLRATE_MAX_IN_FLIGHT", default_value_t = ServerLimits::default().max_in_flight)]
    pub max_in_flight: usize,

    /// How ShouldRateLimit and Check are served: by hand (direct) or by tonic's unary code.
    #[arg(
        long,
        env = "CELLRATE_GRPC_UNARY",
        value_enum,
        default_value = "direct"
    )]
    pub grpc_unary: crate::grpc::Unary,

    /// Longest a unary gRPC request's body may take once the server waits for it, in ms.
    #[arg(long, env = "CELLRATE_REQUEST_BODY_TIMEOUT_MS", default_value_t = ServerLimits::default().body_timeout.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_body_timeout_ms: u64,

    /// Longest a gRPC request may take, body included, in milliseconds.
    #[arg(long, env = "CELLRATE_REQUEST_TIMEOUT_MS", default_value_t = ServerLimits::default().request_timeout.as_millis() as u64)]
    pub request_timeout_ms: u64,

    /// The longest a gRPC connection lives (e.g. 30m, 24h): each connection draws its own
    /// age, this ±10 %, and then gets a graceful GOAWAY (calls in flight finish, new calls
    /// reconnect, so that clients spread over replicas added since). Unset: no end.
    #[arg(long, env = "CELLRATE_GRPC_MAX_CONNECTION_AGE", value_parser = parse_connection_age)]
    pub grpc_max_connection_age: Option<i64>,

    /// With --grpc-max-connection-age: how long after its GOAWAY a connection is closed
    /// hard, calls still in flight with it (e.g. 1h; 0s: at once). Unset: never.
    #[arg(long, env = "CELLRATE_GRPC_MAX_CONNECTION_AGE_GRACE", requires = "grpc_max_connection_age", value_parser = parse_connection_grace)]
    pub grpc_max_connection_age_grace: Option<i64>,

    /// Seconds that health reports NOT_SERVING, still serving, after SIGTERM.
    #[arg(long, env = "CELLRATE_SHUTDOWN_DELAY_SECONDS", default_value_t = Settings::default().shutdown_delay.as_secs())]
    pub shutdown_delay_seconds: u64,

    /// Seconds that in-flight RPCs may then take to finish.
    #[arg(long, env = "CELLRATE_GRACE_SECONDS", default_value_t = Settings::default().grace.as_secs())]
    pub grace_seconds: u64,

    #[command(flatten)]
    pub xds: super::xds_args::XdsArgs,
}

#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// A limit to simulate, LABEL=BURST/COUNT/PERIOD, e.g. api=20/20/1s, or a calendar
    /// limit LABEL=COUNT/WINDOW, e.g. monthly=1000000/1mo (repeatable).
    #[arg(long = "limit", value_name = "LABEL=BURST/COUNT/PERIOD")]
    pub limits: Vec<String>,

    /// A limits directory; buckets are then written Name:id.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

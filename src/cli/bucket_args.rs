//! `cellrate serve`'s flags for the shares of the memory store's bucket table, and of the
//! bucket keys a Redis store's replica writes (`--max-buckets` is with the other bounds).

#[derive(Debug, Clone, clap::Args)]
pub struct BucketArgs {
    /// Percent of --max-buckets that buckets under caller-given limits may hold.
    #[arg(long, env = "CELLRATE_CALLER_LIMIT_BUCKET_SHARE", default_value_t = crate::store::memory::DEFAULT_CALLER_SHARE_PERCENT as u8, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub caller_limit_bucket_share: u8,

    /// Percent of the configured limits' buckets (--max-buckets less the caller-given
    /// share) that one limit name's buckets may hold: a name's new ids are denied once its
    /// share is full, other names keep theirs (100: no share).
    #[arg(long, env = "CELLRATE_BUCKET_NAME_SHARE", default_value_t = crate::store::memory::DEFAULT_BUCKET_NAME_SHARE_PERCENT as u8, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub bucket_name_share: u8,
}

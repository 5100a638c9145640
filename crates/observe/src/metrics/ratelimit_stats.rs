//! envoyproxy/ratelimit's per-descriptor statistics as series: a key admitted to the
//! bounded key space ([`super::ratelimit_keys`]) once, then each statistic counted under it,
//! in `cellrate_ratelimit_hits_total` and in the series a statsd mapping names.

use std::sync::Arc;

use prometheus::{IntCounterVec, Registry};

use super::groups::Reg;
use super::statsd_mapping::{self, StatsdMapping};
use super::{ratelimit_keys, Metrics};

/// envoyproxy/ratelimit's per-descriptor statistics.
pub const RATELIMIT_STATS: [&str; 6] = [
    "total_hits",
    "total_negative_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];

/// envoyproxy/ratelimit's statistics, and the keys that have series.
pub(super) struct RatelimitStats {
    hits: IntCounterVec,
    keys: ratelimit_keys::KeySpace,
    /// The statsd mapping and its families of series (`None` where one failed to
    /// register), if one is given.
    mapping: Option<(Arc<StatsdMapping>, Vec<Option<IntCounterVec>>)>,
    /// The overflow key's mapped series.
    overflow: ratelimit_keys::MappedSeries,
    /// Whether they are kept (not with DISABLE_STATS).
    enabled: bool,
}

impl RatelimitStats {
    /// The statistics' series registered, the mapping's families with them; the overflow
    /// key's series at zero from the start (unless not `enabled`: DISABLE_STATS).
    pub(super) fn new(
        reg: &Reg<'_>,
        mapping: Option<Arc<StatsdMapping>>,
        enabled: bool,
    ) -> RatelimitStats {
        let stats = RatelimitStats {
            hits: reg.counters(
                "cellrate_ratelimit_hits_total",
                "envoyproxy/ratelimit's per-descriptor statistics: key (its statistics key), \
                 stat (total_hits, total_negative_hits, over_limit, near_limit, within_limit, \
                 shadow_mode).",
                &["key", "stat"],
            ),
            keys: ratelimit_keys::KeySpace::default(),
            mapping: mapping.map(|m| {
                let families = m.families().iter().map(|f| mapped_family(reg.0, f));
                let families = families.collect();
                (m, families)
            }),
            overflow: None,
            enabled,
        };
        let stats = RatelimitStats {
            overflow: stats.mapped(ratelimit_keys::OVERFLOW),
            ..stats
        };
        // At zero from the start: an alert on the cap needs the series before it fills.
        for stat in RATELIMIT_STATS.iter().filter(|_| enabled) {
            stats
                .hits
                .with_label_values(&[ratelimit_keys::OVERFLOW, stat]);
        }
        stats
    }

    /// The series the statistics of `key` count in under the statsd mapping.
    fn mapped(&self, key: &str) -> ratelimit_keys::MappedSeries {
        let (mapping, families) = self.mapping.as_ref()?;
        let series: Vec<Option<prometheus::IntCounter>> = RATELIMIT_STATS
            .iter()
            .map(|stat| {
                let to = mapping.map(&statsd_mapping::statsd_name(key, stat))?;
                let values: Vec<&str> = to.values.iter().map(String::as_str).collect();
                let family = families.get(to.family)?.as_ref()?;
                family.get_metric_with_label_values(&values).ok()
            })
            .collect();
        Some(series.into())
    }
}

/// A statistics key that has been bounded, escaped and given its place in the key space
/// ([`Metrics::ratelimit_key`]): the only key [`Metrics::ratelimit_stat`] counts under.
pub struct RatelimitKey<'k>(std::borrow::Cow<'k, str>, ratelimit_keys::MappedSeries);

impl Metrics {
    /// The key envoyproxy/ratelimit's statistics of `key` count under: bounded and escaped
    /// ([`ratelimit_keys::shown`]), and `overflow` once [`MAX_RATELIMIT_KEYS`] keys or
    /// [`MAX_KEYS_BYTES`] bytes of keys have series (`detailed_metric` and a descriptor's
    /// own `limit` put request values in keys).
    pub fn ratelimit_key<'k>(&self, key: &'k str) -> RatelimitKey<'k> {
        if !self.ratelimit.enabled {
            return RatelimitKey(std::borrow::Cow::Borrowed(""), None);
        }
        let shown = ratelimit_keys::shown(key);
        match self
            .ratelimit
            .keys
            .admit(&shown, |k| self.ratelimit.mapped(k))
        {
            Some(mapped) => RatelimitKey(shown, mapped),
            None => RatelimitKey(
                std::borrow::Cow::Borrowed(ratelimit_keys::OVERFLOW),
                self.ratelimit.overflow.clone(),
            ),
        }
    }

    /// Adds `n` to envoyproxy/ratelimit's statistic `stat` of `key`.
    pub fn ratelimit_stat(&self, key: &RatelimitKey<'_>, stat: &str, n: u64) {
        if n == 0 || !self.ratelimit.enabled {
            return;
        }
        self.ratelimit
            .hits
            .with_label_values(&[key.0.as_ref(), stat])
            .inc_by(n);
        let mapped = key.1.as_ref().and_then(|series| {
            let i = RATELIMIT_STATS.iter().position(|s| *s == stat)?;
            series.get(i)?.as_ref()
        });
        if let Some(counter) = mapped {
            counter.inc_by(n);
        }
    }
}

/// A statsd mapping's family of series, registered (`None`, logged, if the registry
/// refuses it: the mapping's checks leave no name cellrate uses).
fn mapped_family(registry: &Registry, family: &statsd_mapping::Family) -> Option<IntCounterVec> {
    let labels: Vec<&str> = family.labels.iter().map(String::as_str).collect();
    let opts = prometheus::Opts::new(family.name.as_str(), family.help.as_str());
    let made = IntCounterVec::new(opts, &labels)
        .and_then(|vec| registry.register(Box::new(vec.clone())).map(|()| vec));
    made.map_err(
        |e| tracing::error!(name = %family.name, error = %e, "a mapped metric is not exported"),
    )
    .ok()
}

#[cfg(test)]
mod tests {
    use super::super::{ExtraLabels, MAX_RATELIMIT_KEYS};
    use super::*;

    #[test]
    fn ratelimit_statistics_keys_are_bounded() {
        let metrics = Metrics::new();
        for i in 0..MAX_RATELIMIT_KEYS + 5 {
            let key = format!("rl.user_{i}");
            metrics.ratelimit_stat(&metrics.ratelimit_key(&key), "total_hits", 1);
        }
        // A key seen before keeps its series when the set is full.
        metrics.ratelimit_stat(&metrics.ratelimit_key("rl.user_0"), "total_hits", 1);
        let text = metrics.render();
        let series = text
            .lines()
            .filter(|l| l.starts_with("cellrate_ratelimit_hits_total{"))
            .count();
        // The cap, plus overflow's series (at zero from the start).
        assert_eq!(series, MAX_RATELIMIT_KEYS + RATELIMIT_STATS.len());
        assert!(
            text.contains("cellrate_ratelimit_hits_total{key=\"overflow\",stat=\"total_hits\"} 5")
        );
        assert!(
            text.contains("cellrate_ratelimit_hits_total{key=\"rl.user_0\",stat=\"total_hits\"} 2")
        );
    }

    /// Plays the attacker: descriptor values reach the mapped series' labels (through
    /// `detailed_metric`), so they stay inside the bounded key space and cannot write
    /// label syntax into the exposition.
    #[test]
    fn mapped_series_are_bounded_by_the_key_space_and_carry_no_label_syntax() {
        let mapping = StatsdMapping::parse(statsd_mapping::RATELIMIT_DEFAULT).unwrap();
        let metrics = Metrics::configured(Some(Arc::new(mapping)), ExtraLabels::default(), true);
        let hostile = "v\",evil=\"1\"} 999\nratelimit_service_rate_limit_total_hits{x=\"";
        for i in 0..MAX_RATELIMIT_KEYS + 100 {
            let key = format!("edge.user_{i}{hostile}.plan_gold");
            metrics.ratelimit_stat(&metrics.ratelimit_key(&key), "total_hits", 1);
        }
        let text = metrics.render();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
            .collect();
        assert_eq!(
            series.len(),
            MAX_RATELIMIT_KEYS,
            "one series per admitted key"
        );
        assert!(!text.contains("evil=\"1\""), "no label injected");
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{x=")),
            "no line injected"
        );
        for line in &series {
            assert!(line.ends_with("} 1"), "{line}");
            assert!(line.contains("domain=\"edge\""), "{line}");
            assert!(line.contains(",key2=\"plan_gold\"}"), "{line}");
        }
    }
}

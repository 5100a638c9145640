//! Labels added to every series (envoyproxy/ratelimit's `EXTRA_TAGS`, tags it adds to every
//! statistic): parsed and bounded here, added when the metrics are rendered.

use prometheus::proto::{LabelPair, MetricFamily};

/// The most labels.
pub(super) const MAX_LABELS: usize = 16;
/// The longest label value, in bytes.
pub(super) const MAX_VALUE_BYTES: usize = 256;

/// Labels added to every series, in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraLabels(pub Vec<(String, String)>);

impl ExtraLabels {
    /// `name:value,name:value` (envoyproxy/ratelimit's, Go envconfig's map syntax; empty:
    /// none). A name is a Prometheus label name not starting `__`, given once; a value
    /// printable, without `,` or `:`, at most `MAX_VALUE_BYTES`.
    pub fn parse(text: &str) -> Result<ExtraLabels, String> {
        if text.is_empty() {
            return Ok(ExtraLabels::default());
        }
        let mut labels: Vec<(String, String)> = Vec::new();
        for pair in text.split(',') {
            let shown = cellrate_core::text::printable(cellrate_core::text::first_chars(pair, 80));
            let Some((name, value)) = pair.split_once(':').filter(|(_, v)| !v.contains(':')) else {
                return Err(format!("{shown:?}: not name:value"));
            };
            let mut chars = name.chars();
            let first = chars.next();
            let valid = first.is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with("__");
            if !valid || name.len() > MAX_VALUE_BYTES {
                return Err(format!("{shown:?}: {name:?} is not a label name"));
            }
            if value.len() > MAX_VALUE_BYTES
                || cellrate_core::text::first_unprintable(value).is_some()
            {
                return Err(format!(
                    "{shown:?}: a value is printable, at most {MAX_VALUE_BYTES} bytes"
                ));
            }
            if labels.iter().any(|(n, _)| n == name) {
                return Err(format!("{name}: given twice"));
            }
            labels.push((name.to_string(), value.to_string()));
        }
        if labels.len() > MAX_LABELS {
            return Err(format!("{} labels: at most {MAX_LABELS}", labels.len()));
        }
        Ok(ExtraLabels(labels))
    }

    /// Adds the labels to every series of `families`; a series that has a label of that
    /// name keeps its own.
    pub(super) fn add_to(&self, families: &mut [MetricFamily]) {
        if self.0.is_empty() {
            return;
        }
        for family in families {
            for metric in family.mut_metric() {
                let mut labels = metric.take_label();
                for (name, value) in &self.0 {
                    if labels.iter().all(|l| l.name() != name) {
                        let mut pair = LabelPair::default();
                        pair.set_name(name.clone());
                        pair.set_value(value.clone());
                        labels.push(pair);
                    }
                }
                metric.set_label(labels);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_tags_parse_as_upstream_and_bad_ones_are_refused() {
        let labels = ExtraLabels::parse("env:prod,cluster:eu-1").unwrap();
        let pairs = [("env", "prod"), ("cluster", "eu-1")].map(|(n, v)| (n.into(), v.into()));
        assert_eq!(labels.0, pairs);
        assert_eq!(ExtraLabels::parse("").unwrap(), ExtraLabels::default());
        for (bad, says) in [
            ("env", "not name:value"),
            ("env:a:b", "not name:value"),
            ("env:prod,", "not name:value"),
            ("1env:prod", "not a label name"),
            ("__name__:x", "not a label name"),
            ("a-b:x", "not a label name"),
            ("env:\u{1b}[2J", "printable"),
            ("env:a,env:b", "given twice"),
        ] {
            let error = ExtraLabels::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
        let long = format!("env:{}", "x".repeat(MAX_VALUE_BYTES + 1));
        assert!(ExtraLabels::parse(&long).is_err());
        let many: Vec<String> = (0..=MAX_LABELS).map(|i| format!("l{i}:v")).collect();
        let error = ExtraLabels::parse(&many.join(",")).unwrap_err();
        assert!(error.contains("at most"), "{error}");
    }
}

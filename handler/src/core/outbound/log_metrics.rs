//! The metrics of [`metrics::CATALOG`] as Cloud Logging entries, for Cloud
//! Run: Cloud Logging reads each JSON line on stdout as one entry, and the
//! GCP module's log-based metrics count them. A log-based counter counts
//! entries, not the values in them, so a count of n is n entries; a latency
//! is one entry with its value, which a distribution metric extracts.

use serde_json::{Map, Value, json};

use crate::core::outbound::metrics::{self, Measured, counts};
use crate::core::outbound::report::Report;

/// The field every entry names its metric in (the log-based metrics'
/// filter reads it).
pub const METRIC_FIELD: &str = "metric";

/// No invocation writes more entries of one count than this: a bound on
/// the log volume of a report with very many nodes (a count beyond it is
/// undercounted, and logged as it is in the report).
const MAX_ENTRIES_PER_COUNT: u64 = 1000;

/// The entries of one invocation; `report` is `None` when it failed before
/// deciding anything. Each carries `Function` (the service), the metric's
/// dimensions, and the correlation id.
pub fn log_lines(
    service: &str,
    correlation_id: &str,
    report: Option<&Report>,
    measured: &Measured,
) -> Vec<Value> {
    let mut lines = Vec::new();
    let entry = |metric: &str, dimensions: &[(&str, &str)], value: Option<f64>| {
        let mut line = Map::new();
        line.insert("severity".into(), json!("INFO"));
        line.insert("message".into(), json!(format!("metric {metric}")));
        line.insert(METRIC_FIELD.into(), json!(metric));
        line.insert("Function".into(), json!(service));
        for (k, v) in dimensions {
            line.insert((*k).into(), json!(v));
        }
        if let Some(value) = value {
            line.insert("value".into(), json!(value));
        }
        line.insert("CorrelationId".into(), json!(correlation_id));
        Value::Object(line)
    };
    let mut counted = |metric: &str, dimensions: &[(&str, &str)], n: u64| {
        for _ in 0..n.min(MAX_ENTRIES_PER_COUNT) {
            lines.push(entry(metric, dimensions, None));
        }
    };
    for (metric, dimensions, n) in report.map(counts).unwrap_or_default() {
        counted(metric, &dimensions, n);
    }
    for (dependency, n) in &measured.errors {
        counted("Errors", &[("Dependency", dependency.name())], *n);
    }
    let detached = report.map_or(0, metrics::volumes_detached);
    counted(
        "VolumesDetached",
        &[],
        u64::try_from(detached).unwrap_or(u64::MAX),
    );
    for (stage, took) in &measured.stages {
        let ms = took.as_secs_f64() * 1000.0;
        lines.push(entry(stage.metric(), &[], Some(ms)));
    }
    lines
}

/// True when `metric` is a latency (a distribution), false for a count.
pub fn is_latency(metric: &str) -> bool {
    metrics::CATALOG
        .iter()
        .any(|(name, unit, _)| *name == metric && *unit == "Milliseconds")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::core::inbound::suspect::Origin;
    use crate::core::outbound::metrics::{CATALOG, Dependency, Meter, Stage};
    use crate::core::outbound::report::{NodeReport, Outcome, VolumeReport};

    fn fenced(detached: usize) -> NodeReport {
        NodeReport {
            origins: vec![Origin::Sweep],
            volumes: VolumeReport::detached(detached),
            ..NodeReport::of("n", Outcome::Fenced)
        }
    }

    #[test]
    fn a_count_of_n_is_n_entries_and_a_latency_one_with_its_value() {
        let meter = Meter::default();
        meter.error(Dependency::PubSub);
        meter.error(Dependency::PubSub);
        meter.stage(Stage::Taint, Duration::from_millis(12));
        let report = Report::of("c", vec![fenced(3), fenced(0)]);
        let lines = log_lines("svc", "c", Some(&report), &meter.measured());
        let of = |metric: &str| -> Vec<&Value> {
            lines.iter().filter(|l| l[METRIC_FIELD] == metric).collect()
        };
        assert_eq!(of("Decisions").len(), 2);
        assert_eq!(of("Decisions")[0]["Outcome"], "fenced");
        assert_eq!(of("Suspects").len(), 2);
        assert_eq!(of("VolumesDetached").len(), 3);
        assert_eq!(of("Errors").len(), 2);
        assert_eq!(of("Errors")[0]["Dependency"], "PubSub");
        assert_eq!(of("TaintLatency")[0]["value"], json!(12.0));
        assert!(
            lines
                .iter()
                .all(|l| l["Function"] == "svc" && l["CorrelationId"] == "c")
        );
    }

    /// Every entry names a metric of the catalog and carries exactly its
    /// dimensions, so the log-based metrics built from the manifest read
    /// every label they declare.
    #[test]
    fn every_entry_carries_its_catalog_metrics_dimensions() {
        let meter = Meter::default();
        meter.error(Dependency::Kubernetes);
        for stage in [Stage::Confirm, Stage::Taint, Stage::Detach, Stage::Verify] {
            meter.stage(stage, Duration::from_millis(5));
        }
        let report = Report::of("c", vec![fenced(1)]);
        let fixed = [
            "severity",
            "message",
            METRIC_FIELD,
            "Function",
            "CorrelationId",
        ];
        for line in log_lines("svc", "c", Some(&report), &meter.measured()) {
            let name = line[METRIC_FIELD].as_str().expect("a metric");
            let (_, _, dims) = CATALOG
                .iter()
                .find(|(n, ..)| *n == name)
                .unwrap_or_else(|| panic!("{name} is not in the catalog"));
            let mut keys: Vec<&str> = line
                .as_object()
                .expect("an object")
                .keys()
                .map(String::as_str)
                .filter(|k| !fixed.contains(k) && *k != "value")
                .collect();
            keys.sort_unstable();
            let mut want = dims.to_vec();
            want.sort_unstable();
            assert_eq!(keys, want, "{name}: {line}");
            assert_eq!(line.get("value").is_some(), is_latency(name), "{line}");
        }
    }

    #[test]
    fn a_failed_invocation_still_counts_its_errors() {
        let meter = Meter::default();
        meter.error(Dependency::Kubernetes);
        let lines = log_lines("svc", "c", None, &meter.measured());
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0]["Dependency"], "Kubernetes");
    }
}

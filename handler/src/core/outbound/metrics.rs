//! CloudWatch metrics as Embedded Metric Format (EMF) log lines: CloudWatch
//! Logs turns each line into metrics, so counting costs no API call, no
//! permission and no latency.
//!
//! One invocation writes one line per dimension set, because an EMF document
//! carries one value per dimension: suspects per trigger, decisions per
//! outcome and reason, errors per dependency, and one line with the volumes
//! detached and the latency of each stage.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::core::model::instance::Provider;
use crate::core::outbound::report::{Outcome, Report, VolumeOutcome};
use crate::core::rules::power::Refusal;
use crate::core::rules::recovery::Hold;

/// The CloudWatch namespace of every metric.
pub const NAMESPACE: &str = "NodeFencer";

/// Every metric node-fencer emits: its name, its unit, and the dimensions
/// each of its lines carries beside `Function`. Written to the manifest,
/// against which the dashboards and alarms of `infra/` are checked.
pub const CATALOG: &[(&str, &str, &[&str])] = &[
    ("Suspects", "Count", &["Trigger"]),
    ("Decisions", "Count", &["Outcome", "Reason"]),
    ("PowerOffs", "Count", &["PowerOutcome", "Reason"]),
    ("Recoveries", "Count", &["RecoveryOutcome", "Reason"]),
    ("Errors", "Count", &["Dependency"]),
    ("VolumesDetached", "Count", &[]),
    ("WitnessFailures", "Count", &[]),
    ("ConfirmLatency", "Milliseconds", &[]),
    ("TaintLatency", "Milliseconds", &[]),
    ("DetachLatency", "Milliseconds", &[]),
    ("VerifyLatency", "Milliseconds", &[]),
];

/// EMF accepts at most 100 values per metric in one document.
const MAX_VALUES: usize = 100;

/// A step of the pipeline whose latency is recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// `DescribeInstances`: the confirmation and the re-confirmation.
    Confirm,
    /// The taint on one node (read, patch, retries on conflict).
    Taint,
    /// The force-detach calls for one node.
    Detach,
    /// The bounded wait until the detached volumes are `available`.
    Verify,
}

impl Stage {
    /// The metric's name.
    pub fn metric(self) -> &'static str {
        match self {
            Self::Confirm => "ConfirmLatency",
            Self::Taint => "TaintLatency",
            Self::Detach => "DetachLatency",
            Self::Verify => "VerifyLatency",
        }
    }
}

/// A service node-fencer depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dependency {
    /// The EC2 API.
    Ec2,
    /// The Compute Engine API.
    ComputeEngine,
    /// The BMCs' Redfish APIs (on-premises).
    Redfish,
    /// The Kubernetes API server.
    Kubernetes,
    /// SNS, for the notifications.
    Sns,
    /// Pub/Sub, for the notifications.
    PubSub,
}

impl Dependency {
    /// The dimension value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ec2 => "EC2",
            Self::ComputeEngine => "ComputeEngine",
            Self::Redfish => "Redfish",
            Self::Kubernetes => "Kubernetes",
            Self::Sns => "SNS",
            Self::PubSub => "PubSub",
        }
    }

    /// The API of a cloud.
    pub fn cloud(provider: Provider) -> Self {
        match provider {
            Provider::Aws => Self::Ec2,
            Provider::Gce => Self::ComputeEngine,
            Provider::Redfish => Self::Redfish,
        }
    }
}

/// What one invocation measured, beside its report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    /// Each stage's latencies, in the order they were taken.
    pub stages: Vec<(Stage, Duration)>,
    /// Failed calls per dependency.
    pub errors: BTreeMap<Dependency, u64>,
}

/// Collects measurements from the concurrent parts of one invocation.
#[derive(Debug, Default)]
pub struct Meter {
    measured: Mutex<Measured>,
}

impl Meter {
    /// Records one latency of `stage`.
    pub fn stage(&self, stage: Stage, took: Duration) {
        if let Ok(mut m) = self.measured.lock() {
            m.stages.push((stage, took));
        }
    }

    /// Records one failed call to `dependency`.
    pub fn error(&self, dependency: Dependency) {
        if let Ok(mut m) = self.measured.lock() {
            *m.errors.entry(dependency).or_default() += 1;
        }
    }

    /// Everything recorded so far.
    pub fn measured(&self) -> Measured {
        self.measured.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// The EMF documents of one invocation; `report` is `None` when the
/// invocation failed before deciding anything. `timestamp_ms` is the Unix
/// time in milliseconds. Each line also carries the correlation id (a plain
/// property, not a dimension) to find the invocation's logs from a metric.
pub fn emf_lines(
    function: &str,
    correlation_id: &str,
    report: Option<&Report>,
    measured: &Measured,
    timestamp_ms: u64,
) -> Vec<Value> {
    let mut lines = Vec::new();
    let mut doc = |dimensions: &[(&str, &str)], metrics: Vec<(&str, &str, Value)>| {
        let mut line = document(function, timestamp_ms, dimensions, metrics);
        line["CorrelationId"] = json!(correlation_id);
        lines.push(line);
    };
    for (metric, dimensions, n) in report.map(counts).unwrap_or_default() {
        doc(&dimensions, vec![(metric, "Count", json!(n))]);
    }
    for (dependency, n) in &measured.errors {
        doc(
            &[("Dependency", dependency.name())],
            vec![("Errors", "Count", json!(n))],
        );
    }
    let detached = report.map_or(0, volumes_detached);
    let mut metrics = vec![("VolumesDetached", "Count", json!(detached))];
    let mut by_stage: BTreeMap<Stage, Vec<f64>> = BTreeMap::new();
    for (stage, took) in &measured.stages {
        by_stage
            .entry(*stage)
            .or_default()
            .push(took.as_secs_f64() * 1000.0);
    }
    for (stage, mut values) in by_stage {
        values.truncate(MAX_VALUES);
        metrics.push((stage.metric(), "Milliseconds", json!(values)));
    }
    doc(&[], metrics);
    lines
}

/// The volumes a report says were detached and let go.
pub(crate) fn volumes_detached(report: &Report) -> usize {
    report
        .results
        .iter()
        .flat_map(|n| &n.volumes)
        .filter(|v| v.outcome == VolumeOutcome::Detached)
        .count()
}

/// One counted metric: its name, its dimensions beside `Function`, the count.
pub(crate) type Count<'a> = (&'static str, Vec<(&'static str, &'a str)>, u64);

/// The counts of a report, each a metric with its dimensions: suspects per
/// trigger, decisions, power-offs and recoveries per outcome and reason.
pub(crate) fn counts(report: &Report) -> Vec<Count<'_>> {
    let mut out = Vec::new();
    let origins = report.results.iter().flat_map(|r| &r.origins);
    let origins = origins.chain(report.recoveries.iter().flat_map(|r| &r.origins));
    for ((trigger, _), n) in tally(origins.map(|o| (o.kind(), ""))) {
        out.push(("Suspects", vec![("Trigger", trigger)], n));
    }
    let decisions = report.results.iter().map(|r| {
        let reason = match (&r.skip, r.outcome) {
            (Some(skip), _) => skip.code(),
            (None, Outcome::Failed) => "failed",
            (None, outcome) => outcome.code(),
        };
        (r.outcome.code(), reason)
    });
    for ((outcome, reason), n) in tally(decisions) {
        out.push((
            "Decisions",
            vec![("Outcome", outcome), ("Reason", reason)],
            n,
        ));
    }
    let power_offs = report.results.iter().filter_map(|r| r.power_off.as_ref());
    let power_offs = power_offs.map(|p| {
        let reason = p.refusal.as_ref().map_or(p.outcome.code(), Refusal::code);
        (p.outcome.code(), reason)
    });
    for ((outcome, reason), n) in tally(power_offs) {
        let dimensions = vec![("PowerOutcome", outcome), ("Reason", reason)];
        out.push(("PowerOffs", dimensions, n));
    }
    let recoveries = report.recoveries.iter().map(|r| {
        let reason = r.hold.as_ref().map_or(r.outcome.code(), Hold::code);
        (r.outcome.code(), reason)
    });
    for ((outcome, reason), n) in tally(recoveries) {
        let dimensions = vec![("RecoveryOutcome", outcome), ("Reason", reason)];
        out.push(("Recoveries", dimensions, n));
    }
    // Zero too: a sweep whose witnesses all serve is what ends an alarm.
    if let Some(witness) = &report.witness {
        let failing = u64::try_from(witness.failing.len()).unwrap_or(u64::MAX);
        out.push(("WitnessFailures", Vec::new(), failing));
    }
    out
}

/// How many of each pair.
fn tally<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> BTreeMap<(&'a str, &'a str), u64> {
    let mut counts = BTreeMap::new();
    for pair in pairs {
        *counts.entry(pair).or_default() += 1;
    }
    counts
}

/// One EMF document: the metrics, their values and dimension values at the
/// root, and their declaration under `_aws`.
fn document(
    function: &str,
    timestamp_ms: u64,
    dimensions: &[(&str, &str)],
    metrics: Vec<(&str, &str, Value)>,
) -> Value {
    let mut keys = vec!["Function"];
    keys.extend(dimensions.iter().map(|(k, _)| *k));
    let declared: Vec<Value> = metrics
        .iter()
        .map(|(name, unit, _)| json!({"Name": name, "Unit": unit}))
        .collect();
    let mut root = Map::new();
    root.insert(
        "_aws".into(),
        json!({
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [keys],
                "Metrics": declared,
            }]
        }),
    );
    root.insert("Function".into(), json!(function));
    for (k, v) in dimensions {
        root.insert((*k).into(), json!(v));
    }
    for (name, _, value) in metrics {
        root.insert(name.into(), value);
    }
    Value::Object(root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::inbound::suspect::Origin;
    use crate::core::outbound::report::{NodeReport, VolumeReport};
    use crate::core::rules::decide::Skip;

    fn node(outcome: Outcome, skip: Option<Skip>, origin: Origin, detached: usize) -> NodeReport {
        NodeReport {
            skip,
            volumes: VolumeReport::detached(detached),
            origins: vec![origin],
            ..NodeReport::of("n", outcome)
        }
    }

    fn alert() -> Origin {
        Origin::Alert {
            alertname: Some("KubeNodeNotReady".into()),
            fingerprint: None,
        }
    }

    fn ec2() -> Origin {
        Origin::Ec2StateChange {
            event_id: None,
            reported_state: "stopped".into(),
            reported_at: None,
        }
    }

    fn report(results: Vec<NodeReport>) -> Report {
        Report::of("c", results)
    }

    /// The line whose dimension `key` is `value`.
    fn line<'a>(lines: &'a [Value], key: &str, value: &str) -> &'a Value {
        let found: Vec<&Value> = lines.iter().filter(|l| l[key] == json!(value)).collect();
        assert_eq!(found.len(), 1, "one line with {key}={value}: {lines:#?}");
        found[0]
    }

    #[test]
    fn every_line_declares_exactly_the_metrics_and_dimensions_it_carries() {
        let meter = Meter::default();
        meter.stage(Stage::Confirm, Duration::from_millis(12));
        meter.error(Dependency::Ec2);
        let r = report(vec![
            node(Outcome::Fenced, None, ec2(), 2),
            node(Outcome::Skipped, Some(Skip::NodeReady), alert(), 0),
        ]);
        let lines = emf_lines("fn", "c", Some(&r), &meter.measured(), 1_700_000_000_000);
        for l in &lines {
            let decl = &l["_aws"]["CloudWatchMetrics"][0];
            assert_eq!(decl["Namespace"], json!(NAMESPACE));
            assert_eq!(l["_aws"]["Timestamp"], json!(1_700_000_000_000_u64));
            assert_eq!(l["CorrelationId"], json!("c"));
            for key in decl["Dimensions"][0].as_array().expect("dimensions") {
                let key = key.as_str().expect("a dimension name");
                assert!(l[key].is_string(), "{key} has a value: {l}");
            }
            for m in decl["Metrics"].as_array().expect("metrics") {
                let name = m["Name"].as_str().expect("a metric name");
                assert!(
                    l[name].is_number() || l[name].is_array(),
                    "{name} has a value: {l}"
                );
            }
        }
    }

    #[test]
    fn counts_suspects_by_trigger_decisions_by_reason_errors_and_volumes() {
        let meter = Meter::default();
        meter.error(Dependency::Kubernetes);
        meter.error(Dependency::Kubernetes);
        let r = report(vec![
            node(Outcome::Fenced, None, ec2(), 2),
            node(Outcome::Fenced, None, alert(), 1),
            node(Outcome::Skipped, Some(Skip::NodeReady), alert(), 0),
            node(Outcome::Failed, None, alert(), 0),
        ]);
        let lines = emf_lines("fn", "c", Some(&r), &meter.measured(), 0);
        assert_eq!(line(&lines, "Trigger", "alert")["Suspects"], json!(3));
        assert_eq!(
            line(&lines, "Trigger", "ec2_state_change")["Suspects"],
            json!(1)
        );
        assert_eq!(line(&lines, "Reason", "node_ready")["Decisions"], json!(1));
        assert_eq!(
            line(&lines, "Reason", "node_ready")["Outcome"],
            json!("skipped")
        );
        assert_eq!(line(&lines, "Reason", "fenced")["Decisions"], json!(2));
        assert_eq!(line(&lines, "Reason", "failed")["Outcome"], json!("failed"));
        assert_eq!(line(&lines, "Dependency", "Kubernetes")["Errors"], json!(2));
        assert!(lines.iter().all(|l| l["Dependency"] != json!("EC2")));
        let totals: Vec<&Value> = lines
            .iter()
            .filter(|l| l.get("VolumesDetached").is_some())
            .collect();
        assert_eq!(totals.len(), 1);
        assert_eq!(totals[0]["VolumesDetached"], json!(3));
    }

    #[test]
    fn counts_recoveries_by_outcome_and_hold() {
        use crate::core::outbound::report::{RecoveryOutcome, RecoveryReport};
        let recovery = |outcome, hold| RecoveryReport {
            node: "n".into(),
            instance_id: None,
            instance_state: None,
            outcome,
            reason: String::new(),
            hold,
            taint_removed: false,
            requested: true,
            errors: Vec::new(),
            origins: vec![ec2()],
        };
        let mut r = report(vec![]);
        r.recoveries = vec![
            recovery(RecoveryOutcome::Recovered, None),
            recovery(RecoveryOutcome::Waiting, Some(Hold::NodeNotReady)),
            recovery(RecoveryOutcome::Waiting, Some(Hold::NodeNotReady)),
        ];
        let lines = emf_lines("fn", "c", Some(&r), &Meter::default().measured(), 0);
        assert_eq!(line(&lines, "Reason", "recovered")["Recoveries"], json!(1));
        assert_eq!(
            line(&lines, "Reason", "node_not_ready")["Recoveries"],
            json!(2)
        );
        assert_eq!(
            line(&lines, "Reason", "node_not_ready")["RecoveryOutcome"],
            json!("waiting")
        );
        assert_eq!(
            line(&lines, "Trigger", "ec2_state_change")["Suspects"],
            json!(3)
        );
    }

    /// The catalog is what the lines say: every metric a line declares is
    /// in it, with exactly its dimensions, and every entry is emitted by an
    /// invocation that does everything once.
    #[test]
    fn the_catalog_is_every_metric_with_its_dimensions() {
        use crate::core::outbound::report::{RecoveryOutcome, RecoveryReport};
        use crate::core::rules::power::{PowerOutcome, PowerReport};
        let meter = Meter::default();
        for stage in [Stage::Confirm, Stage::Taint, Stage::Detach, Stage::Verify] {
            meter.stage(stage, Duration::from_millis(5));
        }
        meter.error(Dependency::ComputeEngine);
        let mut powered = node(Outcome::Fenced, None, alert(), 1);
        powered.power_off = Some(PowerReport::new(PowerOutcome::Stopped, "", None, None));
        let mut r = report(vec![powered]);
        r.recoveries = vec![RecoveryReport {
            node: "m".into(),
            instance_id: None,
            instance_state: None,
            outcome: RecoveryOutcome::Recovered,
            reason: String::new(),
            hold: None,
            taint_removed: true,
            requested: false,
            errors: Vec::new(),
            origins: vec![Origin::Sweep],
        }];
        r.witness = Some(crate::core::outbound::report::WitnessSummary::default());
        let lines = emf_lines("fn", "c", Some(&r), &meter.measured(), 0);
        let mut seen = std::collections::BTreeSet::new();
        for l in &lines {
            let decl = &l["_aws"]["CloudWatchMetrics"][0];
            let dims: Vec<&str> = decl["Dimensions"][0]
                .as_array()
                .expect("dimensions")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            for m in decl["Metrics"].as_array().expect("metrics") {
                let name = m["Name"].as_str().expect("a name");
                let (_, unit, extra) = CATALOG
                    .iter()
                    .find(|(n, ..)| *n == name)
                    .unwrap_or_else(|| panic!("{name} is not in the catalog"));
                assert_eq!(m["Unit"], json!(unit), "{name}");
                let mut want = vec!["Function"];
                want.extend(extra.iter());
                assert_eq!(dims, want, "{name}");
                seen.insert(name);
            }
        }
        let all: std::collections::BTreeSet<&str> = CATALOG.iter().map(|(n, ..)| *n).collect();
        assert_eq!(seen, all, "every entry is emitted");
        let power = line(&lines, "PowerOutcome", "stopped");
        assert_eq!(power["PowerOffs"], json!(1));
        assert_eq!(power["Reason"], json!("stopped"));
    }

    #[test]
    fn stage_latencies_are_milliseconds_in_the_order_taken() {
        let meter = Meter::default();
        meter.stage(Stage::Confirm, Duration::from_micros(12_500));
        meter.stage(Stage::Taint, Duration::from_millis(30));
        meter.stage(Stage::Confirm, Duration::from_millis(8));
        let lines = emf_lines("fn", "c", Some(&report(Vec::new())), &meter.measured(), 0);
        let total = lines.last().expect("the invocation's line");
        assert_eq!(total["ConfirmLatency"], json!([12.5, 8.0]));
        assert_eq!(total["TaintLatency"], json!([30.0]));
        assert!(total.get("DetachLatency").is_none());
        let units: Vec<&Value> = total["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .expect("metrics")
            .iter()
            .filter(|m| m["Name"] == json!("ConfirmLatency"))
            .map(|m| &m["Unit"])
            .collect();
        assert_eq!(units, vec![&json!("Milliseconds")]);
    }

    #[test]
    fn a_failed_invocation_still_reports_its_errors_and_no_decision() {
        let meter = Meter::default();
        meter.error(Dependency::Kubernetes);
        let lines = emf_lines("fn", "c", None, &meter.measured(), 0);
        assert_eq!(line(&lines, "Dependency", "Kubernetes")["Errors"], json!(1));
        assert!(lines.iter().all(|l| l.get("Decisions").is_none()));
        assert!(lines.iter().all(|l| l.get("Suspects").is_none()));
    }

    #[test]
    fn no_metric_carries_more_values_than_emf_accepts() {
        let meter = Meter::default();
        for _ in 0..250 {
            meter.stage(Stage::Detach, Duration::from_millis(1));
        }
        let lines = emf_lines("fn", "c", None, &meter.measured(), 0);
        let total = lines.last().expect("the invocation's line");
        assert_eq!(
            total["DetachLatency"].as_array().map(Vec::len),
            Some(MAX_VALUES)
        );
    }
}

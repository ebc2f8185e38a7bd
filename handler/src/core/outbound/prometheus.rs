//! The metrics of [`metrics::CATALOG`] in Prometheus' text exposition
//! format (version 0.0.4), for `serve`'s `/metrics` on-premises, where
//! Prometheus, not CloudWatch or Cloud Monitoring, watches: every count a
//! counter, every latency a histogram, plus the sweeps and the witness of
//! each Node's machine ([`witness`]).
//!
//! The names follow the catalog mechanically: `Decisions` is
//! `node_fencer_decisions_total`, `ConfirmLatency` (milliseconds) is the
//! histogram `node_fencer_confirm_latency_seconds`, the dimension
//! `PowerOutcome` the label `power_outcome`. [`FAMILIES`] lists them all,
//! for the manifest that infra/'s rules and dashboard are held to.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::core::outbound::metrics::{self, Measured, counts};
use crate::core::outbound::report::Report;
use crate::core::rules::witness::Witnessed;

/// The prefix of every family.
pub const PREFIX: &str = "node_fencer_";

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every family `/metrics` serves: its name, its type, its labels, and
/// what it counts (the `# HELP` line).
pub const FAMILIES: &[(&str, &str, &[&str], &str)] = &[
    (
        "node_fencer_suspects_total",
        "counter",
        &["trigger"],
        "Nodes named by a trigger, by trigger.",
    ),
    (
        "node_fencer_decisions_total",
        "counter",
        &["outcome", "reason"],
        "Verdicts on a suspect node, by outcome and reason (failed: the fencing failed and is retried).",
    ),
    (
        "node_fencer_power_offs_total",
        "counter",
        &["power_outcome", "reason"],
        "Active fencing's power-offs, sent or refused, by outcome and reason.",
    ),
    (
        "node_fencer_recoveries_total",
        "counter",
        &["recovery_outcome", "reason"],
        "Fencings ended or waiting to end, by outcome and reason.",
    ),
    (
        "node_fencer_errors_total",
        "counter",
        &["dependency"],
        "Failed calls, by the service called.",
    ),
    (
        "node_fencer_volumes_detached_total",
        "counter",
        &[],
        "Volumes force-detached and let go.",
    ),
    (
        "node_fencer_witness_failures_total",
        "counter",
        &[],
        "Nodes whose machine a sweep's witness round found it could not fence, summed over the sweeps.",
    ),
    (
        "node_fencer_confirm_latency_seconds",
        "histogram",
        &[],
        "How long asking the provider for a machine's state took.",
    ),
    (
        "node_fencer_taint_latency_seconds",
        "histogram",
        &[],
        "How long tainting one node took.",
    ),
    (
        "node_fencer_detach_latency_seconds",
        "histogram",
        &[],
        "How long the force-detach calls of one node took.",
    ),
    (
        "node_fencer_verify_latency_seconds",
        "histogram",
        &[],
        "How long the wait for the detached volumes took.",
    ),
    (
        "node_fencer_sweeps_total",
        "counter",
        &["result"],
        "Sweeps run, by result (done, incomplete: work left for the next, failed).",
    ),
    (
        "node_fencer_last_sweep_timestamp_seconds",
        "gauge",
        &[],
        "When the last sweep that reached its end (done or incomplete) ended, Unix time.",
    ),
    (
        "node_fencer_witness_up",
        "gauge",
        &["node", "machine"],
        "1 when the Node's machine could be fenced now (its witness answers for it), 0 when not.",
    ),
    (
        "node_fencer_witness_failing",
        "gauge",
        &["node", "machine", "reason"],
        "1 for each Node whose witness fails, with the reason.",
    ),
    (
        "node_fencer_last_witness_timestamp_seconds",
        "gauge",
        &[],
        "When the witness of every Node was last looked at, Unix time.",
    ),
];

/// The upper bounds of the latency histograms, in seconds: a BMC answers
/// in seconds, a cloud API in tens of milliseconds.
pub const BUCKETS: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// How a sweep ended, for `node_fencer_sweeps_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepResult {
    /// Everything done.
    Done,
    /// Work left for the next sweep.
    Incomplete,
    /// The sweep failed before deciding.
    Failed,
}

impl SweepResult {
    fn code(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Incomplete => "incomplete",
            Self::Failed => "failed",
        }
    }
}

/// One histogram's buckets (not cumulative), sum and count.
#[derive(Clone, Debug, Default, PartialEq)]
struct Histogram {
    buckets: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        if let Some(i) = BUCKETS.iter().position(|le| seconds <= *le) {
            self.buckets[i] += 1;
        }
        self.sum += seconds;
        self.count += 1;
    }
}

/// A series: its family and its label values, in the family's order.
type Series = (&'static str, Vec<String>);

/// Everything counted since the process started.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    counters: BTreeMap<Series, u64>,
    histograms: BTreeMap<&'static str, Histogram>,
    last_sweep: Option<f64>,
    witnesses: Vec<Witnessed>,
    last_witness: Option<f64>,
}

impl Registry {
    /// Counts one run: its report (`None` when it failed before deciding)
    /// and what it measured.
    pub fn record_run(&mut self, report: Option<&Report>, measured: &Measured) {
        for (metric, dimensions, n) in report.map(counts).unwrap_or_default() {
            let values = dimensions.iter().map(|(_, v)| (*v).to_owned()).collect();
            *self.counters.entry((family(metric), values)).or_default() += n;
        }
        for (dependency, n) in &measured.errors {
            let series = (family("Errors"), vec![dependency.name().to_owned()]);
            *self.counters.entry(series).or_default() += n;
        }
        let detached = report.map_or(0, metrics::volumes_detached);
        *self
            .counters
            .entry((family("VolumesDetached"), Vec::new()))
            .or_default() += u64::try_from(detached).unwrap_or(u64::MAX);
        for (stage, took) in &measured.stages {
            self.histograms
                .entry(family(stage.metric()))
                .or_default()
                .observe(took.as_secs_f64());
        }
    }

    /// Counts one sweep that ended at `now` (Unix seconds).
    pub fn record_sweep(&mut self, result: SweepResult, now: f64) {
        let series = ("node_fencer_sweeps_total", vec![result.code().to_owned()]);
        *self.counters.entry(series).or_default() += 1;
        if result != SweepResult::Failed {
            self.last_sweep = Some(now);
        }
    }

    /// Replaces the witnesses with those of the round that ended at `now`.
    pub fn record_witnesses(&mut self, round: &[Witnessed], now: f64) {
        self.witnesses = round.to_vec();
        self.last_witness = Some(now);
    }

    /// The exposition: every family of [`FAMILIES`] with its `# HELP` and
    /// `# TYPE`, its series sorted.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, kind, labels, help) in FAMILIES {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            match *kind {
                "histogram" => self.render_histogram(&mut out, name),
                "counter" => self.render_counter(&mut out, name, labels),
                _ => self.render_gauge(&mut out, name),
            }
        }
        out
    }

    fn render_counter(&self, out: &mut String, name: &str, labels: &[&str]) {
        let mut any = false;
        for ((_, values), n) in self.counters.iter().filter(|((f, _), _)| *f == name) {
            any = true;
            let pairs: Vec<(&str, &str)> = labels
                .iter()
                .copied()
                .zip(values.iter().map(String::as_str))
                .collect();
            sample(out, name, &pairs, &n.to_string());
        }
        // A family without labels has one series from the start: a rate
        // over it is 0, not absent, before the first event.
        if !any && labels.is_empty() {
            sample(out, name, &[], "0");
        }
    }

    fn render_histogram(&self, out: &mut String, name: &str) {
        let h = self.histograms.get(name).cloned().unwrap_or_default();
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (le, n) in BUCKETS.iter().zip(h.buckets) {
            cumulative += n;
            let le = le.to_string();
            sample(
                out,
                &bucket,
                &[("le", le.as_str())],
                &cumulative.to_string(),
            );
        }
        sample(out, &bucket, &[("le", "+Inf")], &h.count.to_string());
        sample(out, &format!("{name}_sum"), &[], &h.sum.to_string());
        sample(out, &format!("{name}_count"), &[], &h.count.to_string());
    }

    fn render_gauge(&self, out: &mut String, name: &str) {
        match name {
            "node_fencer_last_sweep_timestamp_seconds" => {
                if let Some(at) = self.last_sweep {
                    sample(out, name, &[], &at.to_string());
                }
            }
            "node_fencer_last_witness_timestamp_seconds" => {
                if let Some(at) = self.last_witness {
                    sample(out, name, &[], &at.to_string());
                }
            }
            "node_fencer_witness_up" => {
                for w in &self.witnesses {
                    let up = if w.verdict.is_ok() { "1" } else { "0" };
                    let labels = [("node", w.node.as_str()), ("machine", w.machine.as_str())];
                    sample(out, name, &labels, up);
                }
            }
            "node_fencer_witness_failing" => {
                for w in &self.witnesses {
                    if let Some(reason) = w.reason() {
                        let labels = [
                            ("node", w.node.as_str()),
                            ("machine", w.machine.as_str()),
                            ("reason", reason.code()),
                        ];
                        sample(out, name, &labels, "1");
                    }
                }
            }
            _ => {}
        }
    }
}

/// The family of a catalog metric.
fn family(metric: &str) -> &'static str {
    let name = prometheus_name(metric);
    FAMILIES
        .iter()
        .map(|(n, ..)| *n)
        .find(|n| *n == name)
        .unwrap_or("node_fencer_unknown_total")
}

/// A catalog metric's Prometheus name: snake case under [`PREFIX`], a
/// count with `_total`, a latency in seconds.
pub fn prometheus_name(metric: &str) -> String {
    let mut snake = String::new();
    for (i, c) in metric.char_indices() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                snake.push('_');
            }
            snake.push(c.to_ascii_lowercase());
        } else {
            snake.push(c);
        }
    }
    match metrics::CATALOG.iter().find(|(n, ..)| *n == metric) {
        Some((_, "Milliseconds", _)) => format!("{PREFIX}{snake}_seconds"),
        _ => format!("{PREFIX}{snake}_total"),
    }
}

/// A catalog dimension's label name: snake case.
pub fn label_name(dimension: &str) -> String {
    prometheus_name(dimension)
        .trim_start_matches(PREFIX)
        .trim_end_matches("_total")
        .to_owned()
}

/// One sample line.
fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: &str) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"{}\"", escape(v));
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// A label value as the format quotes it.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::core::inbound::suspect::Origin;
    use crate::core::outbound::metrics::{Dependency, Meter, Stage};
    use crate::core::outbound::report::{NodeReport, Outcome, VolumeReport};
    use crate::core::rules::witness::{Failing, Reason};

    fn fenced(detached: usize) -> NodeReport {
        NodeReport {
            volumes: VolumeReport::detached(detached),
            origins: vec![Origin::Sweep],
            ..NodeReport::of("n", Outcome::Fenced)
        }
    }

    /// The value of the one sample line that starts with `prefix`.
    fn value(text: &str, prefix: &str) -> String {
        let found: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#') && l.starts_with(prefix))
            .collect();
        assert_eq!(found.len(), 1, "one line starting {prefix}: {text}");
        found[0].rsplit(' ').next().unwrap_or_default().to_owned()
    }

    #[test]
    fn every_catalog_metric_and_dimension_has_its_family_and_labels() {
        for (metric, _, dimensions) in metrics::CATALOG {
            let name = prometheus_name(metric);
            let (_, kind, labels, _) = FAMILIES
                .iter()
                .find(|(n, ..)| *n == name)
                .unwrap_or_else(|| panic!("{metric}: no family {name}"));
            let want: Vec<String> = dimensions.iter().map(|d| label_name(d)).collect();
            assert_eq!(labels.to_vec(), want, "{name}");
            let unit_kind = if name.ends_with("_seconds") {
                "histogram"
            } else {
                "counter"
            };
            assert_eq!(*kind, unit_kind, "{name}");
        }
        assert_eq!(prometheus_name("PowerOffs"), "node_fencer_power_offs_total");
        assert_eq!(label_name("RecoveryOutcome"), "recovery_outcome");
        for stage in [Stage::Confirm, Stage::Taint, Stage::Detach, Stage::Verify] {
            assert!(prometheus_name(stage.metric()).ends_with("_latency_seconds"));
        }
    }

    #[test]
    fn runs_add_up_across_scrapes() {
        let meter = Meter::default();
        meter.error(Dependency::Redfish);
        meter.stage(Stage::Confirm, Duration::from_millis(30));
        let report = Report::of("c", vec![fenced(2)]);
        let mut r = Registry::default();
        r.record_run(Some(&report), &meter.measured());
        r.record_run(Some(&report), &meter.measured());
        let text = r.render();
        for (series, want) in [
            (
                r#"node_fencer_decisions_total{outcome="fenced",reason="fenced"}"#,
                "2",
            ),
            (r#"node_fencer_suspects_total{trigger="sweep"}"#, "2"),
            (r#"node_fencer_errors_total{dependency="Redfish"}"#, "2"),
            ("node_fencer_volumes_detached_total", "4"),
            (
                r#"node_fencer_confirm_latency_seconds_bucket{le="0.025"}"#,
                "0",
            ),
            (
                r#"node_fencer_confirm_latency_seconds_bucket{le="0.05"}"#,
                "2",
            ),
            (
                r#"node_fencer_confirm_latency_seconds_bucket{le="+Inf"}"#,
                "2",
            ),
            ("node_fencer_confirm_latency_seconds_count", "2"),
            ("node_fencer_taint_latency_seconds_count", "0"),
        ] {
            assert_eq!(value(&text, series), want, "{series}");
        }
    }

    #[test]
    fn a_fresh_registry_declares_every_family() {
        let text = Registry::default().render();
        for (name, kind, ..) in FAMILIES {
            assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        }
        assert_eq!(value(&text, "node_fencer_volumes_detached_total"), "0");
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("node_fencer_last_sweep_timestamp_seconds")),
            "no sweep yet, no time of one: {text}"
        );
    }

    #[test]
    fn sweeps_count_by_result_and_a_failed_one_is_no_sign_of_life() {
        let mut r = Registry::default();
        r.record_sweep(SweepResult::Done, 100.0);
        r.record_sweep(SweepResult::Failed, 160.0);
        let text = r.render();
        assert_eq!(
            value(&text, r#"node_fencer_sweeps_total{result="done"}"#),
            "1"
        );
        assert_eq!(
            value(&text, r#"node_fencer_sweeps_total{result="failed"}"#),
            "1"
        );
        assert_eq!(
            value(&text, "node_fencer_last_sweep_timestamp_seconds"),
            "100"
        );
    }

    #[test]
    fn each_witness_is_a_series_and_the_last_round_replaces_the_one_before() {
        let failing = Witnessed {
            node: "n\"2".into(),
            machine: "redfish://rack1-08".into(),
            verdict: Err(Failing {
                reason: Reason::Unauthorized,
                detail: "401".into(),
                fix: "check the password",
            }),
        };
        let fine = Witnessed {
            node: "n1".into(),
            machine: "redfish://rack1-07".into(),
            verdict: Ok(()),
        };
        let mut r = Registry::default();
        r.record_witnesses(&[fine.clone(), failing], 50.0);
        let text = r.render();
        assert_eq!(
            value(
                &text,
                r#"node_fencer_witness_up{node="n1",machine="redfish://rack1-07"}"#
            ),
            "1"
        );
        assert_eq!(
            value(
                &text,
                r#"node_fencer_witness_up{node="n\"2",machine="redfish://rack1-08"}"#
            ),
            "0"
        );
        assert_eq!(
            value(
                &text,
                r#"node_fencer_witness_failing{node="n\"2",machine="redfish://rack1-08",reason="unauthorized"}"#
            ),
            "1"
        );
        r.record_witnesses(&[fine], 110.0);
        let text = r.render();
        assert!(!text.contains("node_fencer_witness_failing{"), "{text}");
        assert_eq!(
            value(&text, "node_fencer_last_witness_timestamp_seconds"),
            "110"
        );
    }
}

//! `node-fencer preflight` and `{"action": "preflight"}`: checks, without
//! changing anything, that this deployment can do its job: the API server
//! answers, every Kubernetes permission the code uses is granted
//! (SelfSubjectAccessReview per verb and resource), every call is allowed
//! on each cloud the nodes run on (EC2 dry runs, Compute Engine's
//! `testIamPermissions`), each BMC of the inventory answers for its Node's
//! own machine, the secrets are readable, and what the settings and the
//! kill switch will do.

#[cfg(feature = "redfish")]
mod bmcs;
mod clouds;

use std::fmt::Write as _;

use kube::Client;
use serde::Serialize;

use crate::core::model::facts::{FenceMode, NodeFacts};
use crate::core::rules::compat;
use crate::core::rules::control::{self, KillSwitch};
use crate::core::rules::mode::{self, ModeSetting, ServerVersion};
use crate::core::rules::power::Scope;
use crate::core::rules::reach::{OPT_OUT_LABEL, Reach, Tally};
use crate::core::settings::config::Config;
use crate::core::settings::grants::{self, Grant};
use crate::shell::cluster::{ClusterReads, Coordination, Kube, can};
use crate::shell::connect::Clients;
use crate::shell::onprem::OnPrem;

/// How one check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// As needed.
    Pass,
    /// Not needed in the mode in force, but missing.
    Warn,
    /// Fencing or recovery would fail.
    Fail,
    /// A setting, for the record.
    Info,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Warn => "WARN",
            Self::Fail => "FAIL",
            Self::Info => "INFO",
        }
    }
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What is checked.
    pub check: String,
    /// The result.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// How to fix a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// Every check, and whether they all passed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Preflight {
    /// True when no check failed.
    pub passed: bool,
    /// The checks, in order.
    pub checks: Vec<Check>,
}

impl Preflight {
    fn new(checks: Vec<Check>) -> Self {
        Self {
            passed: !checks.iter().any(|c| c.status == Status::Fail),
            checks,
        }
    }

    /// The table for the terminal: one line per check, fixes below failures.
    pub fn to_table(&self) -> String {
        let width = self.checks.iter().map(|c| c.check.len()).max().unwrap_or(0);
        let mut out = String::new();
        for c in &self.checks {
            let _ = writeln!(
                out,
                "{:<4}  {:<width$}  {}",
                c.status.label(),
                c.check,
                c.detail
            );
            if let Some(fix) = &c.fix {
                let _ = writeln!(out, "      {:<width$}  fix: {fix}", "");
            }
        }
        let failed = self
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .count();
        if failed == 0 {
            out.push_str("preflight passed\n");
        } else {
            let _ = writeln!(out, "preflight FAILED: {failed} check(s)");
        }
        out
    }
}

fn row(check: impl Into<String>, status: Status, detail: impl Into<String>) -> Check {
    Check {
        check: check.into(),
        status,
        detail: detail.into(),
        fix: None,
    }
}

fn failed(check: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        fix: Some(fix.into()),
        ..row(check, Status::Fail, detail)
    }
}

/// The row of a denied grant: a warning for one only a mode or a setting
/// not in use needs, a failure otherwise.
fn denied(grant: &Grant, mode: Option<FenceMode>, fast_not_ready: bool) -> Check {
    let what = grant.what();
    let legacy = mode == Some(FenceMode::Legacy);
    if grant.legacy_only() && !legacy {
        return row(what, Status::Warn, "denied; only the legacy mode needs it");
    }
    if grant.fast_only() && !fast_not_ready {
        return row(
            what,
            Status::Warn,
            "denied; only FAST_NOT_READY=true needs it",
        );
    }
    if grant.status_write() && !fast_not_ready {
        let why = if legacy {
            "denied; the legacy mode then frees volumes up to a minute later (volumesInUse is not released), and FAST_NOT_READY=true needs it"
        } else {
            "denied; only FAST_NOT_READY=true and the legacy mode need it"
        };
        return row(what, Status::Warn, why);
    }
    failed(what, "denied", KUBERNETES_FIX)
}

/// What mends a denied grant.
const KUBERNETES_FIX: &str =
    "apply infra/kubernetes/rbac.yaml (or grant this verb to the group node-fencer)";

/// Why a grant the rules hold is not needed by this configuration, and how
/// a deployment drops it; `None` when it is needed. `mode` is the mode in
/// force (`auto` resolved by the server version).
fn unneeded(grant: &Grant, mode: Option<FenceMode>, fast_not_ready: bool) -> Option<&'static str> {
    let legacy = mode != Some(FenceMode::Taint);
    if grant.fast_only() && !fast_not_ready {
        return Some(
            "only FAST_NOT_READY=true reads the kubelets' Leases; the kubernetes-rbac module's grant_node_lease_reads=false drops it",
        );
    }
    if grant.status_write() && !fast_not_ready && !legacy {
        return Some(
            "only FAST_NOT_READY=true and the legacy mode write nodes/status; the kubernetes-rbac module's grant_node_status=false drops it",
        );
    }
    if grant.legacy_only() && !legacy {
        return Some("only the legacy mode deletes VolumeAttachments");
    }
    None
}

/// Runs every check. Never changes anything: the only writes are
/// SelfSubjectAccessReviews, EC2 dry runs and `testIamPermissions`, which
/// store nothing.
pub async fn run(clients: &Clients, config: &Config, onprem: Option<&OnPrem>) -> Preflight {
    let mut checks = Vec::new();
    settings(config, &mut checks);
    checks.push(notifications(config));
    checks.push(webhook_token(clients).await);
    let client = match clients.kube().await {
        Ok(c) => c,
        Err(e) => {
            checks.push(failed(
                "kubernetes access",
                e.to_string(),
                "check CLUSTER_NAME / CLUSTER_ENDPOINT / KUBECONFIG_* and the network path to the API server",
            ));
            clouds::check(clients, config, None, &mut checks).await;
            return Preflight::new(checks);
        }
    };
    let cluster = Kube::new(client.clone(), "node-fencer-preflight")
        .placing(onprem.map(|o| o.inventory.clone()));
    let mode = fencing_mode(&cluster, config, &mut checks).await;
    if mode.is_some() {
        permissions(&client, config, mode, &mut checks).await;
        checks.push(kill_switch(&cluster, config).await);
    }
    let nodes = match mode {
        Some(_) => cluster
            .list_nodes()
            .await
            .inspect_err(|e| {
                checks.push(row(
                    "nodes",
                    Status::Warn,
                    format!(
                        "could not be listed ({e}): the clouds are chosen by the cluster access"
                    ),
                ));
            })
            .ok(),
        None => None,
    };
    if let Some(nodes) = &nodes {
        checks.push(reach(&config.policy.reach, nodes));
    }
    clouds::check(clients, config, nodes.as_deref(), &mut checks).await;
    #[cfg(feature = "redfish")]
    bmcs::check(
        onprem,
        nodes.as_deref(),
        config.policy.active_fencing.is_some(),
        &mut checks,
    )
    .await;
    Preflight::new(checks)
}

/// How many of the cluster's Nodes node-fencer may act on, and why the
/// others not; none at all is worth a warning (a selector that matches
/// nothing is more likely a mistake than a wish).
fn reach(reach: &Reach, nodes: &[NodeFacts]) -> Check {
    let Tally {
        within,
        out_of_scope,
        opted_out,
    } = reach.tally(nodes.iter().map(|n| &n.labels));
    let selector = reach.selector.as_ref().map_or_else(
        || "every Node (NODE_SELECTOR unset)".to_owned(),
        |s| format!("NODE_SELECTOR {s}"),
    );
    let detail = format!(
        "{within} of {} Node(s) may be fenced or powered off: {selector}; {out_of_scope} not selected, {opted_out} opted out ({OPT_OUT_LABEL})",
        nodes.len()
    );
    let status = if within == 0 && !nodes.is_empty() {
        Status::Warn
    } else {
        Status::Info
    };
    row("nodes in reach", status, detail)
}

/// Whether the webhook token can be read.
async fn webhook_token(clients: &Clients) -> Check {
    match clients.webhook_token().await {
        Ok(Some(_)) => row("webhook token", Status::Pass, "readable"),
        Ok(None) => row(
            "webhook token",
            Status::Info,
            "none configured: every Function URL request is refused",
        ),
        Err(e) => failed(
            "webhook token",
            e.to_string(),
            "grant secretsmanager:GetSecretValue or ssm:GetParameter (and kms:Decrypt) on it, or fix its name",
        ),
    }
}

/// The API server's version and the fencing mode it makes; `None` when the
/// server cannot be asked.
async fn fencing_mode(
    cluster: &Kube,
    config: &Config,
    checks: &mut Vec<Check>,
) -> Option<FenceMode> {
    match cluster.server_version().await {
        Ok(version) => {
            if let Err(old) = compat::supported(version) {
                checks.push(failed(
                    "api server",
                    old.to_string(),
                    format!(
                        "upgrade the cluster to Kubernetes {} or later",
                        compat::OLDEST_SUPPORTED
                    ),
                ));
                return None;
            }
            checks.push(row(
                "api server",
                Status::Pass,
                format!("reachable, Kubernetes {version}"),
            ));
            let chosen = mode::choose(config.policy.mode, version);
            checks.push(row(
                "fencing mode",
                Status::Info,
                mode_text(config.policy.mode, version, chosen),
            ));
            Some(chosen)
        }
        Err(e) => {
            checks.push(failed(
                "api server",
                e.to_string(),
                "check the endpoint, the CA, the credentials and the network path to the API server",
            ));
            None
        }
    }
}

/// The kill switch as it stands.
async fn kill_switch(cluster: &Kube, config: &Config) -> Check {
    match cluster.kill_switch(&config.policy.control_namespace).await {
        Ok(KillSwitch::Off) => row("kill switch", Status::Pass, "off"),
        Ok(KillSwitch::On) => row(
            "kill switch",
            Status::Warn,
            format!(
                "ON: every action is a dry run (configmap {}/{} {}=true)",
                config.policy.control_namespace,
                control::OBJECT_NAME,
                control::KILL_SWITCH_KEY
            ),
        ),
        Ok(KillSwitch::Unreadable(v)) => failed(
            "kill switch",
            format!("holds {v:?}: treated as on"),
            format!("set {} to true or false", control::KILL_SWITCH_KEY),
        ),
        Err(e) => failed(
            "kill switch",
            format!("{e}: treated as on"),
            "grant get on the configmap (infra/kubernetes/rbac.yaml's Role)",
        ),
    }
}

fn mode_text(setting: ModeSetting, version: ServerVersion, chosen: FenceMode) -> String {
    match setting {
        ModeSetting::Auto => format!(
            "{} (auto: Kubernetes {version} {} 1.{})",
            chosen.name(),
            if version.has_out_of_service_taint() {
                "≥"
            } else {
                "<"
            },
            mode::TAINT_SINCE_MINOR
        ),
        _ => format!("{} (FENCING_MODE={})", chosen.name(), setting.name()),
    }
}

/// The settings the decision acts on, as rows.
/// Where the notifications go; a Pub/Sub topic this build cannot reach
/// fails. The publish permission is not tried: a test message would reach
/// every subscriber.
fn notifications(config: &Config) -> Check {
    use crate::core::settings::notify::Topic;
    let name = "notifications";
    match config.notify.as_ref().map(|n| &n.topic) {
        None => row(name, Status::Info, "off (NOTIFY_TOPIC unset)"),
        Some(Topic::Sns { arn }) => row(name, Status::Info, format!("to SNS topic {arn}")),
        Some(Topic::PubSub { name: topic }) if cfg!(feature = "redfish") => {
            row(name, Status::Info, format!("to Pub/Sub topic {topic}"))
        }
        Some(Topic::PubSub { name: topic }) => failed(
            name,
            format!("{topic} is a Pub/Sub topic, which this build cannot publish to"),
            "run the Cloud Run image (the `google-cloud` feature) on Google Cloud, or name an SNS topic",
        ),
    }
}

fn settings(config: &Config, checks: &mut Vec<Check>) {
    checks.push(row(
        "dry run",
        Status::Info,
        if config.policy.dry_run {
            "DRY_RUN=true: nothing will be changed"
        } else {
            "off"
        },
    ));
    let percent = config
        .policy
        .max_out_of_service_percent
        .map(|p| format!(" and {p}% of the nodes"))
        .unwrap_or_default();
    checks.push(row(
        "out-of-service cap",
        Status::Info,
        format!(
            "{} node(s){percent}, counted across invocations under lease {}/{}",
            config.policy.max_out_of_service,
            config.policy.control_namespace,
            control::OBJECT_NAME
        ),
    ));
    checks.push(row(
        "confirmation",
        Status::Info,
        if config.policy.confirm_again_after.is_zero() {
            "the cloud is asked again right before acting".to_owned()
        } else {
            format!(
                "the cloud is asked again after {}s, right before acting",
                config.policy.confirm_again_after.as_secs()
            )
        },
    ));
    checks.push(row(
        "nodes without a provider id",
        Status::Info,
        match &config.policy.scope {
            Some(scope) => format!(
                "matched to an EC2 event's instance by InternalIP within {}{}",
                scope.vpc,
                scope
                    .tag
                    .as_ref()
                    .map(|(k, v)| format!(", tagged {k}{}", v.as_ref().map(|v| format!("={v}")).unwrap_or_default()))
                    .unwrap_or_default()
            ),
            None => "never fenced: set CLUSTER_VPC_ID (and CLUSTER_TAG) to match them by InternalIP within the cluster's VPC".into(),
        },
    ));
    later_settings(config, checks);
}

/// The settings of what comes after the decision: hibernation, active
/// fencing, recovery; and the configuration's warnings.
fn later_settings(config: &Config, checks: &mut Vec<Check>) {
    checks.push(row(
        "hibernation",
        Status::Info,
        if config.policy.fence_hibernated {
            "FENCE_HIBERNATED=true: an instance stopped by hibernation is fenced like a stopped one"
        } else {
            "an instance stopped by hibernation is not fenced (it resumes from RAM)"
        },
    ));
    checks.push(row(
        "active fencing",
        Status::Info,
        match &config.policy.active_fencing {
            None => "off: a node whose instance EC2 reports running is never powered off".to_owned(),
            Some(a) => format!(
                "{}: a node NotReady for {}s whose instance EC2 reports running{} is powered off (forced), waited for up to {}s, then fenced; refused while more than {}% of the nodes, or a whole zone, are NotReady",
                match a.scope {
                    Scope::Stuck => "stuck",
                    Scope::AnyHung => "on",
                },
                a.after.as_secs(),
                match a.scope {
                    Scope::Stuck => ", and on which a pod holds a volume only one node may attach,",
                    Scope::AnyHung => "",
                },
                a.wait.as_secs(),
                a.partition_percent
            ),
        },
    ));
    checks.push(row(
        "recovery",
        Status::Info,
        format!(
            "the taint is removed once the instance runs and the node has been Ready for {}s",
            config.policy.recovery_settle.as_secs()
        ),
    ));
    for warning in config.warnings() {
        checks.push(row("setting", Status::Warn, warning));
    }
}

async fn permissions(
    client: &Client,
    config: &Config,
    mode: Option<FenceMode>,
    checks: &mut Vec<Check>,
) {
    let fast = config.policy.fast_not_ready;
    for grant in grants::all(&config.policy.control_namespace) {
        let answer = can(
            client,
            grant.group,
            grant.resource,
            grant.verb,
            grant.scope(),
        )
        .await;
        checks.push(match answer {
            Ok(true) => match unneeded(&grant, mode, fast) {
                Some(drop) => row(
                    grant.what(),
                    Status::Pass,
                    format!("allowed; this configuration does not need it ({drop})"),
                ),
                None => row(grant.what(), Status::Pass, "allowed"),
            },
            Ok(false) => denied(&grant, mode, fast),
            Err(e) => failed(
                grant.what(),
                format!("could not ask: {e}"),
                "allow SelfSubjectAccessReviews (system:basic-user does by default)",
            ),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::Readiness;
    use crate::core::model::selector::LabelSelector;

    #[test]
    fn the_nodes_in_reach_are_counted_and_none_is_a_warning() {
        let node = |pool: &str| {
            let mut n = NodeFacts::bare(pool, Readiness::Ready);
            n.labels.insert("pool".into(), pool.into());
            n
        };
        let mut opted = node("stateful");
        opted.labels.insert(OPT_OUT_LABEL.into(), "true".into());
        let nodes = [node("stateful"), node("web"), opted];
        let stateful = Reach {
            selector: Some(LabelSelector::parse("pool=stateful").unwrap()),
        };
        let c = reach(&stateful, &nodes);
        assert_eq!(c.status, Status::Info);
        assert!(
            c.detail.starts_with("1 of 3 Node(s) may be fenced or powered off: NODE_SELECTOR pool=stateful; 1 not selected, 1 opted out"),
            "{}",
            c.detail
        );
        let c = reach(&Reach::default(), &nodes);
        assert!(
            c.detail.starts_with("2 of 3") && c.detail.contains("NODE_SELECTOR unset"),
            "{}",
            c.detail
        );
        let none = Reach {
            selector: Some(LabelSelector::parse("pool=gpu").unwrap()),
        };
        assert_eq!(reach(&none, &nodes).status, Status::Warn);
    }

    #[test]
    fn the_table_shows_failures_with_their_fix_and_the_verdict() {
        let p = Preflight::new(vec![
            row("api server", Status::Pass, "reachable, Kubernetes 1.36"),
            failed("patch nodes", "denied", "apply infra/kubernetes/rbac.yaml"),
            row(
                "delete pods",
                Status::Warn,
                "denied; only the legacy mode needs it",
            ),
        ]);
        assert!(!p.passed);
        let table = p.to_table();
        assert!(table.contains("FAIL  patch nodes"), "{table}");
        assert!(
            table.contains("fix: apply infra/kubernetes/rbac.yaml"),
            "{table}"
        );
        assert!(table.ends_with("preflight FAILED: 1 check(s)\n"), "{table}");
        let ok = Preflight::new(vec![row("delete pods", Status::Warn, "x")]);
        assert!(ok.passed);
        assert!(ok.to_table().ends_with("preflight passed\n"));
    }

    /// Issue 45, item 10: a grant the configuration never uses is named,
    /// with the module variable that drops it; one it uses is not.
    #[test]
    fn the_grants_a_configuration_does_not_need_are_named() {
        let grant = |what: &str| {
            grants::all("kube-system")
                .into_iter()
                .find(|g| g.what() == what)
                .unwrap_or_else(|| panic!("no grant {what}"))
        };
        let status = &grant("patch nodes/status");
        let leases = &grant("get leases.coordination.k8s.io in kube-node-lease");
        let detach = &grant("delete volumeattachments.storage.k8s.io");
        let patch = &grant("patch nodes");
        let taint = Some(FenceMode::Taint);
        let legacy = Some(FenceMode::Legacy);
        let dropped = |grant, mode, fast| unneeded(grant, mode, fast).unwrap_or_default();
        assert!(dropped(status, taint, false).contains("grant_node_status=false"));
        assert!(dropped(leases, taint, false).contains("grant_node_lease_reads=false"));
        assert!(dropped(leases, legacy, false).contains("grant_node_lease_reads=false"));
        assert!(dropped(detach, taint, true).contains("legacy mode"));
        for (grant, mode, fast) in [
            (status, taint, true),
            (status, legacy, false),
            (leases, taint, true),
            (detach, legacy, false),
            (patch, taint, false),
        ] {
            assert_eq!(
                unneeded(grant, mode, fast),
                None,
                "{grant:?} {mode:?} {fast}"
            );
        }
    }
}

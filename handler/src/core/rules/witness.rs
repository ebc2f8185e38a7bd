//! Whether node-fencer could act on a Node if it died now: the witness of
//! its machine (its BMC on-premises, EC2 or Compute Engine in the clouds)
//! answers, for the Node's own machine, with the permissions a fencing
//! needs, and would take a forced power-off when active fencing may send
//! one. A BMC with a changed password, a rotated certificate, a board whose
//! UUID is no longer the Node's, or a role that lost a permission is found
//! here, on a quiet day, and not during the outage, when the Node waits for
//! a person.
//!
//! Nothing here changes anything: the verdicts feed a metric per machine,
//! an Event on the Node and a notice, each told once per change. What was
//! told is kept in the cluster ([`record_text`], [`known_from_record`]), so
//! a function with no memory between invocations tells a change once too.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::core::model::facts::{InstanceFacts, NodeFacts};
use crate::core::model::instance::Provider;
use crate::core::rules::identity;

/// Why a witness cannot be relied on. The codes are the `reason` label of
/// the metric and the words of the Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// No answer: the endpoint is down, filtered, or too slow.
    Unreachable,
    /// The credentials were refused (a changed or expired password).
    Unauthorized,
    /// Its TLS certificate is not one the configured CA bundle trusts (a
    /// rotated or self-signed certificate).
    TlsRejected,
    /// The account may not read what a fencing reads, or make a call a
    /// fencing makes (a cloud role that lost a permission).
    Forbidden,
    /// The machine is not there (a wrong path, a System removed, an
    /// instance the cloud does not know).
    NotFound,
    /// The machine that answered is not the Node's: its UUID is another.
    NotOwnMachine,
    /// The UUID that ties the Node to the machine names no one machine.
    IdentityInDoubt,
    /// Active fencing could not power it off: no `ForceOff` reset, or a
    /// reset target outside the System.
    NoForceOff,
    /// Kubernetes denies node-fencer a verb every fencing uses (a role
    /// binding removed, a ClusterRole edited): no Node can be fenced.
    KubernetesDenied,
    /// Any other failure.
    Failed,
}

impl Reason {
    /// Every reason, for the metric's catalog and the rules' tests.
    pub const ALL: [Reason; 10] = [
        Self::Unreachable,
        Self::Unauthorized,
        Self::TlsRejected,
        Self::Forbidden,
        Self::NotFound,
        Self::NotOwnMachine,
        Self::IdentityInDoubt,
        Self::NoForceOff,
        Self::KubernetesDenied,
        Self::Failed,
    ];

    /// The label value.
    pub fn code(self) -> &'static str {
        match self {
            Self::Unreachable => "unreachable",
            Self::Unauthorized => "unauthorized",
            Self::TlsRejected => "tls_rejected",
            Self::Forbidden => "forbidden",
            Self::NotFound => "not_found",
            Self::NotOwnMachine => "not_own_machine",
            Self::IdentityInDoubt => "identity_in_doubt",
            Self::NoForceOff => "no_force_off",
            Self::KubernetesDenied => "kubernetes_denied",
            Self::Failed => "failed",
        }
    }

    /// What mends it on `provider`, for the Event and the notice.
    pub fn fix(self, provider: Provider) -> &'static str {
        if self == Self::KubernetesDenied {
            return "apply infra/kubernetes/rbac.yaml (or the kubernetes-rbac module) for node-fencer's group; run preflight for the verbs";
        }
        match provider {
            Provider::Redfish => self.bmc_fix(),
            Provider::Aws | Provider::Gce => self.cloud_fix(provider),
        }
    }

    fn cloud_fix(self, provider: Provider) -> &'static str {
        let aws = provider == Provider::Aws;
        match self {
            Self::Unreachable if aws => {
                "check the function's region and its network path to EC2 (a VPC endpoint or a NAT)"
            }
            Self::Unreachable => "check COMPUTE_ENDPOINT and the network path to Compute Engine",
            Self::Unauthorized if aws => "the function's credentials were refused: check its role",
            Self::Unauthorized => {
                "the service's credentials were refused: check its service account"
            }
            Self::TlsRejected => {
                "the endpoint's TLS certificate is not trusted: check the endpoint and the system's CA certificates"
            }
            Self::Forbidden if aws => {
                "grant the manifest's aws_actions to the function's role (infra/modules/node-fencer); run preflight for the list"
            }
            Self::Forbidden => {
                "grant the custom role of infra/modules/node-fencer-gcp to the service account; run preflight for the list"
            }
            Self::NotFound if aws => {
                "the Node's providerID names an instance this region and account do not have: check the function's region, or delete the stale Node"
            }
            Self::NotFound => {
                "the Node's providerID names a VM the project does not have: check the service's project, or delete the stale Node"
            }
            Self::NotOwnMachine | Self::IdentityInDoubt => {
                "the machine of that name is not the one the Node registered on: delete the stale Node, its kubelet registers it again"
            }
            Self::NoForceOff if aws => {
                "active fencing needs ec2:StopInstances on the cluster's tagged instances (power_off_instance_tag)"
            }
            Self::NoForceOff => {
                "active fencing needs compute.instances.stop: set active_fencing = \"stuck\" (or \"on\") in infra/modules/node-fencer-gcp"
            }
            Self::KubernetesDenied | Self::Failed => "see the detail",
        }
    }

    fn bmc_fix(self) -> &'static str {
        match self {
            Self::Unreachable => "check the BMC's endpoint, its power and the network path to it",
            Self::Unauthorized => {
                "check the BMC's user and password (the inventory's credentials, REDFISH_CREDENTIALS_DIR)"
            }
            Self::TlsRejected => {
                "the BMC's certificate is not trusted: update the inventory entry's caBundle, or the BMC's certificate"
            }
            Self::Forbidden => {
                "give the BMC account a role that may read the System and post its Reset"
            }
            Self::NotFound => {
                "point the inventory entry at the Node's machine (endpoint and system)"
            }
            Self::NotOwnMachine => {
                "point the inventory entry at the Node's own machine; a swapped board needs its Node registered again"
            }
            Self::IdentityInDoubt => {
                "give each board a UUID of its own (the vendor's tool writes SMBIOS; a VM's definition sets it)"
            }
            Self::NoForceOff => "active fencing needs a ForceOff reset under the System's own path",
            Self::KubernetesDenied | Self::Failed => "see the detail",
        }
    }

    /// The reason of a failed look, from the code the shell gave its error
    /// (a BMC's class, EC2's error code, Compute Engine's status).
    pub fn of_error(code: Option<&str>) -> Self {
        match code {
            Some("Unreachable" | "Timeout") => Self::Unreachable,
            Some(
                "Unauthorized"
                | "AuthFailure"
                | "InvalidClientTokenId"
                | "ExpiredToken"
                | "UnrecognizedClientException"
                | "401",
            ) => Self::Unauthorized,
            Some("TlsRejected") => Self::TlsRejected,
            Some("Forbidden" | "UnauthorizedOperation" | "AccessDenied" | "403") => Self::Forbidden,
            Some("NotFound" | "NoSystem" | "InvalidInstanceID.NotFound" | "404") => Self::NotFound,
            _ => Self::Failed,
        }
    }
}

/// Why a witness failed, for a person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failing {
    /// The class.
    pub reason: Reason,
    /// What was seen.
    pub detail: String,
    /// What mends it, on the machine's provider.
    pub fix: &'static str,
}

/// What the witness answered for one machine.
#[derive(Debug)]
pub enum Look<'a> {
    /// It answered with the machine's facts; `force_off` is whether a
    /// forced power-off could be posted (`None`: not asked, active fencing
    /// being off).
    Answered {
        /// The machine as described.
        facts: &'a InstanceFacts,
        /// `Err` with the reason when a power-off could not be sent.
        force_off: Option<Result<(), String>>,
    },
    /// The look failed: the shell's code and message.
    Failed {
        /// The error's code.
        code: Option<&'a str>,
        /// The error.
        message: &'a str,
    },
    /// The provider answered, and does not know the machine.
    Unknown,
}

/// Whether `node`'s witness could serve a fencing, from one `look`.
pub fn judge(node: &NodeFacts, look: &Look<'_>) -> Result<(), Failing> {
    let provider = node
        .instance
        .as_ref()
        .map_or(Provider::Redfish, |i| i.provider());
    let fail = |reason: Reason, detail: String| {
        Err(Failing {
            reason,
            detail,
            fix: reason.fix(provider),
        })
    };
    match look {
        Look::Failed { code, message } => fail(Reason::of_error(*code), (*message).to_owned()),
        Look::Unknown => fail(
            Reason::NotFound,
            format!(
                "{}: the provider does not know this machine",
                node.instance
                    .as_ref()
                    .map_or("the Node's machine", |i| i.as_str())
            ),
        ),
        Look::Answered { facts, force_off } => {
            if !facts.identity.may_be_machine_of(&node.machine) {
                return match identity::doubt(node, facts.identity.system_uuid) {
                    Some(doubt) => fail(Reason::IdentityInDoubt, format!("{}: {doubt}", facts.id)),
                    None if provider != Provider::Redfish => fail(
                        Reason::NotOwnMachine,
                        format!(
                            "{}: the machine of this name was created after Node {} registered, or carries another id: it is another machine",
                            facts.id, node.name
                        ),
                    ),
                    None => fail(
                        Reason::NotOwnMachine,
                        format!(
                            "{}: the System's UUID is not the one Node {}'s kubelet read (status.nodeInfo.systemUUID), or one of them is missing",
                            facts.id, node.name
                        ),
                    ),
                };
            }
            match force_off {
                Some(Err(why)) => fail(Reason::NoForceOff, format!("{}: {why}", facts.id)),
                _ => Ok(()),
            }
        }
    }
}

/// One Node's witness, judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Witnessed {
    /// The Node.
    pub node: String,
    /// Its machine, as the provider names it (`redfish://rack1-07`).
    pub machine: String,
    /// The verdict.
    pub verdict: Result<(), Failing>,
}

impl Witnessed {
    /// The failure's reason, `None` when the witness serves.
    pub fn reason(&self) -> Option<Reason> {
        self.verdict.as_ref().err().map(|f| f.reason)
    }
}

/// `round` as a fencing would find it while Kubernetes denies node-fencer
/// the grants `denied` names (as a person reads them): no Node can be
/// fenced then, so each witness that serves fails for it. One that fails
/// already keeps its own reason, its machine's to mend; the round's
/// summary names the grants all the same.
pub fn denied_by_kubernetes(round: &mut [Witnessed], denied: &[String]) {
    if denied.is_empty() {
        return;
    }
    let detail = format!("Kubernetes denies node-fencer: {}", denied.join(", "));
    for witnessed in round.iter_mut().filter(|w| w.verdict.is_ok()) {
        witnessed.verdict = Err(Failing {
            reason: Reason::KubernetesDenied,
            detail: detail.clone(),
            fix: Reason::KubernetesDenied.fix(Provider::Aws),
        });
    }
}

/// What was known of each Node's witness after the last round: its
/// failure's reason, or `None` when it served.
pub type Known = BTreeMap<String, Option<Reason>>;

/// The witnesses of `now` whose state is news against `before`: one that
/// started failing, failed for another reason, or serves again. A Node
/// first seen serving is no news: a start tells only failures.
pub fn changes<'a>(before: &Known, now: &'a [Witnessed]) -> Vec<&'a Witnessed> {
    now.iter()
        .filter(|w| match before.get(&w.node) {
            None => w.reason().is_some(),
            Some(was) => *was != w.reason(),
        })
        .collect()
}

/// `before` brought up to `now`: Nodes no longer looked at are forgotten,
/// so that a Node deleted and registered again is told afresh.
pub fn known_after(now: &[Witnessed]) -> Known {
    now.iter().map(|w| (w.node.clone(), w.reason())).collect()
}

/// `before` brought up to `now` for the changes `told` names only: a
/// change left untold (the record full, or the invocation's time spent)
/// keeps what `before` said, so that the next round tells it. Nodes no
/// longer looked at are forgotten.
pub fn known_told(before: &Known, now: &[Witnessed], told: &BTreeSet<&str>) -> Known {
    now.iter()
        .filter_map(|w| {
            if told.contains(w.node.as_str()) {
                Some((w.node.clone(), w.reason()))
            } else {
                Some((w.node.clone(), *before.get(&w.node)?))
            }
        })
        .collect()
}

/// The largest record kept, encoded: the Lease's annotations share
/// Kubernetes' 256 KiB with the others' and the `last-applied` a hand may
/// leave. 5,000 failing Nodes named as EKS or GKE names them take a few
/// KiB compressed; names that do not compress are what this bounds.
pub const RECORD_MAX: usize = 128 * 1024;

/// Above this, the record is kept compressed (gzip, then base64, behind
/// [`COMPRESSED`]); below it, as JSON a person can read.
const RECORD_PLAIN_MAX: usize = 4 * 1024;

/// What starts a compressed record.
const COMPRESSED: &str = "gzip+base64:";

/// The most a compressed record may inflate to: a record that claims more
/// is not one node-fencer wrote.
const RECORD_INFLATED_MAX: u64 = 16 * 1024 * 1024;

/// Of `changes` (against `before`, for the round `now`), those the record
/// can keep, and how many are held back. A restored witness, or a failure
/// of a Node already recorded, never grows the record and is always taken,
/// first; new failures follow by Node name while the encoded record stays
/// within [`RECORD_MAX`]. One held back is told by a later round, once
/// others restore; the metric counts it meanwhile.
pub fn fitting<'a>(
    before: &Known,
    now: &[Witnessed],
    changes: Vec<&'a Witnessed>,
) -> (Vec<&'a Witnessed>, usize) {
    let grows =
        |w: &Witnessed| w.reason().is_some() && !matches!(before.get(&w.node), Some(Some(_)));
    let (mut new, mut taken): (Vec<&Witnessed>, Vec<&Witnessed>) =
        changes.into_iter().partition(|w| grows(w));
    new.sort_by(|a, b| a.node.cmp(&b.node));
    let fits = |k: usize| {
        let told: BTreeSet<&str> = taken
            .iter()
            .chain(&new[..k])
            .map(|w| w.node.as_str())
            .collect();
        record_text(&known_told(before, now, &told)).len() <= RECORD_MAX
    };
    // The largest count of new failures that fits: the record grows with
    // each one taken, so a binary search finds it. Without new failures
    // the record cannot grow: nothing to encode.
    let (mut lo, mut hi) = (0, new.len());
    if hi > 0 && !fits(hi) {
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        hi = lo;
    }
    let held = new.len() - hi;
    new.truncate(hi);
    taken.extend(new);
    (taken, held)
}

/// `known` as the cluster keeps it between invocations: the failing Nodes
/// under their reason's code, as JSON (`{"forbidden":["node-a","node-b"]}`),
/// compressed when larger than a few KiB. A Node that serves is left out:
/// for [`changes`], a Node not in the record and one known to serve are the
/// same (only its failure is news).
pub fn record_text(known: &Known) -> String {
    let mut failing: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (node, reason) in known {
        if let Some(reason) = reason {
            failing.entry(reason.code()).or_default().push(node);
        }
    }
    let json = serde_json::to_string(&failing).unwrap_or_else(|_| "{}".into());
    if json.len() <= RECORD_PLAIN_MAX {
        return json;
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    match std::io::Write::write_all(&mut gz, json.as_bytes()).and_then(|()| gz.finish()) {
        Ok(bytes) => format!("{COMPRESSED}{}", BASE64.encode(bytes)),
        // Writing to memory does not fail; were it to, the plain record
        // still says the same.
        Err(_) => json,
    }
}

/// The record [`record_text`] wrote, read back (or the one the version
/// before wrote, `{"node":"reason"}`); `None` when it is not one (written
/// by hand, or by another version): the round then tells as after a start,
/// failures only.
pub fn known_from_record(text: &str) -> Option<Known> {
    let json = match text.strip_prefix(COMPRESSED) {
        Some(encoded) => inflate(encoded)?,
        None => text.to_owned(),
    };
    let reason_of = |code: &str| Reason::ALL.into_iter().find(|r| r.code() == code);
    if let Ok(by_reason) = serde_json::from_str::<BTreeMap<String, Vec<String>>>(&json) {
        let mut known = Known::new();
        for (code, nodes) in by_reason {
            let reason = reason_of(&code)?;
            known.extend(nodes.into_iter().map(|node| (node, Some(reason))));
        }
        return Some(known);
    }
    let by_node: BTreeMap<String, String> = serde_json::from_str(&json).ok()?;
    by_node
        .into_iter()
        .map(|(node, code)| Some((node, Some(reason_of(&code)?))))
        .collect()
}

/// A compressed record's JSON; `None` when it does not decode, or would
/// inflate past [`RECORD_INFLATED_MAX`].
fn inflate(encoded: &str) -> Option<String> {
    use std::io::Read;
    let bytes = BASE64.decode(encoded.trim()).ok()?;
    let mut json = String::new();
    flate2::read::GzDecoder::new(bytes.as_slice())
        .take(RECORD_INFLATED_MAX + 1)
        .read_to_string(&mut json)
        .ok()?;
    (json.len() as u64 <= RECORD_INFLATED_MAX).then_some(json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::Readiness;
    use crate::core::model::instance::{InstanceId, InstanceState};
    use crate::core::model::redfish::{BmcMachine, Doubt, SystemUuid};

    const UUID: &str = "0b8e2c47-5e0a-4c7b-9d11-2f7c3f1a9e01";
    const OTHER: &str = "5f9a1c2e-7b3d-4e8f-a012-3c4d5e6f7a8b";

    fn machine() -> InstanceId {
        InstanceId::redfish(&BmcMachine::new("rack1-07").expect("a machine name"))
    }

    fn node(uuid: &str) -> NodeFacts {
        let mut n = NodeFacts::bare("n1", Readiness::Ready);
        n.instance = Some(machine());
        n.machine.system_uuid = SystemUuid::parse(Some(uuid));
        n
    }

    fn facts(uuid: SystemUuid) -> InstanceFacts {
        let mut f = InstanceFacts::bare(machine(), InstanceState::Running);
        f.identity.system_uuid = uuid;
        f
    }

    fn answered(facts: &InstanceFacts, force_off: Option<Result<(), String>>) -> Look<'_> {
        Look::Answered { facts, force_off }
    }

    #[test]
    fn the_nodes_own_machine_answering_serves() {
        let f = facts(SystemUuid::parse(Some(UUID)));
        assert_eq!(judge(&node(UUID), &answered(&f, None)), Ok(()));
        assert_eq!(judge(&node(UUID), &answered(&f, Some(Ok(())))), Ok(()));
    }

    #[test]
    fn each_failed_look_is_classed_by_its_code() {
        let cases = [
            (Some("Unreachable"), Reason::Unreachable),
            (Some("Timeout"), Reason::Unreachable),
            (Some("Unauthorized"), Reason::Unauthorized),
            (Some("TlsRejected"), Reason::TlsRejected),
            (Some("Forbidden"), Reason::Forbidden),
            (Some("NoSystem"), Reason::NotFound),
            (Some("ServerError"), Reason::Failed),
            (None, Reason::Failed),
        ];
        for (code, want) in cases {
            let look = Look::Failed {
                code,
                message: "GET https://bmc/redfish/v1/Systems/1: 401",
            };
            let got = judge(&node(UUID), &look).expect_err("failed");
            assert_eq!(got.reason, want, "{code:?}");
            assert!(got.detail.contains("401"), "{got:?}");
        }
    }

    #[test]
    fn another_machine_or_a_doubtful_uuid_fails_the_witness() {
        let other = facts(SystemUuid::parse(Some(OTHER)));
        let got = judge(&node(UUID), &answered(&other, None)).expect_err("not its machine");
        assert_eq!(got.reason, Reason::NotOwnMachine);
        assert!(got.detail.contains("n1"), "{got:?}");

        let shared = facts(SystemUuid::parse(Some(UUID)).doubted(Doubt::SharedBySystems));
        let got = judge(&node(UUID), &answered(&shared, None)).expect_err("shared");
        assert_eq!(got.reason, Reason::IdentityInDoubt);

        let missing = facts(SystemUuid::Missing);
        let got = judge(&node(UUID), &answered(&missing, None)).expect_err("no uuid");
        assert_eq!(got.reason, Reason::NotOwnMachine);
    }

    #[test]
    fn a_power_off_that_could_not_be_sent_fails_only_when_asked() {
        let f = facts(SystemUuid::parse(Some(UUID)));
        let no = Some(Err(
            "the System does not list ForceOff among its reset types".into(),
        ));
        let got = judge(&node(UUID), &answered(&f, no)).expect_err("no ForceOff");
        assert_eq!(got.reason, Reason::NoForceOff);
        assert!(got.detail.contains("ForceOff"), "{got:?}");
    }

    fn vm_node() -> NodeFacts {
        let mut n = NodeFacts::bare("gke-1", Readiness::Ready);
        n.instance = InstanceId::parse("gce://proj-fencer/europe-west1-b/gke-1");
        n
    }

    #[test]
    fn a_clouds_answers_are_classed_and_mended_on_that_cloud() {
        let ec2 = {
            let mut n = NodeFacts::bare("ip-10-0-0-1", Readiness::Ready);
            n.instance = InstanceId::parse("i-0123456789abcdef0");
            n
        };
        let cases = [
            (
                &ec2,
                Some("UnauthorizedOperation"),
                Reason::Forbidden,
                "aws_actions",
            ),
            (&ec2, Some("AuthFailure"), Reason::Unauthorized, "role"),
            (
                &ec2,
                Some("InvalidInstanceID.NotFound"),
                Reason::NotFound,
                "region",
            ),
            (
                &vm_node(),
                Some("403"),
                Reason::Forbidden,
                "node-fencer-gcp",
            ),
            (
                &vm_node(),
                Some("401"),
                Reason::Unauthorized,
                "service account",
            ),
            (&vm_node(), Some("500"), Reason::Failed, "detail"),
        ];
        for (node, code, want, fix) in cases {
            let look = Look::Failed {
                code,
                message: "ec2:DetachVolume: denied",
            };
            let got = judge(node, &look).expect_err("failed");
            assert_eq!(got.reason, want, "{code:?}");
            assert!(got.fix.contains(fix), "{code:?}: {}", got.fix);
        }
        let gone = judge(&vm_node(), &Look::Unknown).expect_err("unknown");
        assert_eq!(gone.reason, Reason::NotFound);
        assert!(gone.detail.contains("gke-1"), "{gone:?}");
        assert!(gone.fix.contains("project"), "{gone:?}");
        assert!(
            judge(&ec2, &Look::Unknown)
                .expect_err("unknown")
                .fix
                .contains("region")
        );
    }

    #[test]
    fn a_vm_of_the_nodes_name_made_after_it_registered_is_not_its_machine() {
        let mut node = vm_node();
        node.machine.created_at = Some(1_000);
        let id = node.instance.clone().expect("a VM");
        let mut later = InstanceFacts::bare(id, InstanceState::Running);
        later.identity.created_at = Some(2_000);
        let got = judge(&node, &answered(&later, None)).expect_err("recreated");
        assert_eq!(got.reason, Reason::NotOwnMachine);
        assert!(got.detail.contains("created after Node gke-1"), "{got:?}");
        later.identity.created_at = Some(900);
        assert_eq!(judge(&node, &answered(&later, None)), Ok(()));
    }

    #[test]
    fn the_record_keeps_what_is_news_across_invocations() {
        let first = [
            witnessed("a", None),
            witnessed("b", Some(Reason::Forbidden)),
        ];
        let text = record_text(&known_after(&first));
        assert_eq!(text, r#"{"forbidden":["b"]}"#);
        let kept = known_from_record(&text).expect("a record");
        assert!(
            changes(&kept, &first).is_empty(),
            "the same again is no news"
        );
        let then = [witnessed("a", Some(Reason::NotFound)), witnessed("b", None)];
        let told: Vec<&str> = changes(&kept, &then)
            .iter()
            .map(|w| w.node.as_str())
            .collect();
        assert_eq!(told, ["a", "b"], "a new failure and a restored witness");
        assert_eq!(known_from_record("{}"), Some(Known::new()));
        assert_eq!(known_from_record(r#"{"gone":["b"]}"#), None);
        assert_eq!(known_from_record(r#"{"b":"gone"}"#), None);
        assert_eq!(known_from_record("not json"), None);
        // The record the version before wrote, one reason per Node.
        assert_eq!(
            known_from_record(r#"{"b":"forbidden"}"#),
            Some(Known::from([("b".to_owned(), Some(Reason::Forbidden))]))
        );
    }

    /// `n` Nodes named as EKS names them, each failing for `reason`.
    fn fleet(n: usize, reason: Option<Reason>) -> Vec<Witnessed> {
        (0..n)
            .map(|i| {
                let name = format!(
                    "ip-10-{}-{}-{}.eu-west-1.compute.internal",
                    i / 65_536,
                    (i / 256) % 256,
                    i % 256
                );
                witnessed(&name, reason)
            })
            .collect()
    }

    #[test]
    fn five_thousand_failing_nodes_fit_the_record_compressed() {
        let round = fleet(5_000, Some(Reason::Forbidden));
        let text = record_text(&known_after(&round));
        assert!(text.starts_with(COMPRESSED), "{}", &text[..40]);
        // Plain, it would be 5,000 names of about 40 bytes: past the
        // annotations' 256 KiB.
        assert!(text.len() < 64 * 1024, "{} bytes", text.len());
        let kept = known_from_record(&text).expect("the record reads back");
        assert_eq!(kept, known_after(&round));
        assert!(changes(&kept, &round).is_empty());
        let small = record_text(&known_after(&fleet(3, Some(Reason::Forbidden))));
        assert!(small.starts_with('{'), "a small record stays readable");
    }

    #[test]
    fn a_record_that_does_not_decode_or_inflates_too_far_is_none() {
        assert_eq!(known_from_record("gzip+base64:not base64!"), None);
        assert_eq!(
            known_from_record(&format!("{COMPRESSED}{}", BASE64.encode(b"not gzip"))),
            None
        );
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let zeros = vec![b' '; 1024 * 1024];
        for _ in 0..=RECORD_INFLATED_MAX / (1024 * 1024) {
            std::io::Write::write_all(&mut gz, &zeros).expect("in memory");
        }
        let bomb = gz.finish().expect("in memory");
        assert_eq!(
            known_from_record(&format!("{COMPRESSED}{}", BASE64.encode(bomb))),
            None
        );
    }

    #[test]
    fn an_untold_change_stays_news_for_the_next_round() {
        let before = known_after(&[
            witnessed("a", Some(Reason::Unreachable)),
            witnessed("gone", Some(Reason::Unreachable)),
        ]);
        let now = [
            witnessed("a", None),
            witnessed("b", Some(Reason::Forbidden)),
            witnessed("c", Some(Reason::Forbidden)),
        ];
        let known = known_told(&before, &now, &BTreeSet::from(["b"]));
        assert_eq!(
            known,
            Known::from([
                ("a".to_owned(), Some(Reason::Unreachable)),
                ("b".to_owned(), Some(Reason::Forbidden)),
            ]),
            "a's restoration and c's failure were not told; the deleted Node is forgotten"
        );
        let next: Vec<&str> = changes(&known, &now)
            .iter()
            .map(|w| w.node.as_str())
            .collect();
        assert_eq!(next, ["a", "c"]);
    }

    #[test]
    fn new_failures_past_the_record_are_held_and_restorations_never() {
        // Names that do not compress: a hash each.
        let name = |i: u64| {
            let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
            (0..4)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    format!("{x:016x}")
                })
                .collect::<String>()
        };
        let recorded = witnessed("already", Some(Reason::Unreachable));
        let mut now: Vec<Witnessed> = (0..4_000)
            .map(|i| witnessed(&name(i), Some(Reason::Forbidden)))
            .collect();
        now.push(witnessed("already", None));
        let before = known_after(&[recorded]);
        let (told, held) = fitting(&before, &now, changes(&before, &now));
        assert!(held > 0, "4,000 names of 64 random digits do not fit");
        assert_eq!(told.len() + held, 4_001);
        assert!(
            told.iter().any(|w| w.node == "already"),
            "a restoration is always told"
        );
        let names: BTreeSet<&str> = told.iter().map(|w| w.node.as_str()).collect();
        let record = record_text(&known_told(&before, &now, &names));
        assert!(record.len() <= RECORD_MAX, "{} bytes", record.len());
        // One more would not have fitted: the search took all it could.
        let mut more = names.clone();
        let next = now
            .iter()
            .map(|w| w.node.as_str())
            .filter(|n| !names.contains(n))
            .min()
            .expect("one held");
        more.insert(next);
        assert!(record_text(&known_told(&before, &now, &more)).len() > RECORD_MAX);

        let few = fleet(10, Some(Reason::Forbidden));
        let (told, held) = fitting(&Known::new(), &few, changes(&Known::new(), &few));
        assert_eq!((told.len(), held), (10, 0));
    }

    #[test]
    fn every_reason_has_its_own_code() {
        let codes: std::collections::BTreeSet<&str> =
            Reason::ALL.iter().map(|r| r.code()).collect();
        assert_eq!(codes.len(), Reason::ALL.len());
    }

    /// Issue 58: a role that lost a verb every fencing uses fails every
    /// Node's witness, on every provider; a machine's own failure stays.
    #[test]
    fn a_grant_kubernetes_denies_fails_every_witness_that_serves() {
        let mut round = [
            witnessed("a", None),
            witnessed("b", Some(Reason::Unreachable)),
        ];
        denied_by_kubernetes(&mut round, &[]);
        assert_eq!(round[0].reason(), None, "nothing denied: no change");
        denied_by_kubernetes(&mut round, &["patch nodes".into(), "delete pods".into()]);
        assert_eq!(round[0].reason(), Some(Reason::KubernetesDenied));
        assert_eq!(round[1].reason(), Some(Reason::Unreachable));
        let failing = round[0].verdict.as_ref().unwrap_err();
        assert_eq!(
            failing.detail,
            "Kubernetes denies node-fencer: patch nodes, delete pods"
        );
        for provider in [Provider::Aws, Provider::Gce, Provider::Redfish] {
            assert!(Reason::KubernetesDenied.fix(provider).contains("rbac.yaml"));
        }
    }

    fn witnessed(node: &str, reason: Option<Reason>) -> Witnessed {
        Witnessed {
            node: node.into(),
            machine: format!("redfish://{node}"),
            verdict: match reason {
                None => Ok(()),
                Some(reason) => Err(Failing {
                    reason,
                    detail: String::new(),
                    fix: reason.fix(Provider::Redfish),
                }),
            },
        }
    }

    #[test]
    fn a_change_is_told_once_and_a_first_look_that_serves_is_no_news() {
        let first = [
            witnessed("a", None),
            witnessed("b", Some(Reason::Unauthorized)),
        ];
        let told: Vec<&str> = changes(&Known::new(), &first)
            .iter()
            .map(|w| w.node.as_str())
            .collect();
        assert_eq!(told, ["b"]);
        let known = known_after(&first);
        assert!(
            changes(&known, &first).is_empty(),
            "the same again is no news"
        );

        let second = [
            witnessed("a", Some(Reason::Unreachable)),
            witnessed("b", Some(Reason::TlsRejected)),
        ];
        assert_eq!(changes(&known, &second).len(), 2);
        let third = [
            witnessed("a", None),
            witnessed("b", Some(Reason::TlsRejected)),
        ];
        let told: Vec<&str> = changes(&known_after(&second), &third)
            .iter()
            .map(|w| w.node.as_str())
            .collect();
        assert_eq!(told, ["a"], "serving again is news");
    }
}

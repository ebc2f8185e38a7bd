//! Whether node-fencer could act on a Node if it died now: the witness of
//! its machine (its BMC on-premises) answers, for the Node's own machine,
//! and would take a forced power-off when active fencing may send one. A
//! BMC with a changed password, a rotated certificate or a board whose UUID
//! is no longer the Node's is found here, on a quiet day, and not during
//! the outage, when the Node waits for a person.
//!
//! Nothing here changes anything: the verdicts feed a metric per machine,
//! an Event on the Node and a notice, each told once per change.

use std::collections::BTreeMap;

use crate::core::model::facts::{InstanceFacts, NodeFacts};
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
    /// The account may not read what a fencing reads.
    Forbidden,
    /// The machine is not there (a wrong path, a System removed).
    NotFound,
    /// The machine that answered is not the Node's: its UUID is another.
    NotOwnMachine,
    /// The UUID that ties the Node to the machine names no one machine.
    IdentityInDoubt,
    /// Active fencing could not power it off: no `ForceOff` reset, or a
    /// reset target outside the System.
    NoForceOff,
    /// Any other failure.
    Failed,
}

impl Reason {
    /// Every reason, for the metric's catalog and the rules' tests.
    pub const ALL: [Reason; 9] = [
        Self::Unreachable,
        Self::Unauthorized,
        Self::TlsRejected,
        Self::Forbidden,
        Self::NotFound,
        Self::NotOwnMachine,
        Self::IdentityInDoubt,
        Self::NoForceOff,
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
            Self::Failed => "failed",
        }
    }

    /// What mends it, for the Event and the notice.
    pub fn fix(self) -> &'static str {
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
            Self::Failed => "see the detail",
        }
    }

    /// The reason of a failed look, from the code the shell gave its error.
    pub fn of_error(code: Option<&str>) -> Self {
        match code {
            Some("Unreachable" | "Timeout") => Self::Unreachable,
            Some("Unauthorized") => Self::Unauthorized,
            Some("TlsRejected") => Self::TlsRejected,
            Some("Forbidden") => Self::Forbidden,
            Some("NotFound" | "NoSystem") => Self::NotFound,
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
}

/// Whether `node`'s witness could serve a fencing, from one `look`.
pub fn judge(node: &NodeFacts, look: &Look<'_>) -> Result<(), Failing> {
    let fail = |reason, detail: String| Err(Failing { reason, detail });
    match look {
        Look::Failed { code, message } => fail(Reason::of_error(*code), (*message).to_owned()),
        Look::Answered { facts, force_off } => {
            if !facts.identity.may_be_machine_of(&node.machine) {
                return match identity::doubt(node, facts.identity.system_uuid) {
                    Some(doubt) => fail(Reason::IdentityInDoubt, format!("{}: {doubt}", facts.id)),
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

    #[test]
    fn every_reason_has_its_own_code() {
        let codes: std::collections::BTreeSet<&str> =
            Reason::ALL.iter().map(|r| r.code()).collect();
        assert_eq!(codes.len(), Reason::ALL.len());
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

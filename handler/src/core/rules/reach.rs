//! Which Nodes node-fencer may act on at all: those `NODE_SELECTOR` selects
//! (every Node when it is unset), less those that opt out with the
//! [`OPT_OUT_LABEL`]. Every path that would act on a Node asks here first:
//! the decision to fence (whatever triggered it, the sweep included) and
//! active fencing's power-off. Recovery of a fencing made earlier does not:
//! a veto added since must not keep a Node out of service.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::core::model::selector::LabelSelector;
use crate::core::model::values;

/// The label by which a Node opts out: node-fencer neither fences it nor
/// powers it off. `true` opts out; so does any value but a clear no
/// (`false`, `no`, `off`, `0`): a veto mistyped still vetoes.
pub const OPT_OUT_LABEL: &str = "node-fencer.io/exclude";

/// The Nodes node-fencer may act on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    /// `NODE_SELECTOR`; `None`: every Node.
    pub selector: Option<LabelSelector>,
}

/// Why a Node is outside node-fencer's reach.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "exempt")]
pub enum Exemption {
    /// `NODE_SELECTOR` does not select it.
    OutOfScope {
        /// The selector, in its canonical form.
        selector: String,
    },
    /// It carries the opt-out label.
    OptedOut,
}

impl Reach {
    /// Everything, as without `NODE_SELECTOR`.
    pub const EVERYWHERE: Reach = Reach { selector: None };

    /// Why a Node with `labels` may not be acted on; `None` when it may.
    /// The opt-out comes first: it is the Node's own word.
    pub fn exemption(&self, labels: &BTreeMap<String, String>) -> Option<Exemption> {
        let opted_out = labels
            .get(OPT_OUT_LABEL)
            .is_some_and(|v| values::parse_bool(v) != Some(false));
        if opted_out {
            return Some(Exemption::OptedOut);
        }
        match &self.selector {
            Some(s) if !s.matches(labels) => Some(Exemption::OutOfScope {
                selector: s.to_string(),
            }),
            _ => None,
        }
    }
}

/// How many Nodes are within reach, and why the others are not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// May be fenced or powered off.
    pub within: usize,
    /// Not selected by `NODE_SELECTOR`.
    pub out_of_scope: usize,
    /// Opted out.
    pub opted_out: usize,
}

impl Reach {
    /// Counts the Nodes of `labels` (one label set per Node).
    pub fn tally<'a>(
        &self,
        labels: impl IntoIterator<Item = &'a BTreeMap<String, String>>,
    ) -> Tally {
        let mut tally = Tally::default();
        for l in labels {
            match self.exemption(l) {
                None => tally.within += 1,
                Some(Exemption::OutOfScope { .. }) => tally.out_of_scope += 1,
                Some(Exemption::OptedOut) => tally.opted_out += 1,
            }
        }
        tally
    }
}

impl Exemption {
    /// A short, stable name for logs, events and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::OutOfScope { .. } => "out_of_scope",
            Self::OptedOut => "opted_out",
        }
    }
}

impl std::fmt::Display for Exemption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OutOfScope { selector } => write!(
                f,
                "NODE_SELECTOR ({selector}) does not select the node: node-fencer leaves it alone"
            ),
            Self::OptedOut => write!(
                f,
                "the node opts out (label {OPT_OUT_LABEL}): node-fencer leaves it alone"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::selector::labels;

    #[test]
    fn the_selector_and_the_opt_out_as_a_table() {
        let stateful = Reach {
            selector: Some(LabelSelector::parse("pool=stateful").unwrap()),
        };
        let out = || {
            Some(Exemption::OutOfScope {
                selector: "pool=stateful".into(),
            })
        };
        for (reach, node, want) in [
            (&Reach::EVERYWHERE, labels(&[]), None),
            (&Reach::EVERYWHERE, labels(&[("pool", "web")]), None),
            (&stateful, labels(&[("pool", "stateful")]), None),
            (&stateful, labels(&[("pool", "web")]), out()),
            (&stateful, labels(&[]), out()),
            (
                &Reach::EVERYWHERE,
                labels(&[(OPT_OUT_LABEL, "true")]),
                Some(Exemption::OptedOut),
            ),
            (
                &stateful,
                labels(&[("pool", "stateful"), (OPT_OUT_LABEL, "yes")]),
                Some(Exemption::OptedOut),
            ),
            // Opted out and out of scope: the Node's own word is given.
            (
                &stateful,
                labels(&[(OPT_OUT_LABEL, "True")]),
                Some(Exemption::OptedOut),
            ),
            // Only a clear no is no opt-out: a mistyped veto still vetoes.
            (
                &Reach::EVERYWHERE,
                labels(&[(OPT_OUT_LABEL, "false")]),
                None,
            ),
            (&Reach::EVERYWHERE, labels(&[(OPT_OUT_LABEL, "No")]), None),
            (
                &Reach::EVERYWHERE,
                labels(&[(OPT_OUT_LABEL, "")]),
                Some(Exemption::OptedOut),
            ),
            (
                &Reach::EVERYWHERE,
                labels(&[(OPT_OUT_LABEL, "ture")]),
                Some(Exemption::OptedOut),
            ),
        ] {
            assert_eq!(reach.exemption(&node), want, "{node:?}");
        }
    }

    #[test]
    fn the_tally_counts_each_node_once() {
        let stateful = Reach {
            selector: Some(LabelSelector::parse("pool=stateful").unwrap()),
        };
        let nodes = [
            labels(&[("pool", "stateful")]),
            labels(&[("pool", "stateful"), (OPT_OUT_LABEL, "true")]),
            labels(&[("pool", "web")]),
            labels(&[]),
        ];
        assert_eq!(
            stateful.tally(&nodes),
            Tally {
                within: 1,
                out_of_scope: 2,
                opted_out: 1
            }
        );
        assert_eq!(Reach::EVERYWHERE.tally(&nodes).within, 3);
    }

    #[test]
    fn the_reasons_name_the_setting_and_the_label() {
        let out = Exemption::OutOfScope {
            selector: "pool=stateful".into(),
        };
        assert!(out.to_string().contains("NODE_SELECTOR (pool=stateful)"));
        assert!(Exemption::OptedOut.to_string().contains(OPT_OUT_LABEL));
        assert_eq!(out.code(), "out_of_scope");
        assert_eq!(Exemption::OptedOut.code(), "opted_out");
    }
}

//! The Kubernetes grants node-fencer uses, one per verb and resource, and
//! which configurations need each: what preflight asks one by one, and what
//! every witness round asks again, so that a role that lost a verb on a
//! quiet day is told before a node dies.

use crate::core::model::facts::FenceMode;
use crate::core::rules::control;
use crate::core::settings::permissions::{
    CONTROL_RULES, KUBERNETES_RULES, NODE_LEASE_NAMESPACE, NODE_LEASE_RULES,
};

/// One verb on one resource, cluster-wide or in a namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The API group (`""` for the core group).
    pub group: &'static str,
    /// The resource, with its subresource (`nodes/status`).
    pub resource: &'static str,
    /// The verb.
    pub verb: &'static str,
    /// The namespace, and the object's name where the grant names it;
    /// `None` for a cluster-wide grant.
    pub scope: Option<(String, Option<&'static str>)>,
}

/// Every grant the code uses, in the order preflight lists them: the
/// cluster-wide rules, the control namespace's objects (granted by name,
/// but for `create`, which cannot name one), the census and witness
/// Leases, the kubelets' Leases.
pub fn all(control_namespace: &str) -> Vec<Grant> {
    let ns = || control_namespace.to_owned();
    let cluster_wide = of(KUBERNETES_RULES, |_| None);
    // Creating cannot name the object; the others are granted by name.
    let namespaced = of(CONTROL_RULES, |verb| {
        Some((ns(), (verb != "create").then_some(control::OBJECT_NAME)))
    });
    let leases = [control::CENSUS_NAME, control::WITNESS_NAME]
        .into_iter()
        .flat_map(|name| {
            ["get", "update"].into_iter().map(move |verb| Grant {
                group: "coordination.k8s.io",
                resource: "leases",
                verb,
                scope: Some((ns(), Some(name))),
            })
        });
    let node_leases = of(NODE_LEASE_RULES, |_| {
        Some((NODE_LEASE_NAMESPACE.to_owned(), None))
    });
    cluster_wide
        .chain(namespaced)
        .chain(leases)
        .chain(node_leases)
        .collect()
}

/// One grant per verb of `rules`, each in the scope `scope` gives its verb.
fn of<'r>(
    rules: &'r [(&'static str, &'static str, &'static [&'static str])],
    scope: impl Fn(&str) -> Option<(String, Option<&'static str>)> + Copy + 'r,
) -> impl Iterator<Item = Grant> + 'r {
    rules.iter().flat_map(move |(group, resource, verbs)| {
        verbs.iter().map(move |verb| Grant {
            group,
            resource,
            verb,
            scope: scope(verb),
        })
    })
}

impl Grant {
    /// The scope as the SelfSubjectAccessReview takes it.
    pub fn scope(&self) -> Option<(&str, Option<&str>)> {
        self.scope.as_ref().map(|(ns, name)| (ns.as_str(), *name))
    }

    /// The grant as a person reads it: `patch nodes`,
    /// `update leases.coordination.k8s.io in kube-system (node-fencer-census)`;
    /// the control objects' own name is left out.
    pub fn what(&self) -> String {
        let resource = if self.group.is_empty() {
            self.resource.to_owned()
        } else {
            format!("{}.{}", self.resource, self.group)
        };
        match self.scope() {
            None => format!("{} {resource}", self.verb),
            Some((ns, Some(name))) if name != control::OBJECT_NAME => {
                format!("{} {resource} in {ns} ({name})", self.verb)
            }
            Some((ns, _)) => format!("{} {resource} in {ns}", self.verb),
        }
    }

    /// The legacy mode's grant, which the taint mode never uses.
    pub fn legacy_only(&self) -> bool {
        (self.resource, self.verb) == ("volumeattachments", "delete")
    }

    /// Only `FAST_NOT_READY` needs it: the kubelets' Leases.
    pub fn fast_only(&self) -> bool {
        self.scope()
            .is_some_and(|(ns, _)| ns == NODE_LEASE_NAMESPACE)
    }

    /// A Node status write: `FAST_NOT_READY`'s mark, and the legacy mode's
    /// release of `volumesInUse`, without which the legacy mode frees the
    /// volumes later (on the attach/detach controller's sync) but frees them.
    pub fn status_write(&self) -> bool {
        self.resource == "nodes/status"
    }

    /// Whether a fencing under `mode` (`None`: not known) fails without it.
    pub fn required(&self, mode: Option<FenceMode>, fast_not_ready: bool) -> bool {
        let legacy = mode == Some(FenceMode::Legacy);
        let for_legacy = self.legacy_only() && !legacy;
        let for_fast = (self.fast_only() || self.status_write()) && !fast_not_ready;
        !for_legacy && !for_fast
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(what: &str) -> Grant {
        all("kube-system")
            .into_iter()
            .find(|g| g.what() == what)
            .unwrap_or_else(|| panic!("no grant {what}"))
    }

    #[test]
    fn every_rule_verb_is_one_grant_named_as_preflight_names_it() {
        let grants = all("kube-system");
        let verbs = |rules: &[(&str, &str, &[&str])]| -> usize {
            rules.iter().map(|(_, _, verbs)| verbs.len()).sum()
        };
        let expected = verbs(KUBERNETES_RULES) + verbs(CONTROL_RULES) + 4 + verbs(NODE_LEASE_RULES);
        assert_eq!(grants.len(), expected);
        let whats: Vec<String> = grants.iter().map(Grant::what).collect();
        for what in [
            "patch nodes",
            "delete volumeattachments.storage.k8s.io",
            "create events.events.k8s.io",
            "update leases.coordination.k8s.io in kube-system",
            "update leases.coordination.k8s.io in kube-system (node-fencer-census)",
            "update leases.coordination.k8s.io in kube-system (node-fencer-witness)",
            "get leases.coordination.k8s.io in kube-node-lease",
        ] {
            assert!(whats.iter().any(|w| w == what), "{what}: {whats:?}");
        }
        // Creating cannot name the object; the others are granted by name.
        assert_eq!(
            named("create leases.coordination.k8s.io in kube-system").scope(),
            Some(("kube-system", None))
        );
        assert_eq!(
            named("get configmaps in kube-system").scope(),
            Some(("kube-system", Some(control::OBJECT_NAME)))
        );
    }

    #[test]
    fn a_grant_is_required_only_where_a_fencing_uses_it() {
        let taint = Some(FenceMode::Taint);
        let legacy = Some(FenceMode::Legacy);
        assert!(named("patch nodes").required(taint, false));
        assert!(named("patch nodes").required(None, false));
        let attachments = named("delete volumeattachments.storage.k8s.io");
        assert!(!attachments.required(taint, true));
        assert!(!attachments.required(None, true));
        assert!(attachments.required(legacy, false));
        let lease = named("get leases.coordination.k8s.io in kube-node-lease");
        assert!(!lease.required(taint, false));
        assert!(lease.required(taint, true));
        // The legacy mode frees the volumes without it, a minute later.
        let status = named("patch nodes/status");
        assert!(!status.required(legacy, false));
        assert!(status.required(taint, true));
    }
}

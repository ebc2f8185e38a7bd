//! Legacy mode's release of a dead Node's volumes from `status.volumesInUse`.
//!
//! The attach/detach controller detaches a volume only when no pod wants it
//! on the node any more *and* the node no longer reports it mounted
//! (`volumesInUse`, what the kubelet last wrote), or once its
//! `maxWaitForUnmountDuration` (6 minutes) has passed. A dead kubelet never
//! reports the unmount. Once the machine is proven off and the node's pods
//! force-deleted, taking the volumes of the attachments the recipe frees out
//! of that list is the unmount the kubelet would have reported: the
//! controller detaches them at once, through each driver, and marks them
//! detached, rather than on its periodic sync after someone else deleted the
//! VolumeAttachment (up to a minute). A volume a staying pod mounts keeps its
//! entry; the controller would not detach it anyway while that pod wants it.

use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use crate::core::model::facts::PvFacts;
use crate::core::model::kube_read::csi_unique_name;
use crate::core::rules::volumes::AttachmentAction;

/// The names `status.volumesInUse` gives the volumes of the attachments
/// the recipe deletes (`kubernetes.io/csi/<driver>^<handle>`, from each
/// PersistentVolume's `spec.csi`), sorted, without repeats, and without any
/// name of a volume a staying pod keeps. An inline volume, or a PV without
/// `spec.csi`, has no name here: its attachment's deletion alone frees it.
pub fn to_release(actions: &[AttachmentAction], pvs: &[PvFacts]) -> Vec<String> {
    let name = |pv: &Option<String>| {
        let pv = pv.as_deref()?;
        let csi = pvs.iter().find(|p| p.name == pv)?.csi.as_ref()?;
        Some(csi_unique_name(csi))
    };
    let kept: Vec<String> = actions
        .iter()
        .filter_map(|a| match a {
            AttachmentAction::Keep { pv, .. } => name(pv),
            AttachmentAction::Delete { .. } => None,
        })
        .collect();
    let mut names: Vec<String> = actions
        .iter()
        .filter_map(|a| match a {
            AttachmentAction::Delete { pv, .. } => name(pv),
            AttachmentAction::Keep { .. } => None,
        })
        .filter(|n| !kept.contains(n))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// What the release found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// This many names were taken out.
    Released(usize),
    /// None of the names was listed (the kubelet never reported them, or
    /// the controller's own pass came first).
    NoneListed,
    /// The Node no longer exists.
    NodeGone,
}

/// What releasing `names` writes, given the Node as just read.
#[derive(Clone, Debug, PartialEq)]
pub enum ReleasePatch {
    /// Send this merge patch of `nodes/status` (it carries the
    /// resourceVersion read); it takes this many names out.
    Apply(Value, usize),
    /// None of the names is listed: nothing to write.
    NoneListed,
    /// The Node carries no resourceVersion: no guarded write is possible.
    NoResourceVersion,
}

/// The `nodes/status` merge patch that takes `names` out of the Node's
/// `status.volumesInUse` and keeps every other entry in its order. The
/// list has no merge key, so the patch carries it whole; the
/// resourceVersion makes a write over a kubelet's newer list a conflict,
/// to be read and decided again.
pub fn release_patch(node: &Node, names: &[String]) -> ReleasePatch {
    let listed = node
        .status
        .as_ref()
        .and_then(|s| s.volumes_in_use.as_deref())
        .unwrap_or_default();
    let left: Vec<&String> = listed.iter().filter(|v| !names.contains(v)).collect();
    if left.len() == listed.len() {
        return ReleasePatch::NoneListed;
    }
    let Some(rv) = node.metadata.resource_version.as_deref() else {
        return ReleasePatch::NoResourceVersion;
    };
    ReleasePatch::Apply(
        json!({
            "metadata": {"resourceVersion": rv},
            "status": {"volumesInUse": left},
        }),
        listed.len() - left.len(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::CsiVolume;

    fn pv(name: &str, csi: Option<(&str, &str)>) -> PvFacts {
        PvFacts {
            name: name.into(),
            volume: None,
            claim: None,
            csi: csi.map(|(driver, handle)| CsiVolume {
                driver: driver.into(),
                handle: handle.into(),
            }),
            shared: false,
        }
    }

    fn delete(pv: Option<&str>) -> AttachmentAction {
        AttachmentAction::Delete {
            attachment: format!("va-{}", pv.unwrap_or("inline")),
            uid: "uid".into(),
            driver: "d".into(),
            pv: pv.map(Into::into),
        }
    }

    fn keep(pv: &str) -> AttachmentAction {
        AttachmentAction::Keep {
            attachment: format!("va-{pv}"),
            driver: "d".into(),
            pv: Some(pv.into()),
            pod: "ns/daemon".into(),
        }
    }

    const CSTOR: &str = "kubernetes.io/csi/cstor.csi.openebs.io^pvc-1";
    const EBS: &str = "kubernetes.io/csi/ebs.csi.aws.com^vol-0a";
    const KEPT: &str = "kubernetes.io/csi/cstor.csi.openebs.io^pvc-kept";

    #[test]
    fn only_the_deleted_attachments_csi_volumes_are_released() {
        let pvs = [
            pv("pv-c", Some(("cstor.csi.openebs.io", "pvc-1"))),
            pv("pv-e", Some(("ebs.csi.aws.com", "vol-0a"))),
            pv("pv-k", Some(("cstor.csi.openebs.io", "pvc-kept"))),
            pv("pv-in-tree", None),
        ];
        let actions = [
            delete(Some("pv-e")),
            delete(Some("pv-c")),
            keep("pv-k"),
            delete(Some("pv-in-tree")),
            delete(None),
            delete(Some("pv-unknown")),
        ];
        assert_eq!(to_release(&actions, &pvs), [CSTOR, EBS]);
        assert!(to_release(&[keep("pv-k")], &pvs).is_empty());
    }

    #[test]
    fn a_volume_a_staying_pod_keeps_is_never_released() {
        // Two attachments of one volume (a stale one, and the staying
        // pod's): the name stays listed.
        let pvs = [
            pv("pv-a", Some(("cstor.csi.openebs.io", "pvc-kept"))),
            pv("pv-b", Some(("cstor.csi.openebs.io", "pvc-kept"))),
        ];
        assert!(to_release(&[delete(Some("pv-a")), keep("pv-b")], &pvs).is_empty());
    }

    fn node(rv: Option<&str>, in_use: &[&str]) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n2", "resourceVersion": rv},
            "status": {"volumesInUse": in_use},
        }))
        .unwrap()
    }

    #[test]
    fn the_patch_keeps_every_other_entry_and_carries_the_resource_version() {
        let names = [CSTOR.to_owned(), EBS.to_owned()];
        let got = release_patch(&node(Some("41"), &[KEPT, CSTOR, EBS]), &names);
        assert_eq!(
            got,
            ReleasePatch::Apply(
                json!({"metadata": {"resourceVersion": "41"}, "status": {"volumesInUse": [KEPT]}}),
                2
            )
        );
        let got = release_patch(&node(Some("41"), &[EBS]), &names);
        assert_eq!(
            got,
            ReleasePatch::Apply(
                json!({"metadata": {"resourceVersion": "41"}, "status": {"volumesInUse": []}}),
                1
            )
        );
    }

    #[test]
    fn nothing_listed_writes_nothing_and_no_resource_version_refuses() {
        let names = [CSTOR.to_owned()];
        assert_eq!(
            release_patch(&node(Some("41"), &[KEPT]), &names),
            ReleasePatch::NoneListed
        );
        assert_eq!(
            release_patch(&node(Some("41"), &[]), &names),
            ReleasePatch::NoneListed
        );
        assert_eq!(
            release_patch(&node(None, &[CSTOR]), &names),
            ReleasePatch::NoResourceVersion
        );
        let bare: Node = serde_json::from_value(json!({"metadata": {"name": "n2"}})).unwrap();
        assert_eq!(release_patch(&bare, &names), ReleasePatch::NoneListed);
    }
}

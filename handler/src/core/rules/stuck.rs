//! What a hung Node holds that Kubernetes does not free on its own: a
//! volume only one node may attach, attached to the Node, that a pod of
//! the Node mounts. The attach/detach controller keeps such a volume
//! attached as long as the pod is not known to have ended, and on a Node
//! whose kubelet is silent nothing ever reports that it has: a
//! StatefulSet's pod stays Terminating for good, its successor never
//! created, and any other controller's replacement waits on
//! `Multi-Attach error` until the controller's six-minute force-detach
//! after the eviction. A volume several nodes may attach (ReadWriteMany,
//! ReadOnlyMany) moves with the pod, a pod that has run to its end no
//! longer holds its volume, and a pod that tolerates the out-of-service
//! taint for good keeps it even once fenced: none of them is stuck. A
//! hung Node holding nothing stuck is left to Kubernetes, which evicts
//! and replaces its pods by itself. Pure.

use serde::Serialize;

use crate::core::model::facts::{PodRef, PvFacts};
use crate::core::rules::volumes::NodeAttachment;

/// A volume stuck on the Node, and the pod of the Node that holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stranded {
    /// The PersistentVolume, or the disk a pod names inline.
    pub volume: String,
    /// The pod, `namespace/name`.
    pub pod: String,
}

/// What was read of a Node's volumes and pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stranding {
    /// The volumes stuck on it ([`stranded`]); none when nothing is.
    Read(Vec<Stranded>),
    /// Its VolumeAttachments, PersistentVolumes or pods could not be read.
    Unread,
}

/// Each VolumeAttachment of the Node (`attachments`) whose volume only one
/// node may attach and that a pod of the Node (`pods`) mounts and holds
/// past an eviction, with that pod: a PersistentVolume (`pvs`) through its
/// bound claim, an inline disk by its name.
pub fn stranded(attachments: &[NodeAttachment], pods: &[PodRef], pvs: &[PvFacts]) -> Vec<Stranded> {
    let holds = |p: &&PodRef| !p.finished && !p.stays;
    attachments
        .iter()
        .filter_map(|a| {
            let (volume, pod) = match (&a.pv, &a.inline) {
                (Some(pv), _) => {
                    let pv = pvs.iter().find(|p| &p.name == pv).filter(|p| !p.shared)?;
                    let (namespace, claim) = pv.claim.as_ref()?;
                    let pod = pods
                        .iter()
                        .filter(holds)
                        .find(|p| &p.namespace == namespace && p.claims.contains(claim))?;
                    (pv.name.clone(), pod)
                }
                (None, Some(disk)) => {
                    let pod = pods
                        .iter()
                        .filter(holds)
                        .find(|p| p.inline.iter().any(|d| d == disk.disk_name()))?;
                    (disk.as_str().to_owned(), pod)
                }
                (None, None) => return None,
            };
            Some(Stranded {
                volume,
                pod: pod.key(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::instance::VolumeId;

    fn attachment(pv: Option<&str>, inline: Option<&str>) -> NodeAttachment {
        NodeAttachment {
            name: "csi-a".into(),
            uid: "uid-a".into(),
            driver: "ebs.csi.aws.com".into(),
            pv: pv.map(str::to_owned),
            inline: inline.map(|d| VolumeId::parse(d).expect("a valid disk")),
        }
    }

    fn pv(shared: bool) -> PvFacts {
        PvFacts {
            name: "pv-a".into(),
            volume: None,
            claim: Some(("db".into(), "data-db-0".into())),
            csi: None,
            shared,
        }
    }

    fn pod(claims: &[&str]) -> PodRef {
        PodRef {
            namespace: "db".into(),
            name: "db-0".into(),
            uid: "u".into(),
            claims: claims.iter().map(|c| (*c).to_owned()).collect(),
            ..PodRef::default()
        }
    }

    #[test]
    fn a_single_node_volume_a_pod_of_the_node_mounts_is_stuck() {
        let got = stranded(
            &[attachment(Some("pv-a"), None)],
            &[pod(&["data-db-0"])],
            &[pv(false)],
        );
        assert_eq!(
            got,
            [Stranded {
                volume: "pv-a".into(),
                pod: "db/db-0".into()
            }]
        );
    }

    #[test]
    fn a_shared_volume_a_finished_or_staying_pod_and_no_pod_are_not() {
        let va = [attachment(Some("pv-a"), None)];
        let mounting = pod(&["data-db-0"]);
        assert!(stranded(&va, std::slice::from_ref(&mounting), &[pv(true)]).is_empty());
        let finished = PodRef {
            finished: true,
            ..mounting.clone()
        };
        assert!(stranded(&va, &[finished], &[pv(false)]).is_empty());
        let stays = PodRef {
            stays: true,
            ..mounting.clone()
        };
        assert!(stranded(&va, &[stays], &[pv(false)]).is_empty());
        assert!(stranded(&va, &[pod(&["other"])], &[pv(false)]).is_empty());
        let elsewhere = PodRef {
            namespace: "web".into(),
            ..mounting.clone()
        };
        assert!(stranded(&va, &[elsewhere], &[pv(false)]).is_empty());
        // A PersistentVolume not read, or bound to no claim, ties no pod.
        assert!(stranded(&va, std::slice::from_ref(&mounting), &[]).is_empty());
        let unbound = PvFacts {
            claim: None,
            ..pv(false)
        };
        assert!(stranded(&va, &[mounting], &[unbound]).is_empty());
    }

    #[test]
    fn an_inline_disk_a_pod_names_is_stuck() {
        let disk = "vol-0123456789abcdef0";
        let va = [attachment(None, Some(disk))];
        let naming = PodRef {
            inline: vec![disk.into()],
            ..pod(&[])
        };
        let got = stranded(&va, &[naming], &[]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].volume, disk);
        assert!(stranded(&va, &[pod(&[])], &[]).is_empty());
        assert!(stranded(&[attachment(None, None)], &[pod(&[])], &[]).is_empty());
    }
}

//! Which disks (EBS volumes, Persistent Disks) belong to a node's
//! attachments, and what to do with each once the cloud has described
//! them. Pure.

use std::fmt::Write as _;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::core::model::facts::{
    AttachmentFacts, CsiVolume, FenceMode, InstanceFacts, PodRef, PvFacts, VolumeFacts,
};
use crate::core::model::instance::{InstanceId, VolumeId, VolumeState, is_cloud_disk_driver};

/// A volume that backs one of the node's VolumeAttachments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeVolume {
    /// The EBS volume.
    pub volume: VolumeId,
    /// The PersistentVolume it backs (none for inline volumes).
    pub pv: Option<String>,
    /// The VolumeAttachment that ties it to the node.
    pub attachment: String,
    /// That VolumeAttachment's `metadata.uid`.
    pub(crate) attachment_uid: String,
}

/// The EBS volumes behind the VolumeAttachments of `node`, through their
/// PersistentVolumes. Attachments of other drivers are not ours to touch.
/// In-tree `awsElasticBlockStore` PVs count too: CSI migration attaches them
/// through `ebs.csi.aws.com` (the in-tree attacher no longer exists), and
/// in-tree `gcePersistentDisk` PVs through `pd.csi.storage.gke.io`; their
/// `UNSPECIFIED` project is the project of the node's `machine`.
pub fn volumes_of_node(
    node: &str,
    machine: Option<&InstanceId>,
    attachments: &[AttachmentFacts],
    pvs: &[PvFacts],
) -> Vec<NodeVolume> {
    let mut out: Vec<NodeVolume> = attachments
        .iter()
        .filter(|va| va.node_name == node)
        .filter(|va| is_cloud_disk_driver(&va.attacher))
        .filter_map(|va| {
            let (volume, pv) = match (&va.pv_name, &va.inline_volume) {
                (Some(pv_name), _) => {
                    let pv = pvs.iter().find(|p| &p.name == pv_name)?;
                    (pv.volume.clone()?, Some(pv_name.clone()))
                }
                (None, Some(volume)) => (volume.clone(), None),
                (None, None) => return None,
            };
            Some(NodeVolume {
                volume: volume.on_machine(machine),
                pv,
                attachment: va.name.clone(),
                attachment_uid: va.uid.clone(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.volume.cmp(&b.volume));
    out.dedup_by(|a, b| a.volume == b.volume);
    out
}

/// The name Kubernetes gives the VolumeAttachment of a CSI volume to a
/// node: `csi-` and the hex SHA-256 of the volume handle, the driver and the
/// node name run together, as the CSI attacher of kube-controller-manager
/// names it. Knowing the name, the attachment is one read, not a list of
/// every attachment in the cluster.
pub fn attachment_name(volume: &CsiVolume, node: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(volume.handle.as_bytes());
    hasher.update(volume.driver.as_bytes());
    hasher.update(node.as_bytes());
    let mut name = String::with_capacity(4 + 64);
    name.push_str("csi-");
    for byte in hasher.finalize() {
        let _ = write!(name, "{byte:02x}");
    }
    name
}

/// The VolumeAttachments of `node` to read by name, from the CSI volumes
/// its Node records ([`crate::core::model::facts::NodeFacts::attached`]): those of
/// EBS, or in legacy mode those of every CSI driver (the recipe frees them
/// all). `None` when the Node does not record its volumes: its
/// attachments are then found in the list of all of them. What is read is
/// checked like what is listed: an attachment counts only if it names the
/// node, and a volume is detached only if EC2 shows it on the instance.
pub fn attachment_names(
    node: &str,
    attached: Option<&[CsiVolume]>,
    mode: FenceMode,
) -> Option<Vec<String>> {
    Some(
        attached?
            .iter()
            .filter(|v| mode == FenceMode::Legacy || is_cloud_disk_driver(&v.driver))
            .map(|v| attachment_name(v, node))
            .collect(),
    )
}

/// What to do with one of the node's volumes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum VolumeAction {
    /// Force-detach it from the instance.
    Detach {
        /// The volume.
        volume: VolumeId,
        /// Its device on the instance.
        device: Option<String>,
    },
    /// Already detached from this instance: nothing to do.
    NotAttached {
        /// The volume.
        volume: VolumeId,
        /// Its EC2 state.
        state: VolumeState,
    },
    /// Never detached.
    Refuse {
        /// The volume.
        volume: VolumeId,
        /// Why.
        reason: String,
    },
    /// Left attached: a pod that stays on the node (it tolerates the
    /// out-of-service taint) uses it. Its VolumeAttachment stays with the
    /// pod, and the volume with it.
    Keep {
        /// The volume.
        volume: VolumeId,
        /// The pod, `namespace/name`.
        pod: String,
    },
}

impl VolumeAction {
    /// The volume concerned.
    pub fn volume(&self) -> &VolumeId {
        match self {
            Self::Detach { volume, .. }
            | Self::NotAttached { volume, .. }
            | Self::Refuse { volume, .. }
            | Self::Keep { volume, .. } => volume,
        }
    }
}

/// The pod that keeps each of the node's volumes attached, if any: one that
/// stays on the node and mounts the claim bound to the volume's
/// PersistentVolume. Detaching it would leave a VolumeAttachment that no
/// eviction ever removes, and a pod that finds its disk gone when the node
/// comes back.
pub fn kept_by_pods(
    volumes: &[NodeVolume],
    pods: &[PodRef],
    pvs: &[PvFacts],
) -> Vec<(VolumeId, String)> {
    volumes
        .iter()
        .filter_map(|nv| {
            let pod = match nv.pv.as_deref() {
                Some(pv) => staying_pod(pv, pods, pvs),
                None => inline_of_staying_pod(&nv.volume, pods),
            }?;
            Some((nv.volume.clone(), pod))
        })
        .collect()
}

/// The pod, `namespace/name`, that stays on the node and names `volume`
/// inline, without a PersistentVolume, if any.
fn inline_of_staying_pod(volume: &VolumeId, pods: &[PodRef]) -> Option<String> {
    pods.iter()
        .filter(|p| p.stays)
        .find(|p| p.inline.iter().any(|d| d == volume.disk_name()))
        .map(PodRef::key)
}

/// The pod, `namespace/name`, that stays on the node and mounts the claim
/// bound to the PersistentVolume `pv`, if any.
fn staying_pod(pv: &str, pods: &[PodRef], pvs: &[PvFacts]) -> Option<String> {
    let (namespace, claim) = pvs.iter().find(|p| p.name == pv)?.claim.as_ref()?;
    pods.iter()
        .filter(|p| p.stays && &p.namespace == namespace)
        .find(|p| p.claims.contains(claim))
        .map(PodRef::key)
}

/// One of the node's VolumeAttachments, whatever its CSI driver: what the
/// legacy recipe deletes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAttachment {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.attacher`: the CSI driver.
    pub driver: String,
    /// The PersistentVolume (none for inline volumes).
    pub pv: Option<String>,
    /// The disk of an inline volume (an in-tree one migrated to CSI).
    pub(crate) inline: Option<VolumeId>,
}

/// Every VolumeAttachment of `node`, of every driver, by name. Without the
/// out-of-service taint, Kubernetes holds each of them for its
/// `maxWaitForUnmountDuration` whatever the driver, so the legacy recipe
/// frees them all, not only those of the cloud's own disks.
pub fn attachments_of_node(node: &str, attachments: &[AttachmentFacts]) -> Vec<NodeAttachment> {
    let mut out: Vec<NodeAttachment> = attachments
        .iter()
        .filter(|va| va.node_name == node)
        .map(|va| NodeAttachment {
            name: va.name.clone(),
            uid: va.uid.clone(),
            driver: va.attacher.clone(),
            pv: va.pv_name.clone(),
            inline: va.inline_volume.clone(),
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// What the legacy recipe does with one of the node's VolumeAttachments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum AttachmentAction {
    /// Delete it, naming its uid: the driver's external-attacher then calls
    /// `ControllerUnpublishVolume` and lets the volume go.
    Delete {
        /// The VolumeAttachment.
        attachment: String,
        /// Its `metadata.uid`.
        uid: String,
        /// Its driver.
        driver: String,
        /// Its PersistentVolume.
        pv: Option<String>,
    },
    /// Leave it: a pod that stays on the node mounts its volume.
    Keep {
        /// The VolumeAttachment.
        attachment: String,
        /// Its driver.
        driver: String,
        /// Its PersistentVolume.
        pv: Option<String>,
        /// The pod, `namespace/name`.
        pod: String,
    },
}

impl AttachmentAction {
    /// The VolumeAttachment's name.
    pub fn attachment(&self) -> &str {
        match self {
            Self::Delete { attachment, .. } | Self::Keep { attachment, .. } => attachment,
        }
    }

    /// Its driver.
    pub fn driver(&self) -> &str {
        match self {
            Self::Delete { driver, .. } | Self::Keep { driver, .. } => driver,
        }
    }
}

/// What to do with each of the node's VolumeAttachments: delete it, unless
/// a pod that stays on the node mounts its volume (the same rule as for
/// the EBS detaches, so a volume is never freed under a pod left running).
pub fn plan_attachments(
    attachments: &[NodeAttachment],
    pods: &[PodRef],
    pvs: &[PvFacts],
) -> Vec<AttachmentAction> {
    attachments
        .iter()
        .map(|a| match kept_for(a, pods, pvs) {
            Some(pod) => AttachmentAction::Keep {
                attachment: a.name.clone(),
                driver: a.driver.clone(),
                pv: a.pv.clone(),
                pod,
            },
            None => AttachmentAction::Delete {
                attachment: a.name.clone(),
                uid: a.uid.clone(),
                driver: a.driver.clone(),
                pv: a.pv.clone(),
            },
        })
        .collect()
}

/// The staying pod that mounts the attachment's volume, through its
/// PersistentVolume or inline.
fn kept_for(a: &NodeAttachment, pods: &[PodRef], pvs: &[PvFacts]) -> Option<String> {
    match (a.pv.as_deref(), &a.inline) {
        (Some(pv), _) => staying_pod(pv, pods, pvs),
        (None, Some(volume)) => inline_of_staying_pod(volume, pods),
        (None, None) => None,
    }
}

/// How many attachments of each driver, by driver name: `driver n, ...`.
pub fn per_driver<'a>(drivers: impl IntoIterator<Item = &'a str>) -> String {
    let mut counts: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for d in drivers {
        *counts.entry(d).or_default() += 1;
    }
    counts
        .iter()
        .map(|(d, n)| format!("{d} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Cross-checks the node's volumes against the cloud: a volume is detached
/// only if the cloud says it is attached to this very machine, and never
/// the machine's root device or boot disk.
pub fn plan_detach(
    machine: &InstanceFacts,
    volumes: &[NodeVolume],
    described: &[VolumeFacts],
    kept: &[(VolumeId, String)],
) -> Vec<VolumeAction> {
    volumes
        .iter()
        .map(|nv| {
            if let Some((_, pod)) = kept.iter().find(|(v, _)| v == &nv.volume) {
                return VolumeAction::Keep {
                    volume: nv.volume.clone(),
                    pod: pod.clone(),
                };
            }
            if machine
                .root_volume
                .as_ref()
                .is_some_and(|root| *root == nv.volume.clone().on_machine(Some(&machine.id)))
            {
                return VolumeAction::Refuse {
                    volume: nv.volume.clone(),
                    reason: "it is the machine's boot disk".into(),
                };
            }
            let Some(facts) = described.iter().find(|f| f.id == nv.volume) else {
                return VolumeAction::Refuse {
                    volume: nv.volume.clone(),
                    reason: "EC2 does not know this volume".into(),
                };
            };
            let on_instance = facts
                .attachments
                .iter()
                .find(|a| a.instance == machine.id && a.state.holds());
            let root_device = machine.root_device_name.as_deref();
            match on_instance {
                None => VolumeAction::NotAttached {
                    volume: nv.volume.clone(),
                    state: facts.state,
                },
                Some(a) if a.device.is_some() && a.device.as_deref() == root_device => {
                    VolumeAction::Refuse {
                        volume: nv.volume.clone(),
                        reason: "it is the instance's root device".into(),
                    }
                }
                Some(a) => VolumeAction::Detach {
                    volume: nv.volume.clone(),
                    device: a.device.clone(),
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::VolumeAttachmentState;
    use crate::core::model::instance::{AttachmentState, EBS_CSI_DRIVER, InstanceState};

    #[test]
    fn an_attachment_is_named_as_kubernetes_names_it() {
        let volume = CsiVolume {
            driver: EBS_CSI_DRIVER.into(),
            handle: "vol-0123456789abcdef0".into(),
        };
        // sha256("vol-0123456789abcdef0" "ebs.csi.aws.com" "ip-10-0-1-17.ec2.internal"),
        // from Python's hashlib; the scenario tests check the formula against
        // the attachments kube-controller-manager creates.
        assert_eq!(
            attachment_name(&volume, "ip-10-0-1-17.ec2.internal"),
            "csi-3de7d3f99a85d9998222f87b8d14a25a9c6fe73c68f1c6090b29f9eefa05e2ef"
        );
    }

    #[test]
    fn the_attachments_to_read_follow_the_mode_and_need_the_nodes_record() {
        assert_eq!(attachment_names("n1", None, FenceMode::Taint), None);
        let ebs = CsiVolume {
            driver: EBS_CSI_DRIVER.into(),
            handle: "vol-0a".into(),
        };
        let other = CsiVolume {
            driver: "cstor.csi.openebs.io".into(),
            handle: "pvc-1".into(),
        };
        let attached = [other.clone(), ebs.clone()];
        assert_eq!(
            attachment_names("n1", Some(&attached), FenceMode::Taint),
            Some(vec![attachment_name(&ebs, "n1")])
        );
        assert_eq!(
            attachment_names("n1", Some(&attached), FenceMode::Legacy),
            Some(vec![
                attachment_name(&other, "n1"),
                attachment_name(&ebs, "n1")
            ])
        );
        // A Node that records no volume has none to read: nothing is listed.
        assert_eq!(
            attachment_names("n1", Some(&[]), FenceMode::Legacy),
            Some(vec![])
        );
    }

    fn vol(s: &str) -> VolumeId {
        VolumeId::parse(s).unwrap()
    }

    fn va(name: &str, node: &str, attacher: &str, pv: Option<&str>) -> AttachmentFacts {
        AttachmentFacts {
            name: name.into(),
            uid: format!("uid-{name}"),
            attacher: attacher.into(),
            node_name: node.into(),
            pv_name: pv.map(Into::into),
            inline_volume: None,
        }
    }

    fn pv(name: &str, volume: Option<&str>) -> PvFacts {
        PvFacts {
            name: name.into(),
            volume: volume.map(vol),
            claim: Some(("db".into(), format!("claim-{name}"))),
            csi: None,
            shared: false,
        }
    }

    #[test]
    fn only_this_nodes_ebs_attachments_count() {
        let vas = vec![
            va("va-1", "n2", EBS_CSI_DRIVER, Some("pv-a")),
            va("va-2", "n1", EBS_CSI_DRIVER, Some("pv-b")),
            va("va-3", "n2", "efs.csi.aws.com", Some("pv-c")),
            va("va-4", "n2", EBS_CSI_DRIVER, Some("pv-d")),
            va("va-5", "n2", EBS_CSI_DRIVER, Some("pv-missing")),
            va("va-6", "n2", EBS_CSI_DRIVER, Some("pv-nfs")),
            AttachmentFacts {
                inline_volume: Some(vol("vol-0000000e")),
                ..va("va-7", "n2", EBS_CSI_DRIVER, None)
            },
        ];
        let pvs = vec![
            pv("pv-a", Some("vol-0000000a")),
            pv("pv-b", Some("vol-0000000b")),
            pv("pv-c", Some("vol-0000000c")),
            pv("pv-d", Some("aws://us-east-1a/vol-0000000d")),
            pv("pv-nfs", None),
        ];
        let got: Vec<String> = volumes_of_node("n2", None, &vas, &pvs)
            .into_iter()
            .map(|v| v.volume.to_string())
            .collect();
        assert_eq!(got, ["vol-0000000a", "vol-0000000d", "vol-0000000e"]);
    }

    #[test]
    fn detach_only_what_is_attached_here_and_never_the_root() {
        let me = InstanceId::parse("i-0000000a").unwrap();
        let other = InstanceId::parse("i-0000000b").unwrap();
        let att = |i: &InstanceId, dev: &str, state: &str| VolumeAttachmentState {
            instance: i.clone(),
            device: Some(dev.into()),
            state: AttachmentState::from_name(state),
        };
        let nv = |v: &str| NodeVolume {
            volume: vol(v),
            pv: None,
            attachment: "va".into(),
            attachment_uid: "uid-va".into(),
        };
        let described = vec![
            VolumeFacts {
                id: vol("vol-00000001"),
                state: VolumeState::InUse,
                attachments: vec![att(&me, "/dev/xvdba", "attached")],
            },
            VolumeFacts {
                id: vol("vol-00000002"),
                state: VolumeState::InUse,
                attachments: vec![att(&me, "/dev/xvda", "attached")],
            },
            VolumeFacts {
                id: vol("vol-00000003"),
                state: VolumeState::InUse,
                attachments: vec![att(&other, "/dev/xvdbb", "attached")],
            },
            VolumeFacts {
                id: vol("vol-00000004"),
                state: VolumeState::Available,
                attachments: vec![],
            },
        ];
        let wanted = [
            "vol-00000001",
            "vol-00000002",
            "vol-00000003",
            "vol-00000004",
            "vol-00000005",
        ]
        .map(nv);
        let kept = [(vol("vol-00000001"), "db/store-0".to_owned())];
        for (kept, first) in [(&[][..], "detach"), (&kept[..], "keep")] {
            let machine = InstanceFacts::bare(me.clone(), InstanceState::Stopped);
            let plan = plan_detach(&machine, &wanted, &described, kept);
            let kinds: Vec<&str> = plan
                .iter()
                .map(|a| match a {
                    VolumeAction::Detach { .. } => "detach",
                    VolumeAction::NotAttached { .. } => "not_attached",
                    VolumeAction::Refuse { .. } => "refuse",
                    VolumeAction::Keep { .. } => "keep",
                })
                .collect();
            assert_eq!(
                kinds,
                [first, "refuse", "not_attached", "not_attached", "refuse"]
            );
        }
    }

    /// Compute Engine names no device on a disk's users: the boot disk is
    /// told by the volume the VM boots from, and refused before the taint,
    /// so the fencing never lists it among its volumes.
    #[test]
    fn a_boot_disk_is_refused_by_its_volume_where_no_device_is_named() {
        let vm = InstanceId::parse("gce://proj-fencer/us-central1-a/node-2").unwrap();
        let boot = vol("projects/proj-fencer/zones/us-central1-a/disks/node-2");
        let data = vol("projects/proj-fencer/zones/us-central1-a/disks/pv-1");
        let mut machine = InstanceFacts::bare(vm.clone(), InstanceState::Terminated);
        machine.root_device_name = Some("persistent-disk-0".into());
        machine.root_volume = VolumeId::from_pd_source(
            "https://compute.googleapis.com/compute/v1/projects/proj-fencer/zones/us-central1-a/disks/node-2",
        );
        let attached = |id: &VolumeId| VolumeFacts {
            id: id.clone(),
            state: VolumeState::InUse,
            attachments: vec![VolumeAttachmentState {
                instance: vm.clone(),
                device: None,
                state: AttachmentState::Attached,
            }],
        };
        let nv = |v: &VolumeId| NodeVolume {
            volume: v.clone(),
            pv: None,
            attachment: "va".into(),
            attachment_uid: "uid-va".into(),
        };
        let plan = plan_detach(
            &machine,
            &[nv(&boot), nv(&data)],
            &[attached(&boot), attached(&data)],
            &[],
        );
        assert!(
            matches!(&plan[0], VolumeAction::Refuse { volume, .. } if *volume == boot),
            "{plan:?}"
        );
        assert!(
            matches!(&plan[1], VolumeAction::Detach { volume, .. } if *volume == data),
            "{plan:?}"
        );
        // Without the boot volume known, the same disk would be detached.
        machine.root_volume = None;
        let plan = plan_detach(&machine, &[nv(&boot)], &[attached(&boot)], &[]);
        assert!(matches!(&plan[0], VolumeAction::Detach { .. }), "{plan:?}");
    }

    #[test]
    fn the_legacy_recipe_deletes_every_drivers_attachments_but_a_staying_pods() {
        let vas = vec![
            va("va-ebs", "n2", EBS_CSI_DRIVER, Some("pv-a")),
            va("va-cstor", "n2", "cstor.csi.openebs.io", Some("pv-c")),
            va(
                "va-iscsi-daemon",
                "n2",
                "iscsi.csi.example.com",
                Some("pv-d"),
            ),
            va("va-elsewhere", "n1", "cstor.csi.openebs.io", Some("pv-e")),
            va("va-inline", "n2", "cstor.csi.openebs.io", None),
        ];
        let pvs = [
            pv("pv-a", Some("vol-0000000a")),
            pv("pv-c", None),
            pv("pv-d", None),
        ];
        let on_node = attachments_of_node("n2", &vas);
        let names: Vec<&str> = on_node.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(
            names,
            ["va-cstor", "va-ebs", "va-inline", "va-iscsi-daemon"],
            "every driver's, this node's only, by name"
        );
        let daemon = PodRef {
            namespace: "db".into(),
            name: "target-daemon".into(),
            uid: "uid-d".into(),
            stays: true,
            leaves_now: false,
            claims: vec!["claim-pv-d".into()],
            inline: vec![],
            finished: false,
        };
        let leaving = PodRef {
            name: "db-0".into(),
            stays: false,
            leaves_now: true,
            claims: vec!["claim-pv-c".into()],
            inline: vec![],
            ..daemon.clone()
        };
        let plan = plan_attachments(&on_node, &[daemon, leaving], &pvs);
        let deleted: Vec<(&str, &str)> = plan
            .iter()
            .filter_map(|a| match a {
                AttachmentAction::Delete {
                    attachment, uid, ..
                } => Some((attachment.as_str(), uid.as_str())),
                AttachmentAction::Keep { .. } => None,
            })
            .collect();
        assert_eq!(
            deleted,
            [
                ("va-cstor", "uid-va-cstor"),
                ("va-ebs", "uid-va-ebs"),
                ("va-inline", "uid-va-inline")
            ]
        );
        assert!(matches!(
            &plan[3],
            AttachmentAction::Keep { attachment, pod, driver, .. }
                if attachment == "va-iscsi-daemon" && pod == "db/target-daemon"
                    && driver == "iscsi.csi.example.com"
        ));
        assert_eq!(
            per_driver(plan.iter().map(AttachmentAction::driver)),
            "cstor.csi.openebs.io 2, ebs.csi.aws.com 1, iscsi.csi.example.com 1"
        );
        assert_eq!(per_driver([]), "");
    }

    #[test]
    fn a_volume_stays_attached_only_for_a_pod_that_stays_and_mounts_its_claim() {
        let nv = |v: &str, pv: &str| NodeVolume {
            volume: vol(v),
            pv: Some(pv.into()),
            attachment: format!("va-{pv}"),
            attachment_uid: format!("uid-{pv}"),
        };
        let volumes = [
            nv("vol-00000001", "pv-a"),
            nv("vol-00000002", "pv-b"),
            nv("vol-00000003", "pv-c"),
        ];
        let pvs = [
            pv("pv-a", Some("vol-00000001")),
            pv("pv-b", Some("vol-00000002")),
            PvFacts {
                claim: Some(("other".into(), "claim-pv-c".into())),
                ..pv("pv-c", Some("vol-00000003"))
            },
        ];
        let pod = |name: &str, stays: bool, claims: &[&str]| PodRef {
            namespace: "db".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            stays,
            leaves_now: !stays,
            claims: claims.iter().map(|c| (*c).to_owned()).collect(),
            inline: vec![],
            finished: false,
        };
        let pods = [
            pod("storage-daemon", true, &["claim-pv-a"]),
            pod("app-0", false, &["claim-pv-b"]),
            // Same claim name, another namespace's PV: not this pod's.
            pod("daemon-2", true, &["claim-pv-c"]),
        ];
        assert_eq!(
            kept_by_pods(&volumes, &pods, &pvs),
            [(vol("vol-00000001"), "db/storage-daemon".to_owned())]
        );
    }
}

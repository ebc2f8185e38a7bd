//! Compute Engine's names and states, as the core reads them: the VM a
//! Node's provider id names (`gce://PROJECT/ZONE/NAME`), the status the
//! Compute API reports for it, and the Persistent Disk a PD CSI volume
//! handle names. Pure and strict: these strings end up in API paths and log
//! lines, so anything that is not exactly Google's form is refused.

use std::fmt;

use serde::Serialize;

/// A Compute Engine VM: project, zone and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct GceInstance {
    project: String,
    zone: String,
    name: String,
}

impl GceInstance {
    /// Validates the three parts.
    pub fn new(project: &str, zone: &str, name: &str) -> Option<Self> {
        (is_project(project) && is_zone(zone) && is_name(name)).then(|| Self {
            project: project.to_owned(),
            zone: zone.to_owned(),
            name: name.to_owned(),
        })
    }

    /// Parses a Node's provider id, `gce://PROJECT/ZONE/NAME`.
    pub fn from_provider_id(raw: &str) -> Option<Self> {
        let mut parts = raw.strip_prefix("gce://")?.split('/');
        let (project, zone, name) = (parts.next()?, parts.next()?, parts.next()?);
        parts.next().is_none().then_some(())?;
        Self::new(project, zone, name)
    }

    /// Parses an API resource name, `projects/P/zones/Z/instances/N`, as
    /// audit logs carry it (a full `https://…/compute/v1/` URL too).
    pub fn from_resource_name(raw: &str) -> Option<Self> {
        let path = raw
            .split_once("/compute/v1/")
            .map_or(raw, |(_, path)| path)
            .trim_start_matches('/');
        match path.split('/').collect::<Vec<_>>()[..] {
            ["projects", project, "zones", zone, "instances", name] => {
                Self::new(project, zone, name)
            }
            _ => None,
        }
    }

    /// The provider id a Node of this VM carries.
    pub fn provider_id(&self) -> String {
        format!("gce://{}/{}/{}", self.project, self.zone, self.name)
    }

    /// The project.
    pub fn project(&self) -> &str {
        &self.project
    }

    /// The zone.
    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// The VM's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for GceInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "projects/{}/zones/{}/instances/{}",
            self.project, self.zone, self.name
        )
    }
}

/// A VM's `status`, as the Compute API reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum GceStatus {
    /// Resources are being allocated.
    Provisioning,
    /// Booting.
    Staging,
    /// Running: its disks may be written to at any moment.
    Running,
    /// Stopping: the guest may still be flushing to its disks.
    Stopping,
    /// A stop is scheduled (a graceful shutdown is under way).
    PendingStop,
    /// Being taken off its host on the way to `TERMINATED`.
    Deprovisioning,
    /// Waiting for resources before provisioning.
    Pending,
    /// Stopped.
    Stopped,
    /// Being suspended: memory is being saved.
    Suspending,
    /// Suspended: resumes from the memory it saved, as if it had never
    /// stopped, with whatever it meant to write.
    Suspended,
    /// Being repaired by Compute Engine: may come back on its own.
    Repairing,
    /// Terminated: stopped, nothing runs.
    Terminated,
    /// A status this build does not know; never taken for off.
    Unknown,
}

impl GceStatus {
    /// Maps the API's status name; unknown names become [`GceStatus::Unknown`].
    pub fn from_name(name: &str) -> Self {
        match name {
            "PROVISIONING" => Self::Provisioning,
            "STAGING" => Self::Staging,
            "RUNNING" => Self::Running,
            "STOPPING" => Self::Stopping,
            "PENDING_STOP" => Self::PendingStop,
            "DEPROVISIONING" => Self::Deprovisioning,
            "PENDING" => Self::Pending,
            "STOPPED" => Self::Stopped,
            "SUSPENDING" => Self::Suspending,
            "SUSPENDED" => Self::Suspended,
            "REPAIRING" => Self::Repairing,
            "TERMINATED" => Self::Terminated,
            _ => Self::Unknown,
        }
    }

    /// True only for the statuses in which nothing runs that could write:
    /// `TERMINATED` and `STOPPED`. `SUSPENDED` resumes from RAM, `REPAIRING`
    /// may come back, and anything else may be running.
    pub fn is_off(self) -> bool {
        matches!(self, Self::Terminated | Self::Stopped)
    }
}

/// Where a Persistent Disk lives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "name")]
pub(crate) enum DiskLocation {
    /// A zonal disk.
    Zone(String),
    /// A regional disk, replicated across two zones.
    Region(String),
}

/// A Persistent Disk as a PD CSI volume handle names it:
/// `projects/P/zones/Z/disks/D` or `projects/P/regions/R/disks/D`. The
/// in-tree `gcePersistentDisk` volumes migrated to CSI name their project
/// `UNSPECIFIED`: the VM's project is meant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PdDisk {
    /// The project, `None` for `UNSPECIFIED`.
    pub project: Option<String>,
    /// Its zone or region.
    pub(crate) location: DiskLocation,
    /// The disk's name.
    pub name: String,
}

/// The PD CSI driver's name.
pub const PD_CSI_DRIVER: &str = "pd.csi.storage.gke.io";

impl PdDisk {
    /// Parses a PD CSI volume handle; `None` for anything else.
    pub(crate) fn from_handle(handle: &str) -> Option<Self> {
        let parts: Vec<&str> = handle.split('/').collect();
        let ["projects", project, kind, location, "disks", name] = parts[..] else {
            return None;
        };
        let project = match project {
            "UNSPECIFIED" => None,
            p if is_project(p) => Some(p.to_owned()),
            _ => return None,
        };
        let location = match kind {
            "zones" if is_zone(location) => DiskLocation::Zone(location.to_owned()),
            "regions" if is_region(location) => DiskLocation::Region(location.to_owned()),
            _ => return None,
        };
        is_name(name).then(|| Self {
            project,
            location,
            name: name.to_owned(),
        })
    }

    /// True when `source` (an attached disk's `source` URL, as the VM
    /// reports its disks) names this disk, the VM's project standing in
    /// for an `UNSPECIFIED` one.
    pub fn is_source(&self, source: &str, vm_project: &str) -> bool {
        let project = self.project.as_deref().unwrap_or(vm_project);
        let location = match &self.location {
            DiskLocation::Zone(z) => format!("zones/{z}"),
            DiskLocation::Region(r) => format!("regions/{r}"),
        };
        let path = source
            .split_once("/compute/v1/")
            .map_or(source, |(_, path)| path);
        path == format!("projects/{project}/{location}/disks/{}", self.name)
    }
}

/// A project id: 6 to 30 lowercase letters, digits and hyphens, starting
/// with a letter, optionally behind a domain (`example.com:my-project`).
fn is_project(s: &str) -> bool {
    let id = s.rsplit_once(':').map_or(s, |(domain, id)| {
        if domain.is_empty()
            || !domain
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        {
            ""
        } else {
            id
        }
    });
    (6..=30).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_lowercase())
        && !id.ends_with('-')
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A region: `europe-west1`, `us-central1`, `northamerica-northeast2`.
fn is_region(s: &str) -> bool {
    let Some((area, place)) = s.split_once('-') else {
        return false;
    };
    let digits = place.trim_start_matches(|c: char| c.is_ascii_lowercase());
    !area.is_empty()
        && area.bytes().all(|b| b.is_ascii_lowercase())
        && digits.len() < place.len()
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
}

/// A zone: a region and a letter, `europe-west1-b`.
fn is_zone(s: &str) -> bool {
    s.rsplit_once('-').is_some_and(|(region, letter)| {
        is_region(region) && letter.len() == 1 && letter.bytes().all(|b| b.is_ascii_lowercase())
    })
}

/// A resource name (RFC 1035): a lowercase letter, then up to 62 lowercase
/// letters, digits or hyphens, not ending with a hyphen.
fn is_name(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && !s.ends_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Why the look at a VM right before its disk's detach holds the detach
/// back: the VM runs again (Compute Engine restarts a VM after a host error
/// on its own, `automaticRestart`), or another VM now carries its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DetachHeld {
    /// The VM is not off.
    NotOff(GceStatus),
    /// Another VM than the one the fencing judged (its id differs).
    AnotherVm {
        /// The id the fencing judged.
        judged: u64,
        /// The id found now.
        found: Option<u64>,
    },
}

impl std::fmt::Display for DetachHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotOff(status) => write!(
                f,
                "the VM is {status:?} right before the detach, not off: nothing is detached"
            ),
            Self::AnotherVm { judged, found } => write!(
                f,
                "the VM of that name is another one (id {}, the fencing judged {judged}): nothing is detached",
                found.map_or_else(|| "unknown".to_owned(), |id| id.to_string())
            ),
        }
    }
}

/// Whether a disk of the VM may be detached now: only when the VM, read
/// right before, is off and is the very VM the fencing judged (`judged`:
/// its id then, when known).
pub fn may_detach(
    judged: Option<u64>,
    status: GceStatus,
    found: Option<u64>,
) -> Result<(), DetachHeld> {
    if let Some(judged) = judged
        && found != Some(judged)
    {
        return Err(DetachHeld::AnotherVm { judged, found });
    }
    if !matches!(status, GceStatus::Terminated | GceStatus::Stopped) {
        return Err(DetachHeld::NotOff(status));
    }
    Ok(())
}

/// What the look at a VM right before its stop allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopStep {
    /// The VM judged, still running: stop it.
    Stop,
    /// The VM judged is off already: nothing to stop, the wait for it to
    /// be off ends at once.
    AlreadyOff,
    /// Compute Engine says the VM no longer exists: nothing to stop, and
    /// nothing was powered off by node-fencer.
    Deleted,
}

/// Why the look at a VM right before its stop holds the stop back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopHeld {
    /// The VM's id was not known when the node was judged: no VM found now
    /// can be shown to be the one judged.
    NotJudged,
    /// Another VM than the one judged carries the name now (a managed
    /// instance group recreated it): a new machine, whose Node is judged
    /// afresh.
    AnotherVm {
        /// The id the judgement saw.
        judged: u64,
        /// The id found now.
        found: Option<u64>,
    },
    /// The VM is neither running nor off (starting, stopping, suspended,
    /// in repair): the judgement saw it running, so something else acts on
    /// it; a later sweep sees how it ends.
    NotRunning(GceStatus),
}

impl std::fmt::Display for StopHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotJudged => {
                f.write_str("the VM's id was not known when the node was judged: it is not stopped")
            }
            Self::AnotherVm { judged, found } => write!(
                f,
                "the VM of that name is another one (id {}, the node was judged on {judged}): it is not stopped",
                found.map_or_else(|| "unknown".to_owned(), |id| id.to_string())
            ),
            Self::NotRunning(status) => write!(
                f,
                "the VM is {status:?} right before the stop, no longer RUNNING: it is not stopped"
            ),
        }
    }
}

/// Whether the VM read right before its stop may be stopped: only the very
/// VM the node was judged on (`judged`, its id then), and only while it
/// runs. `found` is `None` with `status` ignored when Compute Engine says
/// the VM no longer exists.
pub fn may_stop(
    judged: Option<u64>,
    found: Option<(Option<u64>, GceStatus)>,
) -> Result<StopStep, StopHeld> {
    let Some(judged) = judged else {
        return Err(StopHeld::NotJudged);
    };
    let Some((id, status)) = found else {
        return Ok(StopStep::Deleted);
    };
    if id != Some(judged) {
        return Err(StopHeld::AnotherVm { judged, found: id });
    }
    match status {
        GceStatus::Running => Ok(StopStep::Stop),
        s if s.is_off() => Ok(StopStep::AlreadyOff),
        s => Err(StopHeld::NotRunning(s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_id_names_a_vm_exactly() {
        let vm = GceInstance::from_provider_id("gce://my-project-1/europe-west1-b/gke-pool-1-abcd")
            .expect("a GKE node's provider id");
        assert_eq!(vm.project(), "my-project-1");
        assert_eq!(vm.zone(), "europe-west1-b");
        assert_eq!(vm.name(), "gke-pool-1-abcd");
        assert_eq!(
            vm.provider_id(),
            "gce://my-project-1/europe-west1-b/gke-pool-1-abcd"
        );
        assert_eq!(
            vm.to_string(),
            "projects/my-project-1/zones/europe-west1-b/instances/gke-pool-1-abcd"
        );
        assert!(
            GceInstance::from_provider_id("gce://example.com:proj-42/us-central1-a/n1").is_some()
        );
        for bad in [
            "aws:///us-east-1a/i-0123456789abcdef0",
            "gce://my-project-1/europe-west1-b",
            "gce://my-project-1/europe-west1-b/vm/extra",
            "gce://My-Project/europe-west1-b/vm",
            "gce://short/europe-west1-b/vm",
            "gce://my-project-1/europe-west1/vm",
            "gce://my-project-1/europe-west1-b/Vm",
            "gce://my-project-1/europe-west1-b/vm-",
            "gce://my-project-1/europe-west1-b/../vm",
            "gce://my-project-1/europe-west1-b/",
            "gce://:proj-42/us-central1-a/n1",
        ] {
            assert_eq!(GceInstance::from_provider_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_audit_logs_resource_name_names_the_same_vm() {
        let by_name = GceInstance::from_resource_name(
            "projects/my-project-1/zones/us-east1-c/instances/vm-1",
        );
        let by_url = GceInstance::from_resource_name(
            "https://www.googleapis.com/compute/v1/projects/my-project-1/zones/us-east1-c/instances/vm-1",
        );
        assert!(by_name.is_some());
        assert_eq!(by_name, by_url);
        assert_eq!(
            by_name,
            GceInstance::from_provider_id("gce://my-project-1/us-east1-c/vm-1")
        );
        for bad in [
            "projects/my-project-1/zones/us-east1-c/disks/vm-1",
            "projects/my-project-1/regions/us-east1/instances/vm-1",
            "projects/my-project-1/zones/us-east1-c/instances/vm-1/extra",
            "",
        ] {
            assert_eq!(GceInstance::from_resource_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_terminated_and_stopped_are_off() {
        let all = [
            "PROVISIONING",
            "STAGING",
            "RUNNING",
            "STOPPING",
            "STOPPED",
            "SUSPENDING",
            "SUSPENDED",
            "REPAIRING",
            "TERMINATED",
            "SOMETHING_NEW",
            "terminated",
        ];
        let off: Vec<&str> = all
            .into_iter()
            .filter(|s| GceStatus::from_name(s).is_off())
            .collect();
        assert_eq!(off, ["STOPPED", "TERMINATED"]);
        assert_eq!(GceStatus::from_name("SOMETHING_NEW"), GceStatus::Unknown);
    }

    #[test]
    fn a_pd_handle_names_a_zonal_regional_or_migrated_disk() {
        let zonal = PdDisk::from_handle("projects/my-project-1/zones/us-east1-c/disks/pvc-1234")
            .expect("zonal");
        assert_eq!(zonal.location, DiskLocation::Zone("us-east1-c".into()));
        assert!(zonal.is_source(
            "https://www.googleapis.com/compute/v1/projects/my-project-1/zones/us-east1-c/disks/pvc-1234",
            "other-project"
        ));
        assert!(!zonal.is_source(
            "https://www.googleapis.com/compute/v1/projects/my-project-1/zones/us-east1-b/disks/pvc-1234",
            "my-project-1"
        ));
        let regional = PdDisk::from_handle("projects/my-project-1/regions/us-east1/disks/pvc-9")
            .expect("regional");
        assert_eq!(regional.location, DiskLocation::Region("us-east1".into()));
        assert!(regional.is_source(
            "projects/my-project-1/regions/us-east1/disks/pvc-9",
            "my-project-1"
        ));
        let migrated = PdDisk::from_handle("projects/UNSPECIFIED/zones/us-east1-c/disks/old-disk")
            .expect("in-tree");
        assert_eq!(migrated.project, None);
        assert!(migrated.is_source(
            "https://www.googleapis.com/compute/v1/projects/vm-project/zones/us-east1-c/disks/old-disk",
            "vm-project"
        ));
        for bad in [
            "vol-0123456789abcdef0",
            "projects/my-project-1/zones/us-east1-c/disks/",
            "projects/my-project-1/zones/us-east1/disks/d",
            "projects/my-project-1/regions/us-east1-c/disks/d",
            "projects/my-project-1/zones/us-east1-c/snapshots/d",
            "projects/my-project-1/zones/us-east1-c/disks/d/x",
        ] {
            assert_eq!(PdDisk::from_handle(bad), None, "{bad}");
        }
    }

    /// Issue 33, item 4: the VM read right before the detach must be off
    /// and the one judged (a host error restarts a VM on its own).
    #[test]
    fn a_disk_is_detached_only_from_the_judged_vm_while_it_is_off() {
        assert_eq!(may_detach(Some(7), GceStatus::Terminated, Some(7)), Ok(()));
        assert_eq!(may_detach(None, GceStatus::Stopped, Some(9)), Ok(()));
        for status in [
            GceStatus::Running,
            GceStatus::Staging,
            GceStatus::Stopping,
            GceStatus::Suspended,
            GceStatus::Repairing,
            GceStatus::Unknown,
        ] {
            assert_eq!(
                may_detach(Some(7), status, Some(7)),
                Err(DetachHeld::NotOff(status))
            );
        }
        assert!(matches!(
            may_detach(Some(7), GceStatus::Terminated, Some(8)),
            Err(DetachHeld::AnotherVm {
                judged: 7,
                found: Some(8)
            })
        ));
        assert!(may_detach(Some(7), GceStatus::Terminated, None).is_err());
    }

    #[test]
    fn only_the_vm_judged_and_running_is_stopped() {
        let running = Some((Some(7), GceStatus::Running));
        assert_eq!(may_stop(Some(7), running), Ok(StopStep::Stop));
        // Recreated under the same name by its group: another machine.
        assert_eq!(
            may_stop(Some(7), Some((Some(8), GceStatus::Running))),
            Err(StopHeld::AnotherVm {
                judged: 7,
                found: Some(8)
            })
        );
        assert_eq!(
            may_stop(Some(7), Some((None, GceStatus::Running))),
            Err(StopHeld::AnotherVm {
                judged: 7,
                found: None
            })
        );
        // Nothing ties a VM found now to a judgement that saw no id.
        assert_eq!(may_stop(None, running), Err(StopHeld::NotJudged));
        for off in [GceStatus::Terminated, GceStatus::Stopped] {
            assert_eq!(
                may_stop(Some(7), Some((Some(7), off))),
                Ok(StopStep::AlreadyOff)
            );
        }
        assert_eq!(may_stop(Some(7), None), Ok(StopStep::Deleted));
        for status in [
            GceStatus::Provisioning,
            GceStatus::Staging,
            GceStatus::Stopping,
            GceStatus::PendingStop,
            GceStatus::Deprovisioning,
            GceStatus::Pending,
            GceStatus::Suspending,
            GceStatus::Suspended,
            GceStatus::Repairing,
            GceStatus::Unknown,
        ] {
            assert_eq!(
                may_stop(Some(7), Some((Some(7), status))),
                Err(StopHeld::NotRunning(status)),
                "{status:?}"
            );
        }
    }
}

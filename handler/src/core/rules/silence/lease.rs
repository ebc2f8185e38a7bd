//! A kubelet's Lease as the proof of its silence reads it: the renewal the
//! kubelet stamped (its own clock), the version any write changes, and the
//! apiserver's own time of the last write and of the read (a clock the
//! kubelet does not set).

use k8s_openapi::api::coordination::v1::Lease;
use serde::Serialize;

/// The kubelet's default `leaseDurationSeconds`: a Lease without one is
/// renewed on the default cadence.
pub const DEFAULT_LEASE_SECONDS: i64 = 40;

/// What the cluster holds of a Node's kubelet Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "lease", content = "renewed_at")]
pub enum KubeletLease {
    /// No Lease of the Node's name in `kube-node-lease` (a kubelet older
    /// than node Leases, or a cluster without them).
    Missing,
    /// A Lease without `spec.renewTime`.
    NeverRenewed,
    /// A Lease of another Node object of the same name (its owner
    /// reference names another uid: a Node deleted and registered again):
    /// its renewals say nothing of this Node's kubelet.
    OtherHolder,
    /// Last renewed at this Unix second by the kubelet's own clock
    /// (rounded up: never earlier than the renewal).
    RenewedAt(i64),
}

/// One read of a Node's kubelet Lease, with the times a trusted clock puts
/// on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeaseRead {
    /// What the Lease holds, by the kubelet's clock.
    pub lease: KubeletLease,
    /// The Lease's `resourceVersion`: every renewal changes it, so the same
    /// version read twice means no renewal came between the two reads.
    pub version: Option<String>,
    /// The apiserver's time of the Lease's last write (Unix seconds, the
    /// latest `managedFields` time, rounded up): the apiserver stamps it
    /// with its own clock whenever a writer changes a field, as each
    /// renewal changes `renewTime`. None on clusters that keep no managed
    /// fields (before 1.18).
    pub written_at: Option<i64>,
    /// The apiserver's time when it answered this read (its `Date` header,
    /// Unix seconds).
    pub server_now: Option<i64>,
    /// How often the kubelet renews this Lease: a quarter of its
    /// `leaseDurationSeconds` (the kubelet's fixed renewal fraction), at
    /// least a second.
    pub renew_every_secs: i64,
}

impl LeaseRead {
    /// No Lease at all.
    pub fn missing() -> Self {
        Self {
            lease: KubeletLease::Missing,
            version: None,
            written_at: None,
            server_now: None,
            renew_every_secs: renew_every(None),
        }
    }
}

/// How often a kubelet renews a Lease of `duration` seconds: every quarter
/// of it (`nodeLeaseRenewIntervalFraction`), at least every second.
pub fn renew_every(duration: Option<i32>) -> i64 {
    let duration = duration.map_or(DEFAULT_LEASE_SECONDS, i64::from);
    (duration / 4).max(1)
}

/// The kubelet's Lease of the Node whose uid is `node_uid`, as read with
/// the apiserver's `Date` of `server_now`: its `renewTime` rounded up to
/// the second, so a renewal is never taken for earlier than it was; only
/// while the Lease is that Node's. The kubelet makes its Node the Lease's
/// owner: an owner reference to another Node uid is a Lease of an earlier
/// Node of the same name. (The `holderIdentity` cannot tell: the kubelet
/// writes the Node's name there, simulators such as kwok their own.)
pub fn read(lease: Option<&Lease>, node_uid: Option<&str>, server_now: Option<i64>) -> LeaseRead {
    let Some(lease) = lease else {
        return LeaseRead {
            server_now,
            ..LeaseRead::missing()
        };
    };
    let spec = lease.spec.as_ref();
    LeaseRead {
        lease: kubelet_lease(lease, node_uid),
        version: lease.metadata.resource_version.clone(),
        written_at: last_write(lease),
        server_now,
        renew_every_secs: renew_every(spec.and_then(|s| s.lease_duration_seconds)),
    }
}

fn kubelet_lease(lease: &Lease, node_uid: Option<&str>) -> KubeletLease {
    let another_node = lease
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.kind == "Node")
        .any(|o| node_uid.is_some_and(|uid| o.uid != uid));
    if another_node {
        return KubeletLease::OtherHolder;
    }
    match lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()) {
        None => KubeletLease::NeverRenewed,
        Some(t) => {
            let up = i64::from(t.0.subsec_nanosecond() > 0);
            KubeletLease::RenewedAt(t.0.as_second().saturating_add(up))
        }
    }
}

/// The apiserver's time of the Lease's last renewal: the latest time of the
/// managed fields' entries that own `spec.renewTime` (a writer that changes
/// a field takes it, and the apiserver stamps its entry then; a renewal
/// always changes `renewTime`, another writer's edit of other fields does
/// not), a second later, since the apiserver writes the times truncated to
/// the second and the write may have come any time in it. None where no
/// entry owns it (managed fields off): node-fencer's own clock decides.
fn last_write(lease: &Lease) -> Option<i64> {
    lease
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:renewTime").is_some())
        })
        .filter_map(|m| m.time.as_ref())
        .map(|t| t.0.as_second().saturating_add(1))
        .max()
}

/// The apiserver's `Date` header (RFC 7231's IMF-fixdate, as Go's HTTP
/// server writes it) in Unix seconds; None for anything else.
pub fn http_date(header: &str) -> Option<i64> {
    k8s_openapi::jiff::fmt::rfc2822::DateTimeParser::new()
        .parse_timestamp(header)
        .ok()
        .map(|t| t.as_second())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::values;

    fn lease(owner: &str, renew: Option<&str>, managed: &[&str], duration: Option<i32>) -> Lease {
        let managed: Vec<serde_json::Value> = managed
            .iter()
            .map(|t| {
                serde_json::json!({"manager": "kubelet", "operation": "Update",
                    "apiVersion": "coordination.k8s.io/v1", "time": t,
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:renewTime": {}}}})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "worker-2", "namespace": "kube-node-lease",
                "resourceVersion": "77", "managedFields": managed,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "worker-2", "uid": owner}]},
            "spec": {"holderIdentity": "worker-2", "renewTime": renew,
                "leaseDurationSeconds": duration},
        }))
        .unwrap()
    }

    #[test]
    fn a_renewal_is_rounded_up_to_the_second() {
        let of = |renew| read(Some(&lease("uid-2", renew, &[], None)), Some("uid-2"), None).lease;
        let at = values::unix_seconds("2026-11-26T12:00:00Z").unwrap();
        assert_eq!(read(None, Some("uid-2"), None).lease, KubeletLease::Missing);
        assert_eq!(of(None), KubeletLease::NeverRenewed);
        assert_eq!(
            of(Some("2026-11-26T12:00:00.000000Z")),
            KubeletLease::RenewedAt(at)
        );
        assert_eq!(
            of(Some("2026-11-26T12:00:00.000001Z")),
            KubeletLease::RenewedAt(at + 1)
        );
    }

    /// Issue 45, item 5: the Lease of an earlier Node of the same name
    /// proves nothing of this Node's kubelet, however old its renewal.
    #[test]
    fn a_lease_of_another_node_uid_is_another_holders() {
        let at = values::unix_seconds("2026-11-26T12:00:00Z").unwrap();
        let earlier = lease("uid-1", Some("2026-11-26T12:00:00Z"), &[], None);
        assert_eq!(
            read(Some(&earlier), Some("uid-2"), None).lease,
            KubeletLease::OtherHolder
        );
        // A Node whose uid was not read holds no Lease to another.
        assert_eq!(
            read(Some(&earlier), None, None).lease,
            KubeletLease::RenewedAt(at)
        );
    }

    /// Issue 58: the apiserver's clock times the last write, whatever the
    /// kubelet's clock wrote into `renewTime`.
    #[test]
    fn the_last_write_is_the_latest_managed_field_time_rounded_up() {
        let at = values::unix_seconds("2026-11-26T12:00:00Z").unwrap();
        let skewed = lease(
            "uid-2",
            Some("2026-11-26T11:59:20Z"),
            &["2026-11-26T11:00:00Z", "2026-11-26T12:00:00Z"],
            Some(40),
        );
        let r = read(Some(&skewed), Some("uid-2"), Some(at + 3));
        assert_eq!(r.lease, KubeletLease::RenewedAt(at - 40));
        assert_eq!(r.written_at, Some(at + 1));
        assert_eq!(r.server_now, Some(at + 3));
        assert_eq!(r.version.as_deref(), Some("77"));
        assert_eq!(r.renew_every_secs, 10);
        // Another writer's edit of other fields (a test taking the Lease
        // from kwok, an operator's annotation) is no renewal.
        let mut edited = skewed.clone();
        let other: k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry =
            serde_json::from_value(
                serde_json::json!({"manager": "kubectl", "operation": "Update",
                "time": "2026-11-26T12:05:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:holderIdentity": {}}}}),
            )
            .unwrap();
        edited
            .metadata
            .managed_fields
            .get_or_insert_default()
            .push(other);
        assert_eq!(
            read(Some(&edited), Some("uid-2"), None).written_at,
            Some(at + 1)
        );
        // No managed fields (a cluster before 1.18): no apiserver time.
        let old = lease("uid-2", Some("2026-11-26T12:00:00Z"), &[], Some(8));
        let r = read(Some(&old), Some("uid-2"), Some(at));
        assert_eq!(r.written_at, None);
        assert_eq!(r.renew_every_secs, 2);
    }

    #[test]
    fn the_renewal_cadence_is_a_quarter_of_the_duration() {
        assert_eq!(renew_every(None), 10);
        assert_eq!(renew_every(Some(40)), 10);
        assert_eq!(renew_every(Some(8)), 2);
        assert_eq!(renew_every(Some(1)), 1);
        assert_eq!(renew_every(Some(0)), 1);
        assert_eq!(renew_every(Some(-5)), 1);
        assert_eq!(renew_every(Some(i32::MAX)), i64::from(i32::MAX) / 4);
    }

    #[test]
    fn the_apiservers_date_is_read_as_go_writes_it() {
        assert_eq!(
            http_date("Tue, 01 Dec 2026 22:29:56 GMT"),
            values::unix_seconds("2026-12-01T22:29:56Z")
        );
        for odd in ["", "yesterday", "2026-12-01T22:29:56Z", "Tue, 99 Dec 2026"] {
            assert_eq!(http_date(odd), None, "{odd:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_date_header_is_read_without_panic(text in "\\PC{0,64}") {
            let _ = http_date(&text);
        }
    }
}

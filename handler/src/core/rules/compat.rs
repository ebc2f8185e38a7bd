//! What each Kubernetes version serves of the calls node-fencer makes: the
//! oldest version it supports, and the calls that differ below a version.
//! Read from the server's `/version`, asked once per execution environment.

use super::mode::ServerVersion;

/// The oldest Kubernetes node-fencer supports: every call it makes is
/// served there (the Lease API `coordination.k8s.io/v1` since 1.14, the
/// node Leases on by default since 1.14, `storage.k8s.io/v1`
/// VolumeAttachments since 1.13), and its tests run against it.
pub const OLDEST_SUPPORTED: ServerVersion = ServerVersion {
    major: 1,
    minor: 15,
};

/// A server older than [`OLDEST_SUPPORTED`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "Kubernetes {found} is older than {oldest}, the oldest node-fencer supports: nothing was done"
)]
pub struct Unsupported {
    /// The server's version.
    pub found: ServerVersion,
    /// The oldest supported.
    pub oldest: ServerVersion,
}

/// Refuses a server older than [`OLDEST_SUPPORTED`].
pub fn supported(version: ServerVersion) -> Result<(), Unsupported> {
    if version < OLDEST_SUPPORTED {
        return Err(Unsupported {
            found: version,
            oldest: OLDEST_SUPPORTED,
        });
    }
    Ok(())
}

/// The API group version an Event is written through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventsApi {
    /// `events.k8s.io/v1`, served from 1.19.
    V1,
    /// `events.k8s.io/v1beta1`, served from 1.8 to 1.24: the same fields.
    V1beta1,
}

impl EventsApi {
    /// The `apiVersion` of the Event.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::V1 => "events.k8s.io/v1",
            Self::V1beta1 => "events.k8s.io/v1beta1",
        }
    }
}

/// Where a Node's Event goes on `version`: `events.k8s.io/v1` where it is
/// served, else v1beta1; in `default`, where `kubectl describe node` and
/// the kubelet's Events are, from 1.23, and in `kube-system` before, where
/// the validation of an Event with an `eventTime` about a cluster-scoped
/// object requires it (accepted in `default` since Kubernetes 1.23, and in
/// only some patch releases of 1.20 to 1.22).
pub fn node_events(version: ServerVersion) -> (EventsApi, &'static str) {
    let at_least = |minor| version.major > 1 || version.minor >= minor;
    let api = if at_least(19) {
        EventsApi::V1
    } else {
        EventsApi::V1beta1
    };
    let namespace = if at_least(23) {
        "default"
    } else {
        "kube-system"
    };
    (api, namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(minor: u32) -> ServerVersion {
        ServerVersion { major: 1, minor }
    }

    #[test]
    fn servers_older_than_the_oldest_supported_are_refused_by_name() {
        assert_eq!(supported(v(15)), Ok(()));
        assert_eq!(supported(v(36)), Ok(()));
        assert_eq!(supported(ServerVersion { major: 2, minor: 0 }), Ok(()));
        let refused = supported(v(14)).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "Kubernetes 1.14 is older than 1.15, the oldest node-fencer supports: nothing was done"
        );
    }

    #[test]
    fn node_events_follow_what_each_version_serves() {
        assert_eq!(node_events(v(15)), (EventsApi::V1beta1, "kube-system"));
        assert_eq!(node_events(v(18)), (EventsApi::V1beta1, "kube-system"));
        assert_eq!(node_events(v(19)), (EventsApi::V1, "kube-system"));
        assert_eq!(node_events(v(22)), (EventsApi::V1, "kube-system"));
        assert_eq!(node_events(v(23)), (EventsApi::V1, "default"));
        assert_eq!(node_events(v(36)), (EventsApi::V1, "default"));
        assert_eq!(
            node_events(ServerVersion { major: 2, minor: 0 }),
            (EventsApi::V1, "default")
        );
    }
}

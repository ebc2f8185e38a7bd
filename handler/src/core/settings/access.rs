//! How node-fencer reaches the Kubernetes API: the ambient configuration,
//! EKS, a kubeconfig kept in SSM or Secrets Manager, or GKE; at most one
//! source, with the endpoint and CA that go with it.

use crate::core::settings::variables::{ConfigError, exclusive};

/// How node-fencer reaches the Kubernetes API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterAccess {
    /// `KUBECONFIG`, `~/.kube/config`, or in-cluster service account.
    Ambient,
    /// EKS with an IAM-derived bearer token.
    Eks {
        /// The cluster name (also signed into the token).
        name: String,
        /// Endpoint and CA, when given; otherwise `eks:DescribeCluster`.
        endpoint: Option<(String, String)>,
    },
    /// A kubeconfig kept in an SSM SecureString parameter.
    KubeconfigParameter(String),
    /// A kubeconfig kept in a Secrets Manager secret.
    KubeconfigSecret(String),
    /// GKE with a Google access token.
    Gke {
        /// `projects/P/locations/L/clusters/C`.
        cluster: String,
        /// The API server URL.
        endpoint: String,
        /// Its base64 PEM CA.
        ca: String,
    },
}

/// The one source of cluster access set, with the endpoint and CA it needs.
pub(super) fn cluster_access(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<ClusterAccess, ConfigError> {
    let sources = [
        ("CLUSTER_NAME", get("CLUSTER_NAME")),
        ("KUBECONFIG_SSM_PARAMETER", get("KUBECONFIG_SSM_PARAMETER")),
        ("KUBECONFIG_SECRET_ID", get("KUBECONFIG_SECRET_ID")),
        ("GKE_CLUSTER", get("GKE_CLUSTER")),
    ];
    let endpoint = get("CLUSTER_ENDPOINT");
    let ca = get("CLUSTER_CA_DATA");
    let access = match exclusive(&sources)? {
        None => ClusterAccess::Ambient,
        Some(("GKE_CLUSTER", cluster)) => gke(cluster, endpoint.clone(), ca.clone())?,
        Some(("CLUSTER_NAME", name)) => eks(name, endpoint.clone(), ca.clone())?,
        Some(("KUBECONFIG_SSM_PARAMETER", p)) => ClusterAccess::KubeconfigParameter(p),
        Some((_, s)) => ClusterAccess::KubeconfigSecret(s),
    };
    if !matches!(
        access,
        ClusterAccess::Eks { .. } | ClusterAccess::Gke { .. }
    ) && (endpoint.is_some() || ca.is_some())
    {
        return Err(ConfigError::Requires {
            var: if endpoint.is_some() {
                "CLUSTER_ENDPOINT"
            } else {
                "CLUSTER_CA_DATA"
            },
            needs: "CLUSTER_NAME or GKE_CLUSTER",
        });
    }
    Ok(access)
}

/// `GKE_CLUSTER`, which needs the endpoint and its CA.
fn gke(
    cluster: String,
    endpoint: Option<String>,
    ca: Option<String>,
) -> Result<ClusterAccess, ConfigError> {
    if !is_gke_cluster(&cluster) {
        return Err(ConfigError::Invalid {
            var: "GKE_CLUSTER",
            value: cluster,
            expected: "projects/PROJECT/locations/LOCATION/clusters/NAME",
        });
    }
    let endpoint = endpoint.ok_or(ConfigError::Requires {
        var: "GKE_CLUSTER",
        needs: "CLUSTER_ENDPOINT",
    })?;
    if !endpoint.starts_with("https://") {
        return Err(ConfigError::Invalid {
            var: "CLUSTER_ENDPOINT",
            value: endpoint,
            expected: "an https:// URL",
        });
    }
    let ca = ca.ok_or(ConfigError::Requires {
        var: "GKE_CLUSTER",
        needs: "CLUSTER_CA_DATA",
    })?;
    Ok(ClusterAccess::Gke {
        cluster,
        endpoint,
        ca,
    })
}

/// `CLUSTER_NAME` (EKS), with the endpoint and its CA together or neither
/// (then `eks:DescribeCluster` finds them).
fn eks(
    name: String,
    endpoint: Option<String>,
    ca: Option<String>,
) -> Result<ClusterAccess, ConfigError> {
    if !crate::core::model::names::is_dns_subdomain(&name.to_ascii_lowercase()) || name.len() > 100
    {
        return Err(ConfigError::Invalid {
            var: "CLUSTER_NAME",
            value: name,
            expected: "an EKS cluster name (letters, digits, hyphens, up to 100)",
        });
    }
    let endpoint = match (endpoint, ca) {
        (Some(e), Some(c)) => {
            if !e.starts_with("https://") {
                return Err(ConfigError::Invalid {
                    var: "CLUSTER_ENDPOINT",
                    value: e,
                    expected: "an https:// URL",
                });
            }
            Some((e, c))
        }
        (None, None) => None,
        (Some(_), None) => {
            return Err(ConfigError::Requires {
                var: "CLUSTER_ENDPOINT",
                needs: "CLUSTER_CA_DATA",
            });
        }
        (None, Some(_)) => {
            return Err(ConfigError::Requires {
                var: "CLUSTER_CA_DATA",
                needs: "CLUSTER_ENDPOINT",
            });
        }
    };
    Ok(ClusterAccess::Eks { name, endpoint })
}

/// `projects/P/locations/L/clusters/C`, each part a plain name.
fn is_gke_cluster(s: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p.len() <= 100
            && p.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b':' || b == b'.'
            })
    };
    matches!(
        s.split('/').collect::<Vec<_>>()[..],
        ["projects", p, "locations", l, "clusters", c] if part(p) && part(l) && part(c)
    )
}

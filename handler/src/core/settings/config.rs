//! Configuration from environment variables, validated once at cold start.
//! Every error names the variable and what it accepts.

use std::time::Duration;

use crate::core::inbound::oidc::{Expected, ExpectedError};
use crate::core::inbound::trigger::RouteGroup;
use crate::core::model::selector::LabelSelector;
use crate::core::rules::mode::ModeSetting;
use crate::core::rules::ownership::{self, ClusterIdentity};
use crate::core::rules::power::{ActiveFencing, Scope};
use crate::core::rules::reach::Reach;
use crate::core::rules::recovery::RecoveryPolicy;
use crate::core::rules::resolve::ClusterScope;
use crate::core::settings::access::{ClusterAccess, cluster_access};
use crate::core::settings::notify::{self, Notify};
use crate::core::settings::policy::Policy;
use crate::core::settings::redfish::{self, RedfishFiles};
use crate::core::settings::variables::{ConfigError, exclusive, flag, flag_or, int};

/// What `serve` accepts from Pub/Sub push and Eventarc: OIDC tokens for
/// one of these audiences, issued for this service account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushAuth {
    /// The `aud` claims accepted and the `email` claim required.
    pub expected: Expected,
    /// Where the signing keys are read, when not Google's own.
    pub(crate) certs_url: Option<String>,
}

/// Which of `serve`'s routes this service answers (`SERVE_ROUTES`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeRoutes(Vec<RouteGroup>);

impl Default for ServeRoutes {
    fn default() -> Self {
        Self(RouteGroup::ALL.iter().map(|(_, g)| *g).collect())
    }
}

impl ServeRoutes {
    /// Whether routes of `group` are answered.
    pub fn serves(&self, group: RouteGroup) -> bool {
        self.0.contains(&group)
    }

    /// The groups answered, as `SERVE_ROUTES` names them.
    pub fn names(&self) -> Vec<&'static str> {
        RouteGroup::ALL
            .iter()
            .filter(|(_, g)| self.serves(*g))
            .map(|(name, _)| *name)
            .collect()
    }
}

/// Where the Alertmanager bearer token comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// Given inline (local use).
    Inline(String),
    /// An SSM SecureString parameter name.
    Parameter(String),
    /// A Secrets Manager secret id.
    Secret(String),
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Inline(_) => f.write_str("Inline(<redacted>)"),
            Self::Parameter(p) => write!(f, "Parameter({p})"),
            Self::Secret(s) => write!(f, "Secret({s})"),
        }
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line (CloudWatch).
    Json,
    /// Human-readable.
    Text,
}

/// The validated configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// What the pipeline acts on: dry run, the cap, the mode, the waits.
    pub policy: Policy,
    /// Cluster access.
    pub cluster: ClusterAccess,
    /// The webhook token's source; `None` refuses every Function URL request.
    pub webhook_token: Option<TokenSource>,
    /// Log format, if set.
    pub(crate) log_format: Option<LogFormat>,
    /// What `serve` accepts from Pub/Sub and Eventarc; `None` refuses all.
    pub push_auth: Option<PushAuth>,
    /// Another Compute Engine API base URL than Google's.
    pub(crate) compute_endpoint: Option<String>,
    /// The routes `serve` answers.
    pub serve_routes: ServeRoutes,
    /// Where each fencing, refusal, power-off and recovery is told.
    pub notify: Option<Notify>,
    /// The BMC inventory and credentials of on-premises machines.
    pub redfish: Option<RedfishFiles>,
    /// How often `serve` runs the sweep itself; `None`: never (a scheduler
    /// calls `/sweep`).
    pub sweep_interval: Option<Duration>,
    /// How long `serve`'s caller waits for each request's answer (Cloud
    /// Run's request timeout); `None`: no bound but the stages' own.
    pub request_timeout: Option<Duration>,
    /// The port `serve` answers Prometheus' `/metrics` on; `None`: none.
    pub metrics_port: Option<u16>,
}

impl Config {
    /// Settings that are valid but weaken a protection: logged at start and
    /// shown by preflight, each naming the variable.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.policy.recovery_settle.is_zero() {
            out.push(
                "RECOVERY_SETTLE_SECONDS=0: a fencing ends the moment the node reads Ready, \
                 while the controllers may still act on the Node they cached as NotReady"
                    .to_owned(),
            );
        }
        if self
            .policy
            .active_fencing
            .is_some_and(|a| a.partition_percent == 100)
        {
            out.push(
                "PARTITION_PERCENT=100: the partition guard never refuses by share, only when a \
                 whole zone is NotReady; a control plane cut off from most nodes may power them off"
                    .to_owned(),
            );
        }
        if self.policy.fence_hibernated {
            out.push(
                "FENCE_HIBERNATED=true: an instance stopped by hibernation is fenced, and \
                 resumes from RAM if it is started again"
                    .to_owned(),
            );
        }
        out
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads configuration through `get`; empty values count as unset.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |k: &str| {
            get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut policy = policy(&get)?;
        let cluster = cluster_access(&get)?;
        policy.identity = cluster_identity(policy.scope.as_ref(), &cluster);
        let notify = notify::notify(&get)?.map(|n| Notify {
            cluster: cluster_label(&policy.identity, &cluster),
            ..n
        });
        Ok(Self {
            policy,
            cluster,
            webhook_token: webhook_token(&get)?,
            log_format: log_format(&get)?,
            push_auth: push_auth(&get)?,
            compute_endpoint: compute_endpoint(&get)?,
            serve_routes: serve_routes(&get)?,
            notify,
            redfish: redfish::files(&get)?,
            sweep_interval: sweep_interval(&get)?,
            request_timeout: request_timeout(&get)?,
            metrics_port: metrics_port(&get)?,
        })
    }
}

/// The settings the pipeline acts on, but the cluster's identity, which
/// also needs the cluster access.
fn policy(get: &impl Fn(&str) -> Option<String>) -> Result<Policy, ConfigError> {
    let dry_run = flag(get, "DRY_RUN")?;
    let no_schedule_too = flag(get, "OUT_OF_SERVICE_NO_SCHEDULE")?;
    let fence_hibernated = flag(get, "FENCE_HIBERNATED")?;
    let fast_not_ready = flag_or(get, "FAST_NOT_READY", true)?;
    let max_out_of_service = int(
        get,
        "MAX_OUT_OF_SERVICE",
        3,
        1,
        1000,
        "an integer from 1 to 1000",
    )?;
    let detach_wait = Duration::from_secs(int(
        get,
        "VOLUME_DETACH_TIMEOUT_SECONDS",
        60,
        1,
        600,
        "an integer from 1 to 600 (0 would report every fence failed)",
    )? as u64);
    let max_out_of_service_percent = match get("MAX_OUT_OF_SERVICE_PERCENT") {
        None => None,
        Some(_) => Some(int(
            get,
            "MAX_OUT_OF_SERVICE_PERCENT",
            100,
            1,
            100,
            "an integer from 1 to 100",
        )? as u8),
    };
    let mode = fencing_mode(get)?;
    let seconds = |var, default| -> Result<Duration, ConfigError> {
        Ok(Duration::from_secs(
            int(get, var, default, 0, 300, "an integer from 0 to 300")? as u64,
        ))
    };
    let confirm_again_after = seconds("CONFIRM_AGAIN_AFTER_SECONDS", 0)?;
    let recovery_settle = seconds("RECOVERY_SETTLE_SECONDS", 30)?;
    let not_ready_wait = seconds("NOT_READY_WAIT_SECONDS", 60)?;
    let recovery = recovery(get)?;
    let active_fencing = active_fencing(get)?;
    let control_namespace = control_namespace(get)?;
    Ok(Policy {
        dry_run,
        max_out_of_service,
        max_out_of_service_percent,
        mode,
        confirm_again_after,
        recovery_settle,
        recovery,
        active_fencing,
        no_schedule_too,
        not_ready_wait,
        control_namespace,
        detach_wait,
        fence_hibernated,
        fast_not_ready,
        scope: cluster_scope(get)?,
        reach: reach(get)?,
        ..Policy::default()
    })
}

/// `SWEEP_INTERVAL_SECONDS`: unset, `serve` sweeps only when called.
fn sweep_interval(get: &impl Fn(&str) -> Option<String>) -> Result<Option<Duration>, ConfigError> {
    if get("SWEEP_INTERVAL_SECONDS").is_none() {
        return Ok(None);
    }
    let seconds = int(
        get,
        "SWEEP_INTERVAL_SECONDS",
        60,
        30,
        3600,
        "an integer from 30 to 3600",
    )?;
    Ok(Some(Duration::from_secs(seconds as u64)))
}

/// `REQUEST_TIMEOUT_SECONDS`: unset, a request `serve` answers has no
/// deadline of its own.
fn request_timeout(get: &impl Fn(&str) -> Option<String>) -> Result<Option<Duration>, ConfigError> {
    if get("REQUEST_TIMEOUT_SECONDS").is_none() {
        return Ok(None);
    }
    let seconds = int(
        get,
        "REQUEST_TIMEOUT_SECONDS",
        300,
        10,
        3600,
        "an integer from 10 to 3600",
    )?;
    Ok(Some(Duration::from_secs(seconds as u64)))
}

/// `METRICS_PORT`: unset, `serve` exposes no metrics.
fn metrics_port(get: &impl Fn(&str) -> Option<String>) -> Result<Option<u16>, ConfigError> {
    if get("METRICS_PORT").is_none() {
        return Ok(None);
    }
    let port = int(
        get,
        "METRICS_PORT",
        9090,
        1,
        usize::from(u16::MAX),
        "a port number from 1 to 65535",
    )?;
    Ok(u16::try_from(port).ok())
}

/// `NODE_SELECTOR`: every Node when unset.
fn reach(get: &impl Fn(&str) -> Option<String>) -> Result<Reach, ConfigError> {
    let Some(value) = get("NODE_SELECTOR") else {
        return Ok(Reach::default());
    };
    match LabelSelector::parse(&value) {
        Ok(selector) => Ok(Reach {
            selector: Some(selector),
        }),
        Err(why) => Err(ConfigError::Malformed {
            var: "NODE_SELECTOR",
            value,
            why: format!("not a label selector: {why}"),
        }),
    }
}

/// `FENCING_MODE`, `auto` when unset.
fn fencing_mode(get: &impl Fn(&str) -> Option<String>) -> Result<ModeSetting, ConfigError> {
    match get("FENCING_MODE") {
        None => Ok(ModeSetting::Auto),
        Some(v) => ModeSetting::parse(&v).ok_or(ConfigError::Invalid {
            var: "FENCING_MODE",
            value: v,
            expected: "auto, taint or legacy",
        }),
    }
}

/// `RECOVERY`, `auto` when unset.
fn recovery(get: &impl Fn(&str) -> Option<String>) -> Result<RecoveryPolicy, ConfigError> {
    match get("RECOVERY") {
        None => Ok(RecoveryPolicy::Auto),
        Some(v) => RecoveryPolicy::parse(&v).ok_or(ConfigError::Invalid {
            var: "RECOVERY",
            value: v,
            expected: "auto or manual",
        }),
    }
}

/// `CONTROL_NAMESPACE`, `kube-system` when unset.
fn control_namespace(get: &impl Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
    match get("CONTROL_NAMESPACE") {
        None => Ok("kube-system".to_owned()),
        Some(ns) if is_dns_label(&ns) => Ok(ns),
        Some(ns) => Err(ConfigError::Invalid {
            var: "CONTROL_NAMESPACE",
            value: ns,
            expected: "a namespace name (lowercase letters, digits, hyphens, up to 63)",
        }),
    }
}

/// The webhook token's source: inline, an SSM parameter or a secret, at
/// most one.
fn webhook_token(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<TokenSource>, ConfigError> {
    let token_vars = [
        ("WEBHOOK_TOKEN", get("WEBHOOK_TOKEN")),
        (
            "WEBHOOK_TOKEN_SSM_PARAMETER",
            get("WEBHOOK_TOKEN_SSM_PARAMETER"),
        ),
        ("WEBHOOK_TOKEN_SECRET_ID", get("WEBHOOK_TOKEN_SECRET_ID")),
    ];
    Ok(match exclusive(&token_vars)? {
        None => None,
        Some(("WEBHOOK_TOKEN", v)) => {
            crate::core::inbound::trigger::function_url::WebhookToken::new(&v).map_err(|_| {
                ConfigError::Invalid {
                    var: "WEBHOOK_TOKEN",
                    value: "<redacted>".into(),
                    expected: "a token of at least 16 characters",
                }
            })?;
            Some(TokenSource::Inline(v))
        }
        Some(("WEBHOOK_TOKEN_SSM_PARAMETER", v)) => Some(TokenSource::Parameter(v)),
        Some((_, v)) => Some(TokenSource::Secret(v)),
    })
}

/// `LOG_FORMAT`, if set.
fn log_format(get: &impl Fn(&str) -> Option<String>) -> Result<Option<LogFormat>, ConfigError> {
    match get("LOG_FORMAT").as_deref() {
        None => Ok(None),
        Some("json") => Ok(Some(LogFormat::Json)),
        Some("text") => Ok(Some(LogFormat::Text)),
        Some(v) => Err(ConfigError::Invalid {
            var: "LOG_FORMAT",
            value: v.into(),
            expected: "json or text",
        }),
    }
}

/// `ACTIVE_FENCING` and the settings that only mean something with it on.
fn active_fencing(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<ActiveFencing>, ConfigError> {
    const TUNING: [&str; 4] = [
        "POWER_OFF_AFTER_SECONDS",
        "POWER_OFF_WAIT_SECONDS",
        "PARTITION_PERCENT",
        "POWER_OFF_CONTROL_PLANE",
    ];
    let scope = match get("ACTIVE_FENCING").as_deref() {
        None | Some("off") => None,
        Some("stuck") => Some(Scope::Stuck),
        Some("on") => Some(Scope::AnyHung),
        Some(v) => {
            return Err(ConfigError::Invalid {
                var: "ACTIVE_FENCING",
                value: v.into(),
                expected: "off, stuck or on",
            });
        }
    };
    let Some(scope) = scope else {
        return match TUNING.into_iter().find(|v| get(v).is_some()) {
            Some(var) => Err(ConfigError::Requires {
                var,
                needs: "ACTIVE_FENCING=stuck or on",
            }),
            None => Ok(None),
        };
    };
    let defaults = ActiveFencing::default();
    let secs = |d: Duration| d.as_secs() as usize;
    Ok(Some(ActiveFencing {
        after: Duration::from_secs(int(
            get,
            "POWER_OFF_AFTER_SECONDS",
            secs(defaults.after),
            60,
            3600,
            "an integer from 60 to 3600",
        )? as u64),
        wait: Duration::from_secs(int(
            get,
            "POWER_OFF_WAIT_SECONDS",
            secs(defaults.wait),
            10,
            600,
            "an integer from 10 to 600",
        )? as u64),
        partition_percent: int(
            get,
            "PARTITION_PERCENT",
            usize::from(defaults.partition_percent),
            1,
            100,
            "an integer from 1 to 100",
        )? as u8,
        control_plane: flag(get, "POWER_OFF_CONTROL_PLANE")?,
        scope,
    }))
}

/// `CLUSTER_VPC_ID` and `CLUSTER_TAG`: what proves an instance is one of the
/// cluster's machines when its Node has no provider id.
fn cluster_scope(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<ClusterScope>, ConfigError> {
    let tag = match get("CLUSTER_TAG") {
        None => None,
        Some(raw) => {
            let (key, value) = match raw.split_once('=') {
                Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
                None => (raw.clone(), None),
            };
            if key.is_empty() || key.len() > 128 || value.as_ref().is_some_and(|v| v.len() > 256) {
                return Err(ConfigError::Invalid {
                    var: "CLUSTER_TAG",
                    value: raw,
                    expected: "a tag KEY (1-128 characters) or KEY=VALUE (value up to 256)",
                });
            }
            Some((key, value))
        }
    };
    let vpc = match get("CLUSTER_VPC_ID") {
        None if tag.is_some() => {
            return Err(ConfigError::Requires {
                var: "CLUSTER_TAG",
                needs: "CLUSTER_VPC_ID",
            });
        }
        None => return Ok(None),
        Some(vpc) => vpc,
    };
    let hex = vpc.strip_prefix("vpc-").unwrap_or_default();
    if !matches!(hex.len(), 8 | 17)
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(ConfigError::Invalid {
            var: "CLUSTER_VPC_ID",
            value: vpc,
            expected: "a VPC id: vpc- and 8 or 17 lowercase hex digits",
        });
    }
    Ok(Some(ClusterScope { vpc, tag }))
}

/// What tells another cluster's instance apart: the EKS cluster's name, or
/// the one in a `CLUSTER_TAG` of `kubernetes.io/cluster/NAME`; and the VPC.
fn cluster_identity(scope: Option<&ClusterScope>, access: &ClusterAccess) -> ClusterIdentity {
    let tagged = scope
        .and_then(|s| s.tag.as_ref())
        .and_then(|(key, _)| ownership::name_in_tag_key(key));
    let name = match access {
        ClusterAccess::Eks { name, .. } => Some(name.clone()),
        _ => tagged.map(str::to_owned),
    };
    ClusterIdentity {
        name,
        vpc: scope.map(|s| s.vpc.clone()),
    }
}

/// The cluster's name for people: the identity's, or the GKE cluster's.
fn cluster_label(identity: &ClusterIdentity, access: &ClusterAccess) -> Option<String> {
    match access {
        ClusterAccess::Gke { cluster, .. } => cluster.rsplit('/').next().map(str::to_owned),
        _ => identity.name.clone(),
    }
}

/// What `serve` requires of push requests: both variables or neither.
fn push_auth(get: &impl Fn(&str) -> Option<String>) -> Result<Option<PushAuth>, ConfigError> {
    match (get("PUSH_AUDIENCE"), get("PUSH_SERVICE_ACCOUNT")) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(ConfigError::Requires {
            var: "PUSH_AUDIENCE",
            needs: "PUSH_SERVICE_ACCOUNT",
        }),
        (None, Some(_)) => Err(ConfigError::Requires {
            var: "PUSH_SERVICE_ACCOUNT",
            needs: "PUSH_AUDIENCE",
        }),
        (Some(audience), Some(service_account)) => {
            let expected = Expected::new(&audience, &service_account).map_err(|e| match e {
                ExpectedError::NotAnEmail(_) => ConfigError::Invalid {
                    var: "PUSH_SERVICE_ACCOUNT",
                    value: service_account.clone(),
                    expected: "a service account e-mail",
                },
                ExpectedError::NotAUrl(url) => ConfigError::Invalid {
                    var: "PUSH_AUDIENCE",
                    value: url,
                    expected: PUSH_AUDIENCE_ACCEPTS,
                },
                ExpectedError::EmptyAudience => ConfigError::Invalid {
                    var: "PUSH_AUDIENCE",
                    value: audience.clone(),
                    expected: PUSH_AUDIENCE_ACCEPTS,
                },
            })?;
            Ok(Some(PushAuth {
                expected,
                certs_url: get("PUSH_CERTS_URL"),
            }))
        }
    }
}

const PUSH_AUDIENCE_ACCEPTS: &str = "a comma-separated list of https://HOST[:PORT][/PATH] URLs \
     (no query, fragment, user or empty entry): the subscription's audience, the service's URL";

/// `SERVE_ROUTES`: the route groups named, each once at most; all unset.
fn serve_routes(get: &impl Fn(&str) -> Option<String>) -> Result<ServeRoutes, ConfigError> {
    let Some(raw) = get("SERVE_ROUTES") else {
        return Ok(ServeRoutes::default());
    };
    let invalid = || ConfigError::Invalid {
        var: "SERVE_ROUTES",
        value: raw.clone(),
        expected: "a comma-separated list of `events` (/pubsub, /eventarc, /sweep) and \
                   `alertmanager` (/alertmanager), each at most once",
    };
    let mut groups = Vec::new();
    for name in raw.split(',').map(str::trim) {
        let group = RouteGroup::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, g)| *g)
            .ok_or_else(invalid)?;
        if groups.contains(&group) {
            return Err(invalid());
        }
        groups.push(group);
    }
    Ok(ServeRoutes(groups))
}

/// A Compute Engine base URL, http:// or https://.
fn compute_endpoint(get: &impl Fn(&str) -> Option<String>) -> Result<Option<String>, ConfigError> {
    match get("COMPUTE_ENDPOINT") {
        None => Ok(None),
        Some(url) if url.starts_with("https://") || url.starts_with("http://") => Ok(Some(url)),
        Some(url) => Err(ConfigError::Invalid {
            var: "COMPUTE_ENDPOINT",
            value: url,
            expected: "an http:// or https:// URL",
        }),
    }
}

/// An RFC 1123 label, as namespace names are.
fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn gke_access_needs_the_cluster_its_endpoint_and_ca() {
        let cluster = "projects/proj-fencer/locations/us-central1/clusters/prod";
        let c = cfg(&[
            ("GKE_CLUSTER", cluster),
            ("CLUSTER_ENDPOINT", "https://10.0.0.2"),
            ("CLUSTER_CA_DATA", "Y2E="),
        ])
        .unwrap();
        assert_eq!(
            c.cluster,
            ClusterAccess::Gke {
                cluster: cluster.into(),
                endpoint: "https://10.0.0.2".into(),
                ca: "Y2E=".into()
            }
        );
        assert!(matches!(
            cfg(&[("GKE_CLUSTER", cluster), ("CLUSTER_CA_DATA", "Y2E=")]),
            Err(ConfigError::Requires {
                needs: "CLUSTER_ENDPOINT",
                ..
            })
        ));
        assert!(matches!(
            cfg(&[
                ("GKE_CLUSTER", cluster),
                ("CLUSTER_ENDPOINT", "https://10.0.0.2")
            ]),
            Err(ConfigError::Requires {
                needs: "CLUSTER_CA_DATA",
                ..
            })
        ));
        assert!(matches!(
            cfg(&[("GKE_CLUSTER", "prod")]),
            Err(ConfigError::Invalid {
                var: "GKE_CLUSTER",
                ..
            })
        ));
        assert!(matches!(
            cfg(&[("GKE_CLUSTER", cluster), ("CLUSTER_NAME", "prod")]),
            Err(ConfigError::Exclusive(_))
        ));
        assert!(matches!(
            cfg(&[
                ("GKE_CLUSTER", cluster),
                ("CLUSTER_ENDPOINT", "http://10.0.0.2"),
                ("CLUSTER_CA_DATA", "Y2E=")
            ]),
            Err(ConfigError::Invalid {
                var: "CLUSTER_ENDPOINT",
                ..
            })
        ));
    }

    /// Issue 58, item 5: `serve`'s requests are bounded by the caller's
    /// timeout only when it is given, and a bad one is refused by name.
    #[test]
    fn the_request_timeout_is_unset_by_default_and_bounded() {
        assert_eq!(cfg(&[]).unwrap().request_timeout, None);
        let set = cfg(&[("REQUEST_TIMEOUT_SECONDS", "270")]).unwrap();
        assert_eq!(set.request_timeout, Some(Duration::from_secs(270)));
        for bad in ["9", "3601", "soon", "-1"] {
            assert!(
                matches!(
                    cfg(&[("REQUEST_TIMEOUT_SECONDS", bad)]),
                    Err(ConfigError::Invalid {
                        var: "REQUEST_TIMEOUT_SECONDS",
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn push_auth_takes_both_or_neither_and_compute_a_url() {
        assert_eq!(cfg(&[]).unwrap().push_auth, None);
        let both = cfg(&[
            ("PUSH_AUDIENCE", "https://node-fencer.example"),
            (
                "PUSH_SERVICE_ACCOUNT",
                "push@proj-fencer.iam.gserviceaccount.com",
            ),
        ])
        .unwrap();
        assert_eq!(
            both.push_auth.map(|p| p.expected.email().to_owned()),
            Some("push@proj-fencer.iam.gserviceaccount.com".into())
        );
        assert!(cfg(&[("PUSH_AUDIENCE", "x")]).is_err());
        assert!(cfg(&[("PUSH_SERVICE_ACCOUNT", "a@b")]).is_err());
        assert!(
            cfg(&[
                ("PUSH_AUDIENCE", "x"),
                ("PUSH_SERVICE_ACCOUNT", "not-an-email")
            ])
            .is_err()
        );
        assert!(cfg(&[("COMPUTE_ENDPOINT", "http://127.0.0.1:1")]).is_ok());
        assert!(matches!(
            cfg(&[("COMPUTE_ENDPOINT", "127.0.0.1:1")]),
            Err(ConfigError::Invalid {
                var: "COMPUTE_ENDPOINT",
                ..
            })
        ));
    }

    #[test]
    fn push_audience_is_a_list_of_urls_each_checked() {
        let account = (
            "PUSH_SERVICE_ACCOUNT",
            "push@proj-fencer.iam.gserviceaccount.com",
        );
        let two = "https://push.node-fencer.example, https://node-fencer-abc-uc.a.run.app";
        let auth = cfg(&[("PUSH_AUDIENCE", two), account])
            .unwrap()
            .push_auth
            .expect("push auth");
        assert_eq!(
            auth.expected.audiences(),
            [
                "https://push.node-fencer.example",
                "https://node-fencer-abc-uc.a.run.app"
            ]
        );
        for (value, named) in [
            ("node-fencer-push", "node-fencer-push"),
            ("https://a.example,http://b.example", "http://b.example"),
            (
                "https://a.example,,https://b.example",
                "https://a.example,,https://b.example",
            ),
        ] {
            let err = cfg(&[("PUSH_AUDIENCE", value), account]).unwrap_err();
            assert_eq!(
                err,
                ConfigError::Invalid {
                    var: "PUSH_AUDIENCE",
                    value: named.into(),
                    expected: PUSH_AUDIENCE_ACCEPTS
                },
                "{value}"
            );
            assert!(err.to_string().contains("https://HOST"), "{err}");
        }
    }

    #[test]
    fn serve_routes_name_the_groups_a_service_answers() {
        let all = cfg(&[]).unwrap().serve_routes;
        assert!(all.serves(RouteGroup::Events) && all.serves(RouteGroup::Alertmanager));
        assert_eq!(all.names(), ["events", "alertmanager"]);
        let events = cfg(&[("SERVE_ROUTES", "events")]).unwrap().serve_routes;
        assert!(events.serves(RouteGroup::Events) && !events.serves(RouteGroup::Alertmanager));
        let both = cfg(&[("SERVE_ROUTES", " alertmanager , events ")]).unwrap();
        assert_eq!(both.serve_routes.names(), ["events", "alertmanager"]);
        for bad in ["pubsub", "events,", "events,events", "Events", ","] {
            let err = cfg(&[("SERVE_ROUTES", bad)]).unwrap_err();
            assert!(
                matches!(&err, ConfigError::Invalid { var: "SERVE_ROUTES", value, .. } if value == bad),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains("`alertmanager`"), "{err}");
        }
    }

    #[test]
    fn node_selector_is_a_label_selector_or_an_error_naming_it() {
        assert_eq!(cfg(&[]).unwrap().policy.reach, Reach::default());
        let c = cfg(&[("NODE_SELECTOR", " pool in (db, queue),!spot ")]).unwrap();
        let selector = c.policy.reach.selector.map(|s| s.to_string());
        assert_eq!(selector.as_deref(), Some("pool in (db,queue),!spot"));
        for bad in ["pool=a,", "pool in (a", "Pool/x=a", "pool stateful"] {
            let err = cfg(&[("NODE_SELECTOR", bad)]).unwrap_err().to_string();
            assert!(
                err.starts_with("NODE_SELECTOR=") && err.contains("not a label selector"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn defaults() {
        let c = cfg(&[]).unwrap();
        assert!(!c.policy.dry_run);
        assert_eq!(c.policy.max_out_of_service, 3);
        assert_eq!(c.policy.detach_wait, Duration::from_secs(60));
        assert_eq!(c.cluster, ClusterAccess::Ambient);
        assert_eq!(c.webhook_token, None);
        assert_eq!(c.policy.mode, ModeSetting::Auto);
        assert_eq!(c.policy.max_out_of_service_percent, None);
        assert_eq!(c.policy.confirm_again_after, Duration::ZERO);
        assert_eq!(c.policy.recovery_settle, Duration::from_secs(30));
        assert_eq!(c.policy.recovery, RecoveryPolicy::Auto);
        assert_eq!(c.policy.not_ready_wait, Duration::from_secs(60));
        assert_eq!(c.policy.control_namespace, "kube-system");
        assert!(
            !c.policy.fence_hibernated,
            "a hibernated instance is not off by default"
        );
        let c = cfg(&[("FENCE_HIBERNATED", "true")]).unwrap();
        assert!(c.policy.fence_hibernated);
        assert!(
            c.policy.fast_not_ready,
            "a kubelet proven silent since the stop is not waited for by default"
        );
        let c = cfg(&[("FAST_NOT_READY", "false")]).unwrap();
        assert!(!c.policy.fast_not_ready, "the setting turns it off");
        let err = cfg(&[("FAST_NOT_READY", "soon")]).unwrap_err();
        assert!(err.to_string().contains("FAST_NOT_READY"), "{err}");
        assert!(!c.policy.no_schedule_too);
        let c = cfg(&[("OUT_OF_SERVICE_NO_SCHEDULE", "true")]).unwrap();
        assert!(c.policy.no_schedule_too);
        let err = cfg(&[("OUT_OF_SERVICE_NO_SCHEDULE", "both")]).unwrap_err();
        assert!(
            err.to_string().contains("OUT_OF_SERVICE_NO_SCHEDULE"),
            "{err}"
        );
    }

    #[test]
    fn active_fencing_is_off_unless_switched_on_and_its_settings_need_it() {
        assert_eq!(cfg(&[]).unwrap().policy.active_fencing, None);
        assert_eq!(
            cfg(&[("ACTIVE_FENCING", "off")])
                .unwrap()
                .policy
                .active_fencing,
            None
        );
        let on = cfg(&[("ACTIVE_FENCING", "on")]).unwrap();
        assert_eq!(on.policy.active_fencing, Some(ActiveFencing::default()));
        assert_eq!(
            on.policy.active_fencing.map(|a| a.scope),
            Some(Scope::AnyHung)
        );
        let stuck = cfg(&[("ACTIVE_FENCING", "stuck")]).unwrap();
        assert_eq!(
            stuck.policy.active_fencing,
            Some(ActiveFencing {
                scope: Scope::Stuck,
                ..ActiveFencing::default()
            })
        );
        let tuned = cfg(&[
            ("ACTIVE_FENCING", "stuck"),
            ("POWER_OFF_AFTER_SECONDS", "300"),
            ("POWER_OFF_WAIT_SECONDS", "60"),
            ("PARTITION_PERCENT", "50"),
        ])
        .unwrap();
        assert_eq!(
            tuned.policy.active_fencing,
            Some(ActiveFencing {
                after: Duration::from_secs(300),
                wait: Duration::from_secs(60),
                partition_percent: 50,
                control_plane: false,
                scope: Scope::Stuck,
            })
        );
        for var in [
            "POWER_OFF_AFTER_SECONDS",
            "POWER_OFF_WAIT_SECONDS",
            "PARTITION_PERCENT",
        ] {
            assert_eq!(
                cfg(&[(var, "100")]).unwrap_err(),
                ConfigError::Requires {
                    var,
                    needs: "ACTIVE_FENCING=stuck or on"
                }
            );
        }
        for (var, bad) in [
            ("ACTIVE_FENCING", "true"),
            ("POWER_OFF_AFTER_SECONDS", "59"),
            ("POWER_OFF_AFTER_SECONDS", "3601"),
            ("POWER_OFF_WAIT_SECONDS", "9"),
            ("POWER_OFF_WAIT_SECONDS", "601"),
            ("PARTITION_PERCENT", "0"),
            ("PARTITION_PERCENT", "101"),
        ] {
            let err = cfg(&[("ACTIVE_FENCING", "on"), (var, bad)]).unwrap_err();
            assert!(err.to_string().contains(var), "{err}");
        }
    }

    #[test]
    fn lifecycle_settings() {
        let c = cfg(&[
            ("FENCING_MODE", "legacy"),
            ("MAX_OUT_OF_SERVICE_PERCENT", "20"),
            ("CONFIRM_AGAIN_AFTER_SECONDS", "15"),
            ("RECOVERY_SETTLE_SECONDS", "0"),
            ("NOT_READY_WAIT_SECONDS", "0"),
            ("CONTROL_NAMESPACE", "node-fencer"),
            ("RECOVERY", "manual"),
        ])
        .unwrap();
        assert_eq!(c.policy.recovery, RecoveryPolicy::Manual);
        assert_eq!(c.policy.not_ready_wait, Duration::ZERO);
        assert_eq!(c.policy.mode, ModeSetting::Legacy);
        assert_eq!(c.policy.max_out_of_service_percent, Some(20));
        assert_eq!(c.policy.confirm_again_after, Duration::from_secs(15));
        assert_eq!(c.policy.recovery_settle, Duration::ZERO);
        assert_eq!(c.policy.control_namespace, "node-fencer");
        for (var, bad) in [
            ("FENCING_MODE", "delete"),
            ("MAX_OUT_OF_SERVICE_PERCENT", "0"),
            ("MAX_OUT_OF_SERVICE_PERCENT", "101"),
            ("CONFIRM_AGAIN_AFTER_SECONDS", "301"),
            ("RECOVERY_SETTLE_SECONDS", "-1"),
            ("NOT_READY_WAIT_SECONDS", "301"),
            ("CONTROL_NAMESPACE", "Kube_System"),
            ("RECOVERY", "never"),
        ] {
            let err = cfg(&[(var, bad)]).unwrap_err();
            assert!(err.to_string().contains(var), "{err}");
        }
    }

    #[test]
    fn values_are_parsed() {
        let c = cfg(&[
            ("DRY_RUN", "TRUE"),
            ("MAX_OUT_OF_SERVICE", "5"),
            ("VOLUME_DETACH_TIMEOUT_SECONDS", "1"),
            ("CLUSTER_NAME", "prod-eu"),
            (
                "WEBHOOK_TOKEN_SECRET_ID",
                "arn:aws:secretsmanager:eu-west-1:1:secret:t",
            ),
            ("LOG_FORMAT", "text"),
            ("KUBECONFIG_SECRET_ID", ""),
        ])
        .unwrap();
        assert!(c.policy.dry_run);
        assert_eq!(c.policy.max_out_of_service, 5);
        assert_eq!(
            c.cluster,
            ClusterAccess::Eks {
                name: "prod-eu".into(),
                endpoint: None
            }
        );
        assert!(matches!(c.webhook_token, Some(TokenSource::Secret(_))));
        assert_eq!(c.log_format, Some(LogFormat::Text));
    }

    #[test]
    fn errors_name_the_variable() {
        for (pairs, var) in [
            (vec![("DRY_RUN", "maybe")], "DRY_RUN"),
            (vec![("FENCE_HIBERNATED", "yes please")], "FENCE_HIBERNATED"),
            (vec![("CLUSTER_VPC_ID", "vpc-xyz")], "CLUSTER_VPC_ID"),
            (
                vec![("CLUSTER_VPC_ID", "subnet-0123abcd")],
                "CLUSTER_VPC_ID",
            ),
            (
                vec![("CLUSTER_TAG", "kubernetes.io/cluster/prod")],
                "CLUSTER_TAG",
            ),
            (
                vec![
                    ("CLUSTER_VPC_ID", "vpc-0123abcd"),
                    ("CLUSTER_TAG", "=owned"),
                ],
                "CLUSTER_TAG",
            ),
            (vec![("MAX_OUT_OF_SERVICE", "0")], "MAX_OUT_OF_SERVICE"),
            (vec![("MAX_OUT_OF_SERVICE", "-1")], "MAX_OUT_OF_SERVICE"),
            (
                vec![("VOLUME_DETACH_TIMEOUT_SECONDS", "601")],
                "VOLUME_DETACH_TIMEOUT_SECONDS",
            ),
            // Issue 12, item 15: with no wait at all every fence reads failed.
            (
                vec![("VOLUME_DETACH_TIMEOUT_SECONDS", "0")],
                "VOLUME_DETACH_TIMEOUT_SECONDS",
            ),
            (vec![("LOG_FORMAT", "xml")], "LOG_FORMAT"),
            (vec![("WEBHOOK_TOKEN", "short")], "WEBHOOK_TOKEN"),
            (vec![("CLUSTER_NAME", "a b")], "CLUSTER_NAME"),
            (
                vec![("CLUSTER_NAME", "c"), ("CLUSTER_ENDPOINT", "https://x")],
                "CLUSTER_ENDPOINT",
            ),
            (
                vec![("CLUSTER_ENDPOINT", "https://x"), ("CLUSTER_CA_DATA", "x")],
                "CLUSTER_ENDPOINT",
            ),
            (
                vec![("CLUSTER_NAME", "c"), ("KUBECONFIG_SECRET_ID", "s")],
                "KUBECONFIG_SECRET_ID",
            ),
            (
                vec![
                    ("WEBHOOK_TOKEN", "0123456789abcdef"),
                    ("WEBHOOK_TOKEN_SECRET_ID", "s"),
                ],
                "WEBHOOK_TOKEN_SECRET_ID",
            ),
        ] {
            let err = cfg(&pairs).unwrap_err().to_string();
            assert!(err.contains(var), "{err} should name {var}");
        }
    }

    /// Issue 12, item 15: valid settings that weaken a protection say so.
    #[test]
    fn settings_that_weaken_a_protection_are_named() {
        assert!(cfg(&[]).unwrap().warnings().is_empty());
        let warned = cfg(&[
            ("RECOVERY_SETTLE_SECONDS", "0"),
            ("FENCE_HIBERNATED", "true"),
        ])
        .unwrap()
        .warnings();
        assert_eq!(warned.len(), 2);
        assert!(warned[0].starts_with("RECOVERY_SETTLE_SECONDS=0"));
        let open = cfg(&[("ACTIVE_FENCING", "on"), ("PARTITION_PERCENT", "100")]).unwrap();
        assert!(
            open.warnings()
                .iter()
                .any(|w| w.starts_with("PARTITION_PERCENT=100")),
            "{:?}",
            open.warnings()
        );
        assert!(
            cfg(&[("ACTIVE_FENCING", "on")])
                .unwrap()
                .warnings()
                .is_empty()
        );
        assert!(warned[1].starts_with("FENCE_HIBERNATED=true"));
    }

    #[test]
    fn the_cluster_scope_is_a_vpc_and_an_optional_tag() {
        assert_eq!(cfg(&[]).unwrap().policy.scope, None);
        let c = cfg(&[
            ("CLUSTER_VPC_ID", "vpc-0123456789abcdef0"),
            ("CLUSTER_TAG", "kubernetes.io/cluster/prod=owned"),
        ])
        .unwrap();
        assert_eq!(
            c.policy.scope,
            Some(ClusterScope {
                vpc: "vpc-0123456789abcdef0".into(),
                tag: Some(("kubernetes.io/cluster/prod".into(), Some("owned".into()))),
            })
        );
        let c = cfg(&[("CLUSTER_VPC_ID", "vpc-0123abcd"), ("CLUSTER_TAG", "team")]).unwrap();
        assert_eq!(
            c.policy.scope.and_then(|s| s.tag),
            Some(("team".into(), None))
        );
    }

    #[test]
    fn the_cluster_identity_comes_from_the_eks_name_or_the_cluster_tag() {
        let identity = |vars: &[(&str, &str)]| cfg(vars).unwrap().policy.identity;
        assert!(!identity(&[]).is_known());
        let eks = identity(&[("CLUSTER_NAME", "prod-eu")]);
        assert_eq!(eks.name.as_deref(), Some("prod-eu"));
        assert_eq!(eks.vpc, None);
        let tagged = identity(&[
            ("CLUSTER_VPC_ID", "vpc-0123abcd"),
            ("CLUSTER_TAG", "kubernetes.io/cluster/prod=owned"),
        ]);
        assert_eq!(tagged.name.as_deref(), Some("prod"));
        assert_eq!(tagged.vpc.as_deref(), Some("vpc-0123abcd"));
        // Another tag names no cluster: the VPC alone tells.
        let team = identity(&[("CLUSTER_VPC_ID", "vpc-0123abcd"), ("CLUSTER_TAG", "team")]);
        assert_eq!(team.name, None);
        assert!(team.is_known());
    }

    #[test]
    fn the_inline_token_never_shows() {
        let c = cfg(&[("WEBHOOK_TOKEN", "0123456789abcdef-secret")]).unwrap();
        assert!(!format!("{c:?}").contains("secret"));
        let err = cfg(&[("WEBHOOK_TOKEN", "tiny-secret")])
            .unwrap_err()
            .to_string();
        assert!(!err.contains("tiny-secret"));
    }
}

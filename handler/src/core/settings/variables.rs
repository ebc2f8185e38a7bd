//! The environment variables node-fencer reads, each with what it accepts
//! (shown by `--help`, written to the manifest), the error that names one,
//! and the readers every part of the configuration shares.

use crate::core::model::values::parse_bool;

/// Every variable read, with what it accepts (for `--help` and the README).
pub(crate) const VARIABLES: &[(&str, &str)] = &[
    (
        "DRY_RUN",
        "true|false (default false): plan only, change nothing",
    ),
    (
        "MAX_OUT_OF_SERVICE",
        "integer 1..=1000 (default 3): nodes allowed to carry the out-of-service taint at once",
    ),
    (
        "MAX_OUT_OF_SERVICE_PERCENT",
        "integer 1..=100 (default unset): also cap out-of-service nodes at this share of all nodes (at least one)",
    ),
    (
        "FENCING_MODE",
        "auto|taint|legacy (default auto): the out-of-service taint, or force-deleting pods and VolumeAttachments; auto picks by server version (taint from 1.26)",
    ),
    (
        "CONFIRM_AGAIN_AFTER_SECONDS",
        "integer 0..=300 (default 0): ask EC2 a second time after this delay before acting",
    ),
    (
        "NOT_READY_WAIT_SECONDS",
        "integer 0..=300 (default 60): when the instance is confirmed off but its Node is still Ready, wait this long within the invocation for Kubernetes to notice (set it above --node-monitor-grace-period, 50 s by default); 0 fails at once for a retry",
    ),
    (
        "RECOVERY_SETTLE_SECONDS",
        "integer 0..=300 (default 30): how long a fenced node must be Ready again before its taint is removed",
    ),
    (
        "RECOVERY",
        "auto|manual (default auto): manual also waits, before a fencing ends, for an operator to confirm the node healthy (`node-fencer recover --confirm NODE`, or the Node annotation node-fencer.io/recovery-confirmed set to its node-fencer.io/fenced-at)",
    ),
    (
        "OUT_OF_SERVICE_NO_SCHEDULE",
        "true|false (default false): also apply node.kubernetes.io/out-of-service=nodeshutdown:NoSchedule beside the NoExecute taint, the pair Rook/Ceph documents for a fenced node; such a fencing ends only with proof of a power cycle",
    ),
    (
        "ACTIVE_FENCING",
        "off|stuck|on (default off): power off, out of band, a node NotReady for POWER_OFF_AFTER_SECONDS whose machine the cloud still reports running (found by the sweep, a firing KubeNodeNotReady alert, or `fence --power-off`), then fence it as a stopped one; stuck: only a node on which a pod holds a volume only one node may attach (ReadWriteOnce), the rest left to Kubernetes; on: any such node; needs ec2:StopInstances and ec2:DescribeInstanceStatus on EC2, compute.instances.stop on Compute Engine",
    ),
    (
        "POWER_OFF_AFTER_SECONDS",
        "integer 60..=3600 (default 120; with ACTIVE_FENCING=stuck or on): how long a node must have been NotReady before its instance may be powered off",
    ),
    (
        "POWER_OFF_WAIT_SECONDS",
        "integer 10..=600 (default 120; with ACTIVE_FENCING=stuck or on): how long, within the invocation, to wait for a powered-off instance to reach stopped; one not stopped by then fails the invocation for a retry, untainted",
    ),
    (
        "PARTITION_PERCENT",
        "integer 1..=100 (default 30; with ACTIVE_FENCING=stuck or on): refuse every power-off while more than this share of the nodes are dark (NotReady and not fenced, or fenced or powered off by node-fencer in the last 30 minutes), or while every node of the candidate's zone is",
    ),
    (
        "POWER_OFF_CONTROL_PLANE",
        "true/false (default false; with ACTIVE_FENCING=stuck or on): also power off Nodes with the control-plane role label (their machines may hold etcd members)",
    ),
    (
        "CONTROL_NAMESPACE",
        "namespace of the fencing Lease and the kill-switch ConfigMap `node-fencer` (default kube-system)",
    ),
    (
        "NODE_SELECTOR",
        "a Kubernetes label selector (default unset: every Node), as `kubectl -l` takes it (`pool=stateful`, `tier in (db,queue)`, `!spot`): the Nodes node-fencer may fence or power off at all; a Node labelled node-fencer.io/exclude=true is left alone whatever it says. Neither ever holds back the recovery of a fencing made earlier",
    ),
    (
        "FENCE_HIBERNATED",
        "true|false (default false): take an instance stopped by hibernation for off (it resumes from RAM when started)",
    ),
    (
        "FAST_NOT_READY",
        "true|false (default true): when the cloud recorded when the machine stopped, the kubelet's Lease in kube-node-lease was last written at least 5 s before that, and the kubelet has missed a renewal it was due to make (on the apiserver's clock or node-fencer's own), set the Node Ready=Unknown then instead of waiting out the node controller's grace period; false waits it out",
    ),
    (
        "VOLUME_DETACH_TIMEOUT_SECONDS",
        "integer 1..=600 (default 60): wait for the fenced instance to let go of its detached volumes (0 would report every fence failed)",
    ),
    (
        "CLUSTER_VPC_ID",
        "vpc-… (default unset): the cluster's VPC; an EC2 event's instance in another VPC is let go without a Kubernetes request, and Nodes without an AWS provider id are fenced only when the instance is in this VPC and holds the Node's InternalIP",
    ),
    (
        "CLUSTER_TAG",
        "KEY or KEY=VALUE (default unset; with CLUSTER_VPC_ID): a tag the cluster's instances carry, also required of such an instance; kubernetes.io/cluster/NAME also names the cluster (see CLUSTER_NAME)",
    ),
    (
        "CLUSTER_NAME",
        "EKS cluster name: authenticate with an EKS token (eks:DescribeCluster unless CLUSTER_ENDPOINT and CLUSTER_CA_DATA are set); an EC2 event's instance whose cluster tags name only other clusters is let go without a Kubernetes request",
    ),
    (
        "CLUSTER_ENDPOINT",
        "EKS or GKE API server URL, https:// (with CLUSTER_NAME or GKE_CLUSTER, and CLUSTER_CA_DATA)",
    ),
    (
        "CLUSTER_CA_DATA",
        "base64 PEM CA of the API server (with CLUSTER_ENDPOINT)",
    ),
    (
        "KUBECONFIG_SSM_PARAMETER",
        "SSM SecureString parameter holding a kubeconfig (self-managed clusters)",
    ),
    (
        "KUBECONFIG_SECRET_ID",
        "Secrets Manager secret holding a kubeconfig (self-managed clusters)",
    ),
    (
        "KUBECONFIG",
        "kubeconfig path when none of the above is set (local use)",
    ),
    (
        "GKE_CLUSTER",
        "projects/P/locations/L/clusters/C (with CLUSTER_ENDPOINT and CLUSTER_CA_DATA): authenticate to GKE with the service account's Google access token (Application Default Credentials: on Cloud Run, the metadata server)",
    ),
    (
        "PUSH_AUDIENCE",
        "comma-separated https:// URLs, the audiences the OIDC tokens of Pub/Sub push, Eventarc and Cloud Scheduler requests may carry (`serve`; with PUSH_SERVICE_ACCOUNT): the subscription's audience, the service's URL; a URL without a path also stands for itself followed by the request's path; unset, /pubsub, /eventarc and /sweep refuse every request",
    ),
    (
        "PUSH_SERVICE_ACCOUNT",
        "the service account e-mail those tokens must be issued for (`serve`; with PUSH_AUDIENCE)",
    ),
    (
        "PUSH_CERTS_URL",
        "where the push tokens' signing keys are read (default https://www.googleapis.com/oauth2/v3/certs; https, or http on a loopback address for a local key server)",
    ),
    (
        "SERVE_ROUTES",
        "comma-separated `events` (/pubsub, /eventarc, /sweep) and `alertmanager` (/alertmanager) (`serve`; default both): the routes this service answers, the others 404, so the public webhook can run as a service of its own",
    ),
    (
        "COMPUTE_ENDPOINT",
        "Compute Engine API base URL (default https://compute.googleapis.com); a plain http:// one is a local stand-in and gets no credentials",
    ),
    (
        "NOTIFY_TOPIC",
        "an SNS topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME, standard) or a Pub/Sub topic (projects/PROJECT/topics/TOPIC) (default unset: no notifications): one JSON message per fencing, refusal, power-off, recovery and change of a Node's witness (schema node-fencer.io/notice/v1, docs/notifications.md); a failure to publish is logged and counted, never fails the fencing; needs sns:Publish, or pubsub.topics.publish",
    ),
    (
        "PUBSUB_ENDPOINT",
        "Pub/Sub API base URL (default https://pubsub.googleapis.com); a plain http:// one is a local stand-in and gets no credentials",
    ),
    (
        "REDFISH_INVENTORY",
        "path of a JSON file: which BMC (Redfish endpoint and System) backs which Node, by Node name or label (docs/onprem.md); on-premises machines are confirmed off by their BMC's PowerState",
    ),
    (
        "REDFISH_CREDENTIALS_DIR",
        "directory of the BMCs' credentials (default /etc/node-fencer/bmc): DIR/NAME/username and DIR/NAME/password, as a Secret mounted as a volume; read at each use, never logged",
    ),
    (
        "SWEEP_INTERVAL_SECONDS",
        "integer 30..=3600 (`serve`; default unset: only when /sweep is called): run the sweep every so many seconds, off-cluster where no scheduler calls it",
    ),
    (
        "REQUEST_TIMEOUT_SECONDS",
        "integer 10..=3600 (`serve`; default unset: no deadline but the stages' own): how long the caller waits for each request's answer (the Cloud Run module sets its request timeout here); every wait of the request, the Lease's, the witness round's and the notifications' included, ends before it, and a step that would not finish is left to the redelivery",
    ),
    (
        "METRICS_PORT",
        "port 1..=65535 (`serve`; default unset: no metrics): answer Prometheus' GET /metrics on this port, apart from the triggers' (on-premises; the counts, latencies, sweeps and each Node's witness, docs/witness.md)",
    ),
    (
        "WEBHOOK_TOKEN_SECRET_ID",
        "Secrets Manager secret holding the Alertmanager bearer token",
    ),
    (
        "WEBHOOK_TOKEN_SSM_PARAMETER",
        "SSM SecureString parameter holding the Alertmanager bearer token",
    ),
    (
        "WEBHOOK_TOKEN",
        "the Alertmanager bearer token itself (local use, or on Cloud Run from Secret Manager)",
    ),
    (
        "LOG_FORMAT",
        "json|text (default json in Lambda, text on a terminal)",
    ),
    (
        "RUST_LOG",
        "log filter (default info, with the SDK's instance-metadata lookups at error)",
    ),
];

/// A configuration error, naming the variable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A variable holds a value it does not accept.
    #[error("{var}={value:?} is invalid: expected {expected}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it accepts.
        expected: &'static str,
    },
    /// A variable's value is not in the syntax it takes.
    #[error("{var}={value:?} is invalid: {why}")]
    Malformed {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// Variables that exclude each other are both set.
    #[error("{0} are mutually exclusive: set at most one")]
    Exclusive(String),
    /// A variable needs another one.
    #[error("{var} requires {needs}")]
    Requires {
        /// The variable set.
        var: &'static str,
        /// What else it needs.
        needs: &'static str,
    },
}

/// A `true`/`false` variable, `false` when unset.
pub(super) fn flag(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<bool, ConfigError> {
    flag_or(get, var, false)
}

/// A `true`/`false` variable, `default` when unset.
pub(super) fn flag_or(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: bool,
) -> Result<bool, ConfigError> {
    match get(var) {
        None => Ok(default),
        Some(v) => parse_bool(&v).ok_or(ConfigError::Invalid {
            var,
            value: v,
            expected: "true or false",
        }),
    }
}

/// The one variable of `vars` that is set, if any; more than one is an error.
pub(super) fn exclusive(
    vars: &[(&'static str, Option<String>)],
) -> Result<Option<(&'static str, String)>, ConfigError> {
    let set: Vec<_> = vars.iter().filter(|(_, v)| v.is_some()).collect();
    match set.as_slice() {
        [] => Ok(None),
        [(k, Some(v))] => Ok(Some((k, v.clone()))),
        _ => Err(ConfigError::Exclusive(
            set.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", "),
        )),
    }
}

/// An integer variable within `min..=max`, `default` when unset.
pub(super) fn int(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: usize,
    min: usize,
    max: usize,
    expected: &'static str,
) -> Result<usize, ConfigError> {
    match get(var) {
        None => Ok(default),
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (min..=max).contains(n))
            .ok_or(ConfigError::Invalid {
                var,
                value: v,
                expected,
            }),
    }
}

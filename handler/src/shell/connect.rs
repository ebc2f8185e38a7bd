//! Building the clients: the AWS SDK configuration (one TLS stack: rustls
//! with ring), the EC2 client, the Kubernetes client for each way of reaching
//! a cluster, and the webhook token. Secrets are fetched on first use, not at
//! cold start, and kept for the life of the execution environment.

use std::time::Instant;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_credential_types::provider::ProvideCredentials;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;
use tokio::sync::{Mutex, OnceCell};

use crate::core::inbound::trigger::function_url::WebhookToken;
use crate::core::rules::retry;
use crate::core::settings::access::ClusterAccess;
use crate::core::settings::config::{Config, TokenSource};
use crate::shell::eks_token;
pub use crate::shell::timeouts::Timeouts;

/// A failure to reach or authenticate to a dependency. All are retryable:
/// the invocation fails and Lambda tries again.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No kubeconfig or in-cluster environment was found.
    #[error(
        "no Kubernetes configuration found (set KUBECONFIG, CLUSTER_NAME or KUBECONFIG_*): {0}"
    )]
    InferConfig(String),
    /// The kubeconfig could not be parsed or used.
    #[error("the kubeconfig from {source_name} is unusable: {message}")]
    Kubeconfig {
        /// Where it came from.
        source_name: String,
        /// What is wrong.
        message: String,
    },
    /// `ssm:GetParameter` failed.
    #[error("reading SSM parameter {name} failed: {message}")]
    GetParameter {
        /// The parameter.
        name: String,
        /// The error.
        message: String,
    },
    /// `secretsmanager:GetSecretValue` failed.
    #[error("reading secret {id} failed: {message}")]
    GetSecretValue {
        /// The secret.
        id: String,
        /// The error.
        message: String,
    },
    /// `eks:DescribeCluster` failed or returned no endpoint.
    #[error("eks:DescribeCluster {name} failed: {message}")]
    DescribeCluster {
        /// The cluster.
        name: String,
        /// The error.
        message: String,
    },
    /// No AWS credentials or region for the EKS token.
    #[error("cannot sign the EKS token: {0}")]
    Credentials(String),
    /// The webhook token read from its store is unusable.
    #[error("the webhook token from {0} is shorter than 16 characters")]
    WeakToken(String),
    /// No Google access token: no credentials found, or the metadata
    /// server did not answer.
    #[error("cannot get a Google access token: {0}")]
    GoogleCredentials(String),
    /// Building the Kubernetes client failed.
    #[error("building the Kubernetes client failed: {0}")]
    Client(#[source] kube::Error),
}

/// Loads the shared AWS SDK configuration with the project's one TLS stack,
/// bounded retries (the SDK's standard mode: throttling, 5xx, timeouts and
/// dropped connections, exponential backoff with jitter) and timeouts.
pub async fn sdk_config() -> SdkConfig {
    sdk_config_with(Timeouts::default()).await
}

/// [`sdk_config`] with other timeouts.
pub async fn sdk_config_with(timeouts: Timeouts) -> SdkConfig {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https();
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(http)
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(retry::EC2.max_attempts)
                .with_initial_backoff(retry::EC2.base)
                .with_max_backoff(retry::EC2.cap),
        )
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(timeouts.connect)
                .operation_attempt_timeout(timeouts.attempt)
                .operation_timeout(timeouts.call)
                .build(),
        )
        .load()
        .await
}

/// Builds a Kubernetes client with timeouts on every request and without
/// kube's own retry layer (up to 15 attempts and pauses of 1000 s, beyond any
/// Lambda timeout); `shell::cluster` retries within [`retry::KUBERNETES`].
pub fn kube_client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    kube_client_with(config, Timeouts::default())
}

/// [`kube_client`] with other timeouts.
pub fn kube_client_with(
    mut config: kube::Config,
    timeouts: Timeouts,
) -> Result<kube::Client, kube::Error> {
    config.connect_timeout = Some(timeouts.connect);
    config.read_timeout = Some(timeouts.attempt);
    config.write_timeout = Some(timeouts.attempt);
    // Count the read timeout from the request, not from when a pooled
    // connection went idle.
    config.reset_reader_on_write = true;
    config.default_retry = false;
    kube::Client::try_from(config)
}

/// The clients of one execution environment, built once and reused.
pub struct Clients {
    /// The AWS SDK configuration.
    pub sdk: SdkConfig,
    /// EC2.
    pub ec2: aws_sdk_ec2::Client,
    access: ClusterAccess,
    token_source: Option<TokenSource>,
    kube: Mutex<Option<(Instant, kube::Client)>>,
    token: OnceCell<Option<WebhookToken>>,
    #[cfg(feature = "google-cloud")]
    compute: crate::shell::cloud::gce::GceEndpoint,
    #[cfg(feature = "google-cloud")]
    gce: OnceCell<Option<crate::shell::cloud::gce::Gce>>,
}

impl Clients {
    /// Builds the clients; makes no network call.
    pub fn new(sdk: SdkConfig, config: &Config) -> Self {
        Self {
            ec2: aws_sdk_ec2::Client::new(&sdk),
            sdk,
            access: config.cluster.clone(),
            token_source: config.webhook_token.clone(),
            kube: Mutex::new(None),
            token: OnceCell::new(),
            #[cfg(feature = "google-cloud")]
            compute: crate::shell::cloud::gce::GceEndpoint {
                url: config.compute_endpoint.clone(),
                ..Default::default()
            },
            #[cfg(feature = "google-cloud")]
            gce: OnceCell::new(),
        }
    }

    /// The Compute Engine client, built on first use; `None` when it
    /// cannot be built (logged), so every question to it fails.
    #[cfg(feature = "google-cloud")]
    pub async fn gce(&self) -> Option<&crate::shell::cloud::gce::Gce> {
        self.gce
            .get_or_init(|| async {
                crate::shell::cloud::gce::Gce::new(&self.compute)
                    .await
                    .inspect_err(|e| tracing::error!(error = %e, "no Compute Engine client"))
                    .ok()
            })
            .await
            .as_ref()
    }

    /// Builds now the Kubernetes client that needs no network call to build
    /// (a kubeconfig file or the in-cluster environment), so the first event
    /// does not pay for it; kubeconfigs in SSM or Secrets Manager and EKS
    /// tokens stay lazy. A failure is only logged: the first event meets it
    /// again and reports it.
    pub async fn prewarm(&self) {
        if matches!(self.access, ClusterAccess::Ambient)
            && let Err(e) = self.kube().await
        {
            tracing::warn!(error = %e, "the Kubernetes client could not be built yet");
        }
    }

    /// A Kubernetes client; EKS clients are rebuilt before their token expires.
    pub async fn kube(&self) -> Result<kube::Client, ConnectError> {
        let mut cached = self.kube.lock().await;
        if let Some((made, client)) = cached.as_ref() {
            let expires = matches!(
                self.access,
                ClusterAccess::Eks { .. } | ClusterAccess::Gke { .. }
            );
            if !expires || made.elapsed() < eks_token::REFRESH_AFTER {
                return Ok(client.clone());
            }
        }
        let client = self.build_kube().await?;
        *cached = Some((Instant::now(), client.clone()));
        Ok(client)
    }

    /// The webhook token, read from its store once.
    pub async fn webhook_token(&self) -> Result<Option<WebhookToken>, ConnectError> {
        self.token
            .get_or_try_init(|| async {
                let Some(source) = &self.token_source else {
                    return Ok(None);
                };
                let (raw, from) = match source {
                    TokenSource::Inline(t) => (t.clone(), "WEBHOOK_TOKEN".to_owned()),
                    TokenSource::Parameter(p) => {
                        (self.parameter(p).await?, format!("SSM parameter {p}"))
                    }
                    TokenSource::Secret(s) => (self.secret(s).await?, format!("secret {s}")),
                };
                WebhookToken::new(&raw)
                    .map(Some)
                    .map_err(|_| ConnectError::WeakToken(from))
            })
            .await
            .cloned()
    }

    async fn build_kube(&self) -> Result<kube::Client, ConnectError> {
        let config = match &self.access {
            ClusterAccess::Ambient => kube::Config::infer()
                .await
                .map_err(|e| ConnectError::InferConfig(e.to_string()))?,
            ClusterAccess::KubeconfigParameter(name) => {
                let yaml = self.parameter(name).await?;
                from_kubeconfig(&yaml, &format!("SSM parameter {name}")).await?
            }
            ClusterAccess::KubeconfigSecret(id) => {
                let yaml = self.secret(id).await?;
                from_kubeconfig(&yaml, &format!("secret {id}")).await?
            }
            ClusterAccess::Eks { name, endpoint } => {
                let (server, ca) = match endpoint {
                    Some(pair) => pair.clone(),
                    None => self.describe_cluster(name).await?,
                };
                let token = self.eks_token(name).await?;
                with_token(&server, &ca, &token, &format!("EKS cluster {name}")).await?
            }
            ClusterAccess::Gke {
                cluster,
                endpoint,
                ca,
            } => {
                let token = google_token().await?;
                with_token(endpoint, ca, &token, &format!("GKE cluster {cluster}")).await?
            }
        };
        kube_client(config).map_err(ConnectError::Client)
    }

    async fn eks_token(&self, cluster: &str) -> Result<String, ConnectError> {
        let region = self
            .sdk
            .region()
            .ok_or_else(|| ConnectError::Credentials("no AWS region configured".into()))?
            .to_string();
        let provider = self
            .sdk
            .credentials_provider()
            .ok_or_else(|| ConnectError::Credentials("no credentials provider".into()))?;
        let creds = provider
            .provide_credentials()
            .await
            .map_err(|e| ConnectError::Credentials(e.to_string()))?;
        eks_token::presign(cluster, &region, creds, std::time::SystemTime::now())
            .map_err(|e| ConnectError::Credentials(e.to_string()))
    }

    async fn describe_cluster(&self, name: &str) -> Result<(String, String), ConnectError> {
        let fail = |message: String| ConnectError::DescribeCluster {
            name: name.into(),
            message,
        };
        let out = aws_sdk_eks::Client::new(&self.sdk)
            .describe_cluster()
            .name(name)
            .send()
            .await
            .map_err(|e| fail(aws_sdk_eks::error::DisplayErrorContext(&e).to_string()))?;
        let cluster = out
            .cluster()
            .ok_or_else(|| fail("no cluster in the answer".into()))?;
        let endpoint = cluster
            .endpoint()
            .ok_or_else(|| fail("the cluster has no endpoint yet".into()))?;
        let ca = cluster
            .certificate_authority()
            .and_then(|c| c.data())
            .ok_or_else(|| fail("the cluster has no certificate authority".into()))?;
        Ok((endpoint.to_owned(), ca.to_owned()))
    }

    async fn parameter(&self, name: &str) -> Result<String, ConnectError> {
        let fail = |message: String| ConnectError::GetParameter {
            name: name.into(),
            message,
        };
        let out = aws_sdk_ssm::Client::new(&self.sdk)
            .get_parameter()
            .name(name)
            .with_decryption(true)
            .send()
            .await
            .map_err(|e| fail(aws_sdk_ssm::error::DisplayErrorContext(&e).to_string()))?;
        out.parameter()
            .and_then(|p| p.value())
            .map(str::to_owned)
            .ok_or_else(|| fail("the parameter has no value".into()))
    }

    async fn secret(&self, id: &str) -> Result<String, ConnectError> {
        let fail = |message: String| ConnectError::GetSecretValue {
            id: id.into(),
            message,
        };
        let out = aws_sdk_secretsmanager::Client::new(&self.sdk)
            .get_secret_value()
            .secret_id(id)
            .send()
            .await
            .map_err(|e| {
                fail(aws_sdk_secretsmanager::error::DisplayErrorContext(&e).to_string())
            })?;
        out.secret_string()
            .map(str::to_owned)
            .ok_or_else(|| fail("the secret has no string value".into()))
    }
}

async fn from_kubeconfig(yaml: &str, source_name: &str) -> Result<kube::Config, ConnectError> {
    let bad = |message: String| ConnectError::Kubeconfig {
        source_name: source_name.into(),
        message,
    };
    let kc = Kubeconfig::from_yaml(yaml).map_err(|e| bad(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| bad(e.to_string()))
}

/// A Kubernetes configuration for `server` that presents `token`.
async fn with_token(
    server: &str,
    ca: &str,
    token: &str,
    source_name: &str,
) -> Result<kube::Config, ConnectError> {
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "cluster",
        "clusters": [{"name": "cluster", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "node-fencer", "user": {"token": token}}],
        "contexts": [{"name": "cluster", "context": {"cluster": "cluster", "user": "node-fencer"}}]
    });
    let unusable = |e: String| ConnectError::Kubeconfig {
        source_name: source_name.to_owned(),
        message: e,
    };
    let kc: Kubeconfig = serde_json::from_value(kubeconfig).map_err(|e| unusable(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| unusable(e.to_string()))
}

/// The service account's Google access token, from Application Default
/// Credentials (on Cloud Run, the metadata server; workload identity
/// federation too). GKE maps it to the account's e-mail, which RBAC binds.
#[cfg(feature = "google-cloud")]
async fn google_token() -> Result<String, ConnectError> {
    let credentials = google_cloud_auth::credentials::Builder::default()
        .with_scopes(["https://www.googleapis.com/auth/cloud-platform"])
        .build_access_token_credentials()
        .map_err(|e| ConnectError::GoogleCredentials(e.to_string()))?;
    credentials
        .access_token()
        .await
        .map(|t| t.token)
        .map_err(|e| ConnectError::GoogleCredentials(e.to_string()))
}

/// Without the Google Cloud client, there is no Google token to present.
#[cfg(not(feature = "google-cloud"))]
async fn google_token() -> Result<String, ConnectError> {
    Err(ConnectError::GoogleCredentials(
        "GKE_CLUSTER needs a build with the `google-cloud` feature (the Cloud Run image)".into(),
    ))
}

//! Publishing the notifications: SNS on AWS, Pub/Sub on Google Cloud. A
//! failure is logged and counted, and never fails the invocation: the
//! fencing is done by then, and telling it is secondary.

use std::time::{Duration, Instant};

use aws_config::SdkConfig;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_sns::types::MessageAttributeValue;
use tracing::{info, warn};

use crate::core::outbound::metrics::{Dependency, Meter};
use crate::core::outbound::notice::Notice;
use crate::core::rules::retry::NOTIFY;
use crate::core::settings::notify::{Notify, Topic};
#[cfg(feature = "google-cloud")]
use crate::shell::retrying::retrying;

const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the messages go.
pub enum Notifier {
    /// An SNS topic.
    Sns {
        /// The client, with [`NOTIFY`]'s bounds.
        client: aws_sdk_sns::Client,
        /// The topic's ARN.
        arn: String,
    },
    /// A Pub/Sub topic, over its REST API.
    #[cfg(feature = "google-cloud")]
    PubSub(PubSub),
}

impl Notifier {
    /// A publisher to the configured topic; makes no call. A Pub/Sub topic
    /// in a build without the `google-cloud` feature is an error.
    pub fn new(sdk: &SdkConfig, notify: &Notify) -> Result<Self, String> {
        match &notify.topic {
            Topic::Sns { arn } => {
                let mut config = aws_sdk_sns::config::Builder::from(sdk);
                // A topic of another region (a central alerts topic) is
                // published to in its own region.
                if let Some(region) = notify.topic.sns_region() {
                    config = config.region(aws_config::Region::new(region.to_owned()));
                }
                let config = config
                    .retry_config(
                        RetryConfig::standard()
                            .with_max_attempts(NOTIFY.max_attempts)
                            .with_initial_backoff(NOTIFY.base)
                            .with_max_backoff(NOTIFY.cap),
                    )
                    .timeout_config(
                        TimeoutConfig::builder()
                            .operation_attempt_timeout(ATTEMPT_TIMEOUT)
                            .operation_timeout(NOTIFY.budget)
                            .build(),
                    )
                    .build();
                Ok(Self::Sns {
                    client: aws_sdk_sns::Client::from_conf(config),
                    arn: arn.clone(),
                })
            }
            #[cfg(feature = "google-cloud")]
            Topic::PubSub { name } => {
                PubSub::new(name, notify.pubsub_endpoint.as_deref()).map(Self::PubSub)
            }
            #[cfg(not(feature = "google-cloud"))]
            Topic::PubSub { name } => Err(format!(
                "NOTIFY_TOPIC={name} is a Pub/Sub topic: it needs a build with the `google-cloud` feature (the Cloud Run image)"
            )),
        }
    }

    /// Publishes every message, one call each; a failure is logged and
    /// counted under the topic's dependency, and the rest still go. All of
    /// them share one time budget ([`NOTIFY`]'s), so a topic that does not
    /// answer costs the invocation that much once, not once per message:
    /// what is left when it is spent is counted as failed, unsent, under
    /// `dependency` (the topic's). The budget ends at `until` (the
    /// request's end, less the answer's reserve) when that comes first.
    pub async fn tell(
        &self,
        notices: &[Notice],
        meter: &Meter,
        dependency: Dependency,
        until: Option<tokio::time::Instant>,
    ) {
        let began = Instant::now();
        let budget = until.map_or(NOTIFY.budget, |until| {
            NOTIFY
                .budget
                .min(until.saturating_duration_since(tokio::time::Instant::now()))
        });
        for notice in notices {
            let started = Instant::now();
            let left = budget.saturating_sub(began.elapsed());
            let published = match tokio::time::timeout(left, self.publish(notice)).await {
                Ok(published) => published,
                Err(_) => Err(format!(
                    "the notifications' {} s were spent",
                    budget.as_secs()
                )),
            };
            match published {
                Ok(id) => info!(
                    kind = notice.kind.code(),
                    node = %notice.node,
                    message_id = %id,
                    took_ms = started.elapsed().as_millis(),
                    "notification published"
                ),
                Err(error) => {
                    meter.error(dependency);
                    warn!(kind = notice.kind.code(), node = %notice.node, %error, "notification not published");
                }
            }
        }
    }

    /// Publishes one message; its id, or why not.
    async fn publish(&self, notice: &Notice) -> Result<String, String> {
        match self {
            Self::Sns { client, arn } => {
                let mut call = client
                    .publish()
                    .topic_arn(arn)
                    .subject(notice.subject())
                    .message(notice.body());
                for (name, value) in notice.attributes() {
                    let value = MessageAttributeValue::builder()
                        .data_type("String")
                        .string_value(value)
                        .build()
                        .map_err(|e| e.to_string())?;
                    call = call.message_attributes(name, value);
                }
                let out = call.send().await.map_err(|e| {
                    format!(
                        "sns:Publish to {arn}: {}",
                        aws_sdk_sns::error::DisplayErrorContext(&e)
                    )
                })?;
                Ok(out.message_id.unwrap_or_default())
            }
            #[cfg(feature = "google-cloud")]
            Self::PubSub(p) => p.publish(notice).await,
        }
    }
}

/// A failed publish, and whether another attempt may succeed.
#[cfg(feature = "google-cloud")]
struct Failure {
    message: String,
    transient: bool,
}

/// A Pub/Sub topic's `publish` method, with Application Default Credentials
/// (none for a plain-http stand-in).
#[cfg(feature = "google-cloud")]
pub struct PubSub {
    url: String,
    /// `None` for a stand-in; the credentials keep their token until it
    /// nears expiry.
    credentials: Option<google_cloud_auth::credentials::AccessTokenCredentials>,
    http: reqwest::Client,
}

#[cfg(feature = "google-cloud")]
impl PubSub {
    const GOOGLE: &'static str = "https://pubsub.googleapis.com";

    fn new(topic: &str, endpoint: Option<&str>) -> Result<Self, String> {
        let base = endpoint.unwrap_or(Self::GOOGLE).trim_end_matches('/');
        // The project's one crypto stack, as `serve` installs it; the
        // command line of an image reaches here without it.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .user_agent(concat!("node-fencer/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(crate::shell::timeouts::Timeouts::default().connect)
            .timeout(ATTEMPT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("building the Pub/Sub client: {e}"))?;
        let credentials = if base.starts_with("http://") {
            None
        } else {
            let built = google_cloud_auth::credentials::Builder::default()
                .with_scopes(["https://www.googleapis.com/auth/pubsub"])
                .build_access_token_credentials()
                .map_err(|e| format!("Google credentials for Pub/Sub: {e}"))?;
            Some(built)
        };
        Ok(Self {
            url: format!("{base}/v1/{topic}:publish"),
            credentials,
            http,
        })
    }

    async fn publish(&self, notice: &Notice) -> Result<String, String> {
        use base64::Engine as _;
        let attributes: serde_json::Map<String, serde_json::Value> = notice
            .attributes()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), serde_json::Value::String(v)))
            .collect();
        let body = serde_json::json!({"messages": [{
            "data": base64::engine::general_purpose::STANDARD.encode(notice.body()),
            "attributes": attributes,
        }]});
        let token = match &self.credentials {
            None => None,
            Some(c) => Some(
                c.access_token()
                    .await
                    .map_err(|e| format!("a Google access token for Pub/Sub: {e}"))?
                    .token,
            ),
        };
        let (body, token) = (&body, &token);
        let attempt = move || async move {
            let mut request = self.http.post(&self.url).json(body);
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            match request.send().await {
                Ok(answer) if answer.status().is_success() => {
                    let answer: serde_json::Value = answer.json().await.map_err(|e| Failure {
                        message: format!("Pub/Sub's answer: {e}"),
                        transient: false,
                    })?;
                    Ok(answer["messageIds"][0]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned())
                }
                Ok(answer) => {
                    let status = answer.status().as_u16();
                    let text = answer.text().await.unwrap_or_default();
                    let text: String = text.chars().take(300).collect();
                    Err(Failure {
                        message: format!("{status}: {text}"),
                        transient: crate::core::rules::retry::is_transient_status(status),
                    })
                }
                Err(e) => Err(Failure {
                    message: e.to_string(),
                    transient: true,
                }),
            }
        };
        retrying(&NOTIFY, attempt, |f: &Failure| f.transient, |_, _, _| {})
            .await
            .map_err(|f| format!("Pub/Sub publish to {}: {}", self.url, f.message))
    }
}

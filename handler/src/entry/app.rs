//! One invocation end to end: classify the event, authenticate HTTP requests,
//! run the pipeline, and shape the answer (a report, or a Function URL
//! response). Shared by the Lambda entry point and the command line.

use std::sync::{Arc, Mutex};

use lambda_runtime::Diagnostic;
use serde_json::{Value, json};
use tokio::sync::OnceCell;
use tracing::{error, warn};

use crate::core::inbound::suspect::Batch;
use crate::core::inbound::trigger::{self, InputError, Trigger, function_url, webhook};
use crate::core::outbound::log_metrics;
use crate::core::outbound::metrics::{self, Dependency, Meter};
use crate::core::outbound::notice;
use crate::core::outbound::prometheus::Registry;
use crate::core::outbound::report::Report;
use crate::core::rules::mode::ServerVersion;
use crate::core::rules::retry::NOTIFY;
use crate::core::settings::config::Config;
use crate::core::settings::policy::Policy;
use crate::entry::preflight::{self, Preflight};
use crate::pipeline::invocation::ANSWER_RESERVE;
use crate::pipeline::{self, Ctx, PipelineError};
use crate::shell::cloud::Clouds;
use crate::shell::cloud::aws::Ec2;
use crate::shell::cluster::Kube;
use crate::shell::connect::{Clients, ConnectError};
use crate::shell::notify::Notifier;
use crate::shell::onprem::OnPrem;

/// One call as it is run: its id (the logs', the report's, the Lease
/// holder's), whether as a plan only (the command line's `--dry-run`),
/// and when its caller stops waiting for the answer (Lambda's deadline).
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// The correlation id.
    pub id: &'a str,
    /// Every action a plan only, whatever `DRY_RUN` says.
    pub dry_run: bool,
    /// The caller's deadline: no wait outlasts it, and the detaches that
    /// would not finish before it are left to the retry.
    pub deadline: Option<tokio::time::Instant>,
}

impl<'a> Call<'a> {
    /// A call with this id, acting, with no deadline of its own.
    pub fn new(id: &'a str) -> Self {
        Self {
            id,
            dry_run: false,
            deadline: None,
        }
    }

    /// The same call as a plan only when `dry_run`.
    pub fn plan_only(self, dry_run: bool) -> Self {
        Self { dry_run, ..self }
    }

    /// The same call, its caller waiting until `deadline`.
    pub fn until(self, deadline: Option<tokio::time::Instant>) -> Self {
        Self { deadline, ..self }
    }
}

/// Why an invocation failed.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// The event was refused; nothing was changed. Not worth retrying.
    #[error("invalid input: {0}")]
    Input(#[from] InputError),
    /// A dependency could not be reached or authenticated to. Retryable.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The pipeline could not start: the node list unreadable (retryable),
    /// or the cluster older than any node-fencer supports (not); or it was
    /// cut at the request's end (retryable).
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// Some work is left undone; the report says what. Retryable.
    #[error("work left undone: {summary}")]
    Incomplete {
        /// The full report.
        report: Box<Report>,
        /// One line per node that is not done.
        summary: String,
    },
}

impl HandlerError {
    /// A stable name for the error kind (the Lambda error type).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Input(_) => "InvalidInput",
            Self::Connect(_) => "DependencyUnavailable",
            Self::Pipeline(PipelineError::Unsupported(_)) => "UnsupportedCluster",
            Self::Pipeline(PipelineError::OutOfTime { .. }) => "OutOfTime",
            Self::Pipeline(_) => "ClusterUnavailable",
            Self::Incomplete { .. } => "Incomplete",
        }
    }

    /// True when retrying the same event may succeed.
    pub fn retryable(&self) -> bool {
        !matches!(
            self,
            Self::Input(_) | Self::Pipeline(PipelineError::Unsupported(_))
        )
    }
}

impl From<HandlerError> for Diagnostic {
    fn from(e: HandlerError) -> Self {
        Diagnostic {
            error_type: format!("NodeFencer.{}", e.kind()),
            error_message: e.to_string(),
        }
    }
}

/// The long-lived state of one execution environment.
pub struct App {
    pub(super) clients: Clients,
    config: Config,
    pub(super) reporter: String,
    metrics: Option<MetricLines>,
    /// What `/metrics` serves, counted over every run of the process.
    prometheus: Option<Arc<Mutex<Registry>>>,
    /// The API server's version, asked once per execution environment.
    pub(super) server_version: Arc<OnceCell<ServerVersion>>,
    /// Where each fencing, refusal, power-off and recovery is told; an
    /// error when `NOTIFY_TOPIC` names a topic this build cannot reach.
    notifier: Option<Result<Notifier, String>>,
    /// The on-premises machines, when `REDFISH_INVENTORY` names them.
    pub(super) onprem: Option<OnPrem>,
}

impl App {
    /// Builds the application; makes no network call.
    pub fn new(clients: Clients, config: Config, reporter: impl Into<String>) -> Self {
        let notifier = config.notify.as_ref().map(|n| {
            Notifier::new(&clients.sdk, n)
                .inspect_err(|e| error!(error = %e, "notifications cannot be sent"))
        });
        Self {
            clients,
            config,
            reporter: reporter.into(),
            metrics: None,
            prometheus: None,
            server_version: Arc::default(),
            notifier,
            onprem: None,
        }
    }

    /// Also writes the CloudWatch metrics of every run to stdout, as
    /// Embedded Metric Format lines named after the reporter (in Lambda:
    /// the function's name).
    pub fn with_metrics(mut self) -> Self {
        self.metrics = Some(MetricLines::Emf);
        self
    }

    /// Also writes the metrics of every run to stdout as Cloud Logging
    /// entries, which the log-based metrics count (on Cloud Run: the
    /// reporter is the service's name).
    pub fn with_log_metrics(mut self) -> Self {
        self.metrics = Some(MetricLines::CloudLogging);
        self
    }

    /// Also counts every run for Prometheus ([`Self::prometheus`]).
    pub fn with_prometheus(mut self) -> Self {
        self.prometheus = Some(Arc::default());
        self
    }

    /// What `/metrics` serves, when [`Self::with_prometheus`] asked for it.
    pub fn prometheus(&self) -> Option<&Mutex<Registry>> {
        self.prometheus.as_deref()
    }

    /// Reads the on-premises inventory and builds its BMCs' clients, when
    /// `REDFISH_INVENTORY` is set: a start with an inventory that cannot be
    /// read fails with the reason.
    pub fn with_onprem(mut self) -> Result<Self, String> {
        if let Some(files) = &self.config.redfish {
            self.onprem = Some(OnPrem::load(files)?);
        }
        Ok(self)
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Handles any inbound document.
    ///
    /// Function URL requests always get an HTTP response (401/4xx for refused
    /// requests, 500 when work is left undone so Alertmanager retries); every
    /// other shape gets the report, or an error when work is left undone.
    /// A call that is a plan only (the command line's `--dry-run
    /// handle`) writes nothing, whatever the document's shape.
    pub async fn handle(&self, event: Value, call: Call<'_>) -> Result<Reply, HandlerError> {
        match trigger::classify(event)? {
            Trigger::Batch(batch) => {
                let report = self.run(batch, call).await?;
                finish(report).map(|r| Reply::Report(Box::new(r)))
            }
            Trigger::Http(req) => Ok(Reply::Http(self.handle_http(&req, call).await)),
            Trigger::Preflight => Ok(Reply::Preflight(self.preflight().await)),
        }
    }

    /// Checks the deployment's access and settings; changes nothing.
    pub async fn preflight(&self) -> Preflight {
        preflight::run(&self.clients, &self.config, self.onprem.as_ref()).await
    }

    /// Answers a Function URL request: the neutral webhook entry
    /// ([`Self::admit_webhook`], [`Self::run_webhook`]) in the Lambda's
    /// envelope, its method and headers checked before its body is decoded.
    pub(crate) async fn handle_http(
        &self,
        req: &aws_lambda_events::event::lambda_function_urls::LambdaFunctionUrlRequest,
        call: Call<'_>,
    ) -> Value {
        let reply = match self.admitted(req, call.id).await {
            Ok(body) => self.run_webhook(&body, call).await,
            Err(refused) => refused,
        };
        serde_json::to_value(function_url::reply(&reply)).unwrap_or(Value::Null)
    }

    async fn admitted<'r>(
        &self,
        req: &'r aws_lambda_events::event::lambda_function_urls::LambdaFunctionUrlRequest,
        correlation_id: &str,
    ) -> Result<std::borrow::Cow<'r, [u8]>, webhook::Reply> {
        function_url::method(req).map_err(|r| refused(r, correlation_id))?;
        self.admit_webhook(&req.headers, correlation_id).await?;
        function_url::body(req).map_err(|r| refused(r, correlation_id))
    }

    /// Lets a webhook request in by its headers alone (the bearer token,
    /// the content type), before any of its body is read; or the answer
    /// that refuses it.
    pub(crate) async fn admit_webhook(
        &self,
        headers: &http::HeaderMap,
        correlation_id: &str,
    ) -> Result<(), webhook::Reply> {
        let token = self.webhook_token(correlation_id).await?;
        webhook::admit(headers, token.as_ref()).map_err(|r| refused(r, correlation_id))
    }

    /// Runs the body of an admitted webhook request: the payload, the run,
    /// the status (500 when work is left undone, so Alertmanager retries).
    pub(crate) async fn run_webhook(&self, body: &[u8], call: Call<'_>) -> webhook::Reply {
        let correlation_id = call.id;
        let batch = match webhook::parse(body) {
            Ok(batch) => batch,
            Err(rejection) => return refused(rejection, correlation_id),
        };
        match self.run(batch, call).await {
            Ok(report) => webhook::Reply {
                status: if report.incomplete() { 500 } else { 200 },
                body: serde_json::to_value(&report).unwrap_or(Value::Null),
            },
            Err(e) => {
                error!(error = %e, "invocation failed");
                webhook::Reply {
                    status: 503,
                    body: json!({"error": e.to_string(), "correlation_id": correlation_id}),
                }
            }
        }
    }

    /// The webhook token, read from its store once; 503 when the store
    /// cannot be read.
    async fn webhook_token(
        &self,
        correlation_id: &str,
    ) -> Result<Option<webhook::WebhookToken>, webhook::Reply> {
        self.clients.webhook_token().await.map_err(|e| {
            error!(error = %e, "webhook token unavailable");
            webhook::Reply {
                status: 503,
                body: json!({"error": "the webhook token store is unavailable", "correlation_id": correlation_id}),
            }
        })
    }

    /// Runs the pipeline over a parsed batch.
    pub async fn run(&self, batch: Batch, call: Call<'_>) -> Result<Report, HandlerError> {
        let correlation_id = call.id;
        let sweep = batch.sweep;
        let meter = Meter::default();
        let mut result = self.run_metered(batch, call, &meter).await;
        // A sweep ends with the witness round over every Node's machine,
        // after its own work, so that it never delays a fencing; a plan or
        // a dry run tells nothing and keeps nothing.
        // The round ends early enough to leave the notifications their
        // budget before the request's end.
        if sweep && let Ok(report) = &mut result {
            let record = !(call.dry_run || report.dry_run);
            let before = call.deadline.map(|d| {
                d.checked_sub(NOTIFY.budget)
                    .unwrap_or_else(tokio::time::Instant::now)
            });
            let witness = self.sweep_witness(correlation_id, record, before);
            report.witness = Some(witness.await);
        }
        // One clock reading for the messages and the metrics of the run.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        // A plan asked for at a terminal is read there; a deployment's dry
        // run (DRY_RUN, the kill switch) is told, marked as changing nothing.
        if let (Ok(report), false) = (&result, call.dry_run) {
            let now_secs = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
            let until = call.deadline.map(|d| {
                d.checked_sub(ANSWER_RESERVE)
                    .unwrap_or_else(tokio::time::Instant::now)
            });
            self.tell(report, &meter, (now_secs, until)).await;
        }
        // Read once, after the notifications counted their failures.
        let (report, measured) = (result.as_ref().ok(), &meter.measured());
        if let Some(registry) = self.prometheus()
            && let Ok(mut registry) = registry.lock()
        {
            registry.record_run(report, measured);
        }
        if let Some(format) = self.metrics {
            let now_ms = u64::try_from(now.as_millis()).unwrap_or(u64::MAX);
            let lines = match format {
                MetricLines::Emf => {
                    metrics::emf_lines(&self.reporter, correlation_id, report, measured, now_ms)
                }
                MetricLines::CloudLogging => {
                    log_metrics::log_lines(&self.reporter, correlation_id, report, measured)
                }
            };
            // CloudWatch Logs and Cloud Logging read one document per line.
            for line in lines {
                println!("{line}");
            }
        }
        result
    }

    /// Publishes the report's notifications, if any are configured;
    /// `now_secs` is the Unix time written in them.
    async fn tell(
        &self,
        report: &Report,
        meter: &Meter,
        (now_secs, until): (i64, Option<tokio::time::Instant>),
    ) {
        let (Some(notifier), Some(notify)) = (&self.notifier, &self.config.notify) else {
            return;
        };
        let notices = notice::notices(report, notify.cluster.as_deref(), now_secs);
        let dependency = notify.topic.dependency();
        match notifier {
            Ok(notifier) => notifier.tell(&notices, meter, dependency, until).await,
            Err(e) if !notices.is_empty() => {
                meter.error(dependency);
                error!(error = %e, count = notices.len(), "notifications not sent");
            }
            Err(_) => {}
        }
    }

    async fn run_metered(
        &self,
        batch: Batch,
        call: Call<'_>,
        meter: &Meter,
    ) -> Result<Report, HandlerError> {
        let client = self
            .clients
            .kube()
            .await
            .inspect_err(|_| meter.error(Dependency::Kubernetes))?;
        let cluster = Kube::new(client, self.reporter.clone())
            .sharing_version(self.server_version.clone())
            .placing(self.onprem.as_ref().map(|o| o.inventory.clone()));
        let ec2 = Ec2::new(self.clients.ec2.clone());
        #[cfg(feature = "google-cloud")]
        let gce = self
            .clients
            .gce()
            .await
            .map(|c| c as &dyn crate::shell::cloud::Cloud);
        #[cfg(not(feature = "google-cloud"))]
        let gce = None;
        #[cfg(feature = "redfish")]
        let redfish = self.onprem.as_ref().map(|o| {
            // Read at the first round: a restart forgets no UUID.
            o.bmcs.census_kept_in(self.census_store(&cluster));
            &o.bmcs as &dyn crate::shell::cloud::Cloud
        });
        #[cfg(not(feature = "redfish"))]
        let redfish = None;
        let cloud = Clouds {
            aws: &ec2,
            gce,
            redfish,
        };
        let ctx = Ctx::new(&cloud, &cluster, meter, call.id);
        let policy = Policy {
            dry_run: self.config.policy.dry_run || call.dry_run,
            ..self.config.policy.clone()
        };
        Ok(pipeline::run_until(&ctx, &policy, batch, call.deadline).await?)
    }
}

/// How the metrics of a run are written to stdout.
#[derive(Clone, Copy, Debug)]
enum MetricLines {
    /// CloudWatch's Embedded Metric Format (Lambda).
    Emf,
    /// Cloud Logging entries for log-based metrics (Cloud Run).
    CloudLogging,
}

/// What an invocation answers.
#[derive(Debug)]
pub enum Reply {
    /// The report (EventBridge, direct invocations, the command line);
    /// boxed, being the largest by far.
    Report(Box<Report>),
    /// A Function URL response, already shaped.
    Http(Value),
    /// The preflight checks.
    Preflight(Preflight),
}

impl Reply {
    /// The JSON the Lambda runtime returns.
    pub fn into_value(self) -> Value {
        match self {
            Self::Report(report) => serde_json::to_value(&report).unwrap_or(Value::Null),
            Self::Http(value) => value,
            Self::Preflight(p) => serde_json::to_value(&p).unwrap_or(Value::Null),
        }
    }
}

/// The answer to a refused webhook request, logged.
fn refused(rejection: webhook::Rejection, correlation_id: &str) -> webhook::Reply {
    warn!(status = rejection.status, reason = %rejection.message, "request refused");
    webhook::Reply {
        status: rejection.status,
        body: json!({"error": rejection.message, "correlation_id": correlation_id}),
    }
}

/// Turns a report into the invocation's result: an error when work is left.
pub fn finish(report: Report) -> Result<Report, HandlerError> {
    if report.incomplete() {
        let fencing = report
            .results
            .iter()
            .filter(|r| r.leaves_work())
            .map(|r| format!("{}: {}", r.node.as_deref().unwrap_or(&r.target), r.reason));
        let recovering = report
            .recoveries
            .iter()
            .filter(|r| r.leaves_work())
            .map(|r| format!("{}: recovery: {}", r.node, r.reason));
        let summary = fencing
            .chain(recovering)
            .chain(report.errors.iter().cloned())
            .collect::<Vec<_>>()
            .join("; ");
        return Err(HandlerError::Incomplete {
            report: Box::new(report),
            summary,
        });
    }
    Ok(report)
}

//! The Lambda entry point: configuration validated and clients built once per
//! execution environment, then one [`App::handle`] per event.

use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;
use tracing::{Instrument, info_span};

use crate::core::settings::config::{Config, LogFormat};
use crate::entry::app::{App, HandlerError, Reply};
use crate::entry::telemetry;
use crate::shell::connect::{Clients, sdk_config};

/// Serves events until the runtime stops the process.
pub async fn serve() -> Result<(), lambda_runtime::Error> {
    let config = Config::from_env()?;
    telemetry::init(config.log_format.unwrap_or(LogFormat::Json), false);
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let reporter =
        std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| "node-fencer".into());
    let clients = Clients::new(sdk_config().await, &config);
    clients.prewarm().await;
    let app = App::new(clients, config, reporter).with_metrics();
    let app = &app;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        let correlation_id = if event.context.request_id.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            event.context.request_id.clone()
        };
        let span = info_span!("invocation", correlation_id = %correlation_id);
        let result: Result<Value, HandlerError> = app
            .handle(event.payload, &correlation_id)
            .instrument(span.clone())
            .await
            .map(Reply::into_value);
        if let Err(e) = &result {
            span.in_scope(|| tracing::error!(kind = e.kind(), retryable = e.retryable(), error = %e, "invocation failed"));
        }
        result
    }))
    .await
}

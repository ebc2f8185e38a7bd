//! The HTTP entry point for Cloud Run (`node-fencer serve`): Pub/Sub push
//! requests of Cloud Audit Log entries on `/pubsub`, Eventarc CloudEvents on
//! `/eventarc`, the scheduled sweep on `/sweep` (Cloud Scheduler, with the
//! same OIDC token), Alertmanager webhooks on `/alertmanager`, all into the
//! same pipeline as the Lambda function. Every request is worked to its end
//! before it is answered: Cloud Run gives a service CPU only while it
//! answers. A request that leaves work undone gets a 5xx, so Pub/Sub
//! delivers it again and its dead-letter topic keeps what never succeeds.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::rc::Rc;

use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tracing::{Instrument, error, info, info_span, warn};

use crate::core::config::{Config, LogFormat};
use crate::core::oidc::Expected;
use crate::core::suspect::Batch;
use crate::core::trigger::{self, Auth, Body, InputError, Trigger, webhook};
use crate::entry::app::{App, HandlerError};
use crate::entry::telemetry;
use crate::shell::connect::{Clients, sdk_config};
use crate::shell::oidc::PushVerifier;

/// Pub/Sub pushes messages of up to 10 MB, base64 in JSON.
const MAX_BODY: usize = 14 * 1024 * 1024;

/// What every request needs: the application and the push token verifier.
struct Server {
    app: App,
    push: Option<PushVerifier>,
}

/// Serves on `port` until the process is stopped.
pub async fn serve(port: u16) -> Result<(), String> {
    // The Google clients' TLS has no crypto provider of its own: the one
    // stack of the project (rustls on ring) is the process default.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = Config::from_env().map_err(|e| format!("configuration: {e}"))?;
    telemetry::init(config.log_format.unwrap_or(LogFormat::Json), false);
    for warning in config.warnings() {
        warn!("{warning}");
    }
    let push = match &config.push_auth {
        None => {
            warn!(
                "PUSH_AUDIENCE and PUSH_SERVICE_ACCOUNT are not set: /pubsub and /eventarc refuse every request"
            );
            None
        }
        Some(auth) => {
            let expected = Expected::new(&auth.audience, &auth.service_account)
                .map_err(|e| format!("configuration: {e}"))?;
            let verifier = match &auth.certs_url {
                None => PushVerifier::new(expected),
                Some(url) => PushVerifier::with_certs_url(expected, url),
            };
            Some(verifier.map_err(|e| format!("configuration: PUSH_CERTS_URL: {e}"))?)
        }
    };
    let reporter = std::env::var("K_SERVICE").unwrap_or_else(|_| "node-fencer".into());
    let clients = Clients::new(sdk_config().await, &config);
    clients.prewarm().await;
    let server = Rc::new(Server {
        app: App::new(clients, config, reporter),
        push,
    });
    let addr = SocketAddr::from(([0, 0, 0, 0], port));
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    info!(%addr, "serving /pubsub, /eventarc, /sweep, /alertmanager");
    // The pipeline's futures hold the clients across awaits and are not
    // Send: connections run as local tasks on this one thread, which is
    // all a Cloud Run instance with its few requests at a time needs.
    let local = tokio::task::LocalSet::new();
    local.run_until(accept(listener, server)).await
}

/// Takes connections until the process is stopped.
async fn accept(listener: TcpListener, server: Rc<Server>) -> Result<(), String> {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                warn!(error = %e, "accept failed");
                continue;
            }
        };
        let server = server.clone();
        tokio::task::spawn_local(async move {
            let service = service_fn(move |req| {
                let server = server.clone();
                async move { Ok::<_, Infallible>(server.answer(req).await) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                warn!(error = %e, "connection ended with an error");
            }
        });
    }
}

impl Server {
    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let correlation_id = uuid::Uuid::new_v4().to_string();
        let span =
            info_span!("request", correlation_id = %correlation_id, path = %req.uri().path());
        self.route(req, &correlation_id).instrument(span).await
    }

    async fn route(&self, req: Request<Incoming>, correlation_id: &str) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().to_owned();
        if parts.method == Method::GET && path == "/healthz" {
            return reply(StatusCode::OK, &json!({"status": "ok"}));
        }
        let Some((source, route)) = trigger::routed(&path) else {
            return reply(StatusCode::NOT_FOUND, &json!({"error": "no such route"}));
        };
        if parts.method != Method::POST {
            return reply(
                StatusCode::METHOD_NOT_ALLOWED,
                &json!({"error": "only POST is accepted"}),
            );
        }
        // Authenticate before the body is read.
        if route.auth == Auth::GoogleOidc
            && let Err(refused) = self.authenticate(&parts.headers, &path).await
        {
            return refused;
        }
        let bytes = match route.body {
            Body::Ignored => Bytes::new(),
            Body::Json { .. } => match Limited::new(body, MAX_BODY).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    return reply(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        &json!({"error": format!("the body could not be read: {e}")}),
                    );
                }
            },
        };
        if route.auth == Auth::WebhookToken {
            if let Err(refused) = self.app.admit_webhook(&parts.headers, correlation_id).await {
                return webhook_reply(&refused);
            }
            return webhook_reply(&self.app.run_webhook(&bytes, correlation_id).await);
        }
        let document = match route.body {
            Body::Ignored => Ok(Value::Null),
            Body::Json { .. } => json_body(&bytes),
        };
        let batch = document
            .and_then(|d| (source.parse)(d, &parts.headers))
            .and_then(|t| match t {
                Trigger::Batch(batch) => Ok(batch),
                _ => Err(InputError::invalid(source.name, "not a batch of suspects")),
            });
        self.run_batch(batch, correlation_id).await
    }

    /// Lets in a request bearing a Google-signed OIDC token for this
    /// service (`PUSH_AUDIENCE`, or the URL the request came to); anything
    /// else is answered here.
    async fn authenticate(
        &self,
        headers: &HeaderMap,
        path: &str,
    ) -> Result<(), Response<Full<Bytes>>> {
        let Some(push) = &self.push else {
            return Err(reply(
                StatusCode::UNAUTHORIZED,
                &json!({"error": "push requests are not accepted: PUSH_AUDIENCE and PUSH_SERVICE_ACCOUNT are not set"}),
            ));
        };
        let authorization = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let host = headers
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok());
        match push.verify_at(authorization, host, path, now).await {
            Ok(_) => Ok(()),
            Err(e) => {
                warn!(error = %e, "push request refused");
                Err(reply(e.status(), &json!({"error": e.to_string()})))
            }
        }
    }

    /// A batch, or why there is none, run through the pipeline.
    async fn run_batch(
        &self,
        batch: Result<Batch, InputError>,
        correlation_id: &str,
    ) -> Response<Full<Bytes>> {
        match batch {
            // Never right on a second delivery either: refused, it goes to
            // the dead-letter topic after the subscription's attempts.
            Err(e) => {
                warn!(error = %e, "event refused");
                reply(
                    StatusCode::BAD_REQUEST,
                    &json!({"error": e.to_string(), "correlation_id": correlation_id}),
                )
            }
            Ok(batch) => match self.app.run(batch, false, correlation_id).await {
                Ok(report) if report.incomplete() => {
                    reply(StatusCode::INTERNAL_SERVER_ERROR, &to_value(&report))
                }
                Ok(report) => reply(StatusCode::OK, &to_value(&report)),
                Err(e) => {
                    error!(kind = e.kind(), error = %e, "request failed");
                    let status = match e {
                        HandlerError::Input(_) => StatusCode::BAD_REQUEST,
                        _ => StatusCode::SERVICE_UNAVAILABLE,
                    };
                    reply(
                        status,
                        &json!({"error": e.to_string(), "correlation_id": correlation_id}),
                    )
                }
            },
        }
    }
}

/// The neutral webhook entry's answer as an HTTP response.
fn webhook_reply(answer: &webhook::Reply) -> Response<Full<Bytes>> {
    reply(
        StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &answer.body,
    )
}

fn json_body(bytes: &[u8]) -> Result<Value, InputError> {
    serde_json::from_slice(bytes).map_err(|e| InputError::NotJson(e.to_string()))
}

fn to_value(report: &crate::core::report::Report) -> Value {
    serde_json::to_value(report).unwrap_or(Value::Null)
}

fn reply(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

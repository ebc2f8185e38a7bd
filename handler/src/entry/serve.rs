//! The HTTP entry point for Cloud Run (`node-fencer serve`): Pub/Sub push
//! requests of Cloud Audit Log entries on `/pubsub`, Eventarc CloudEvents on
//! `/eventarc`, the scheduled sweep on `/sweep` (Cloud Scheduler, with the
//! same OIDC token), Alertmanager webhooks on `/alertmanager`, all into the
//! same pipeline as the Lambda function; routed by the table of sources
//! ([`trigger::SOURCES`]), and only the groups `SERVE_ROUTES` names, so the
//! public webhook can run as a service of its own. Every request is worked
//! to its end before it is answered: Cloud Run gives a service CPU only
//! while it answers. A request that leaves work undone gets a 5xx, so
//! Pub/Sub delivers it again and its dead-letter topic keeps what never
//! succeeds.
//!
//! Who is calling is settled from the headers before any of the body is
//! read, and a body is read no further than its route's bound: a caller
//! without a token costs its headers, whatever it sends after them.
//!
//! On-premises, `METRICS_PORT` adds Prometheus' `/metrics` on a port of its
//! own, and a sweep of its own (`SWEEP_INTERVAL_SECONDS`), which ends, as
//! every sweep does, with the witness round of every Node's machine.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::rc::Rc;

use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tracing::{Instrument, error, info, info_span, warn};

use crate::core::inbound::suspect::Batch;
use crate::core::inbound::trigger::{
    self, Auth, Body, InputError, RouteGroup, Trigger, direct, webhook,
};
use crate::core::outbound::prometheus::{self, SweepResult};
use crate::core::settings::config::{Config, LogFormat, ServeRoutes};
use crate::entry::app::{App, Call, HandlerError};
use crate::entry::telemetry;
use crate::shell::connect::{Clients, sdk_config};
use crate::shell::oidc::PushVerifier;

/// What every request needs: the application, the push token verifier
/// and the routes this service answers.
struct Server {
    app: App,
    push: Option<PushVerifier>,
    routes: ServeRoutes,
}

/// Serves on `port` until the process is stopped.
pub async fn serve(port: u16) -> Result<(), String> {
    // The Google clients' TLS has no crypto provider of its own: the one
    // stack of the project (rustls on ring) is the process default.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = Config::from_env().map_err(|e| format!("configuration: {e}"))?;
    telemetry::init(config.log_format.unwrap_or(LogFormat::Json), false);
    telemetry::abort_on_panic();
    for warning in config.warnings() {
        warn!("{warning}");
    }
    let routes = config.serve_routes.clone();
    let push = match &config.push_auth {
        None => {
            if routes.serves(RouteGroup::Events) {
                warn!(
                    "PUSH_AUDIENCE and PUSH_SERVICE_ACCOUNT are not set: /pubsub, /eventarc and /sweep refuse every request"
                );
            }
            None
        }
        Some(auth) => {
            let expected = auth.expected.clone();
            let verifier = match &auth.certs_url {
                None => PushVerifier::new(expected),
                Some(url) => PushVerifier::with_certs_url(expected, url),
            };
            Some(verifier.map_err(|e| format!("configuration: PUSH_CERTS_URL: {e}"))?)
        }
    };
    let reporter = std::env::var("K_SERVICE").unwrap_or_else(|_| "node-fencer".into());
    let sweep_interval = config.sweep_interval;
    let metrics_port = config.metrics_port;
    let clients = Clients::new(sdk_config().await, &config);
    clients.prewarm().await;
    let paths: Vec<&str> = trigger::SOURCES
        .iter()
        .filter_map(|s| s.route)
        .filter(|r| routes.serves(r.group))
        .map(|r| r.path)
        .collect();
    let mut app = App::new(clients, config, reporter)
        .with_log_metrics()
        .with_onprem()
        .map_err(|e| format!("configuration: {e}"))?;
    if metrics_port.is_some() {
        app = app.with_prometheus();
    }
    let server = Rc::new(Server { app, push, routes });
    let addr = SocketAddr::from(([0, 0, 0, 0], port));
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    info!(%addr, routes = ?paths, "serving");
    // The pipeline's futures hold the clients across awaits and are not
    // Send: connections run as local tasks on this one thread, which is
    // all a Cloud Run instance with its few requests at a time needs.
    let local = tokio::task::LocalSet::new();
    if let Some(port) = metrics_port {
        let addr = SocketAddr::from(([0, 0, 0, 0], port));
        let metrics = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("METRICS_PORT: cannot listen on {addr}: {e}"))?;
        info!(%addr, "serving Prometheus' /metrics");
        local.spawn_local(accept(metrics, server.clone(), Listener::Metrics));
    }
    if let Some(every) = sweep_interval {
        info!(
            every_seconds = every.as_secs(),
            "sweeping on a schedule of its own"
        );
        local.spawn_local(sweep_every(server.clone(), every));
    }
    local
        .run_until(accept(listener, server, Listener::Triggers))
        .await
}

/// What a listener answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Listener {
    /// The triggers' routes and `/healthz`.
    Triggers,
    /// `/metrics` alone, on a port of its own: Prometheus' scrape never
    /// shares the webhook's port, which may face the internet.
    Metrics,
}

/// Runs the sweep every `every`, the first right away: off-cluster, where
/// no scheduler calls `/sweep`, the sweep is what finds the NotReady nodes
/// no alert named and ends the fencings whose nodes came back. One sweep
/// at a time: a slow one (a BMC that does not answer) delays the next.
async fn sweep_every(server: Rc<Server>, every: std::time::Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let correlation_id = uuid::Uuid::new_v4().to_string();
        let span = info_span!("sweep", correlation_id = %correlation_id);
        let call = Call::new(&correlation_id);
        let result = match server.app.run(direct::sweep(), call).instrument(span).await {
            Ok(report) if report.incomplete() => {
                warn!(correlation_id, report = %to_value(&report), "the sweep left work undone; the next one retries");
                SweepResult::Incomplete
            }
            Ok(report) => {
                info!(correlation_id, report = %to_value(&report), "sweep done");
                SweepResult::Done
            }
            Err(e) => {
                error!(correlation_id, kind = e.kind(), error = %e, "the sweep failed; the next one retries");
                SweepResult::Failed
            }
        };
        if let Some(registry) = server.app.prometheus()
            && let Ok(mut registry) = registry.lock()
        {
            registry.record_sweep(result, crate::entry::witness::unix_now());
        }
    }
}

/// Takes connections until the process is stopped.
async fn accept(
    listener: TcpListener,
    server: Rc<Server>,
    answers: Listener,
) -> Result<(), String> {
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
                async move {
                    Ok::<_, Infallible>(match answers {
                        Listener::Triggers => server.answer(req).await,
                        Listener::Metrics => server.metrics(&req),
                    })
                }
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
    /// `GET /metrics`: the exposition of every run, sweep and witness
    /// round of this process.
    fn metrics<B>(&self, req: &Request<B>) -> Response<Full<Bytes>> {
        if req.uri().path() != "/metrics" {
            return reply(
                StatusCode::NOT_FOUND,
                &json!({"error": "only /metrics here"}),
            );
        }
        if req.method() != Method::GET {
            return reply(
                StatusCode::METHOD_NOT_ALLOWED,
                &json!({"error": "only GET is accepted"}),
            );
        }
        let text = self
            .app
            .prometheus()
            .and_then(|r| r.lock().ok().map(|r| r.render()))
            .unwrap_or_default();
        let mut response = Response::new(Full::new(Bytes::from(text)));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(prometheus::CONTENT_TYPE),
        );
        response
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        // The caller's clock (`REQUEST_TIMEOUT_SECONDS`) starts before the
        // body is read.
        let until = self
            .app
            .config()
            .request_timeout
            .map(|t| tokio::time::Instant::now() + t);
        let correlation_id = uuid::Uuid::new_v4().to_string();
        let span =
            info_span!("request", correlation_id = %correlation_id, path = %req.uri().path());
        let call = Call::new(&correlation_id).until(until);
        self.route(req, call).instrument(span).await
    }

    async fn route(&self, req: Request<Incoming>, call: Call<'_>) -> Response<Full<Bytes>> {
        let correlation_id = call.id;
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().to_owned();
        if parts.method == Method::GET && path == "/healthz" {
            return reply(StatusCode::OK, &json!({"status": "ok"}));
        }
        let routed = trigger::routed(&path).filter(|(_, r)| self.routes.serves(r.group));
        let Some((source, route)) = routed else {
            return reply(StatusCode::NOT_FOUND, &json!({"error": "no such route"}));
        };
        if parts.method != Method::POST {
            return reply(
                StatusCode::METHOD_NOT_ALLOWED,
                &json!({"error": "only POST is accepted"}),
            );
        }
        // Who is calling, from the headers alone: a refused caller's body
        // is never read.
        let admitted = match route.auth {
            Auth::GoogleOidc => self.authenticate(&parts.headers, &path).await,
            Auth::WebhookToken => self
                .app
                .admit_webhook(&parts.headers, correlation_id)
                .await
                .map_err(|refused| webhook_reply(&refused)),
        };
        if let Err(refused) = admitted {
            return refused;
        }
        let bytes = match route.body {
            Body::Ignored => Bytes::new(),
            Body::Json { max } => match bounded(&parts.headers, body, max).await {
                Ok(bytes) => bytes,
                Err(refused) => return refused,
            },
        };
        if route.auth == Auth::WebhookToken {
            return webhook_reply(&self.app.run_webhook(&bytes, call).await);
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
        self.run_batch(batch, call).await
    }

    /// Lets in a request bearing a Google-signed OIDC token for one of the
    /// configured audiences (`PUSH_AUDIENCE`, a URL without a path also
    /// with this request's path), never for the host the request names;
    /// anything else is answered here.
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
        match push.verify_at(authorization, path, now).await {
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
        call: Call<'_>,
    ) -> Response<Full<Bytes>> {
        let correlation_id = call.id;
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
            Ok(batch) => match self.app.run(batch, call).await {
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

/// The body, read no further than `max` bytes: one whose declared length
/// is over it is refused before any of it is read, one that turns out
/// longer as soon as it passes the bound (413 either way).
async fn bounded(
    headers: &HeaderMap,
    body: Incoming,
    max: usize,
) -> Result<Bytes, Response<Full<Bytes>>> {
    let too_large = || {
        reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            &json!({"error": format!("the body exceeds {max} bytes")}),
        )
    };
    if declared_over(headers, max) {
        return Err(too_large());
    }
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(too_large()),
        Err(e) => Err(reply(
            StatusCode::BAD_REQUEST,
            &json!({"error": format!("the body could not be read: {e}")}),
        )),
    }
}

/// Whether the `Content-Length` declared is over `max`.
fn declared_over(headers: &HeaderMap, max: usize) -> bool {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|len| usize::try_from(len).map_or(true, |len| len > max))
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

fn to_value(report: &crate::core::outbound::report::Report) -> Value {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declared_length_over_the_bound_is_known_from_the_headers() {
        let with = |len: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                http::header::CONTENT_LENGTH,
                http::HeaderValue::from_str(len).expect("a header value"),
            );
            h
        };
        assert!(declared_over(&with("1025"), 1024));
        assert!(declared_over(&with("18446744073709551615"), 1024));
        assert!(!declared_over(&with("1024"), 1024));
        assert!(!declared_over(&HeaderMap::new(), 1024));
        // Not a length hyper would take: left to the bounded read, which
        // stops at the bound.
        for odd in ["x", "99999999999999999999999"] {
            assert!(!declared_over(&with(odd), 1024), "{odd}");
        }
    }
}

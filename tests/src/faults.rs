//! A fault-injecting HTTP proxy for the tests: node-fencer talks to it as if
//! it were moto, the kube-apiserver or the fake Compute Engine; it forwards
//! to the real one, except
//! for the requests a rule picks, which get a fault instead: an error status
//! with the dependency's own error body, a delay past the client's timeout,
//! a connection dropped before or after the real server acted, or an outage
//! of every request for a while (what a client sees of a restarting server).
//!
//! The client side is plain HTTP (a kubeconfig may point at `http://`); the
//! upstream side reuses a `kube::Client` without credentials, so the
//! caller's own `Authorization` header and TLS to the apiserver both work.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use tokio::net::TcpListener;

use crate::http_stub::{Reply, read_body, serve};

/// Which requests a rule applies to: every given part must be a substring of
/// the request's (method exact, and the resource's path too).
#[derive(Clone, Debug, Default)]
pub struct Match {
    method: Option<Method>,
    path: Option<String>,
    resource: Option<String>,
    body: Vec<String>,
}

impl Match {
    /// Every request.
    pub fn any() -> Self {
        Self::default()
    }
    /// An EC2 Query API action, e.g. `DetachVolume`.
    pub fn ec2(action: &str) -> Self {
        Self::any().body(&format!("Action={action}&"))
    }
    /// A Compute Engine call on one resource, by its path below
    /// `/compute/v1/` (`projects/P/zones/Z/instances/N`, or with a custom
    /// verb: `.../instances/N/detachDisk`): that path exactly, the query
    /// aside, so not the resources beneath it.
    pub fn compute(method: Method, resource: &str) -> Self {
        Self {
            resource: Some(format!("/compute/v1/{resource}")),
            ..Self::any().method(method)
        }
    }
    /// Only this method.
    pub fn method(mut self, method: Method) -> Self {
        self.method = Some(method);
        self
    }
    /// Only paths (with query) containing this.
    pub fn path(mut self, part: &str) -> Self {
        self.path = Some(part.to_owned());
        self
    }
    /// Only bodies containing this (and every other part given).
    pub fn body(mut self, part: &str) -> Self {
        self.body.push(part.to_owned());
        self
    }

    fn hits(&self, method: &Method, path: &str, body: &str) -> bool {
        self.method.as_ref().is_none_or(|m| m == method)
            && self.path.as_deref().is_none_or(|p| path.contains(p))
            && self
                .resource
                .as_deref()
                .is_none_or(|r| path.split('?').next() == Some(r))
            && self.body.iter().all(|b| body.contains(b.as_str()))
    }
}

/// What a picked request gets instead of a plain forward.
#[derive(Clone, Debug)]
pub enum Fault {
    /// This status and body; the request never reaches the server.
    Respond {
        /// HTTP status.
        status: u16,
        /// `Content-Type` of the body.
        content_type: &'static str,
        /// The body.
        body: String,
    },
    /// Held this long, then forwarded (a client with a shorter timeout gives up first).
    Delay(Duration),
    /// The connection is closed without an answer; the server never sees the request.
    Drop,
    /// Forwarded, and the server acts on it, but the answer is lost with the connection.
    ForwardThenDrop,
    /// Forwarded, and the server acts on it, but its answer is held this
    /// long on its way back (a caller that gives up first never hears it).
    ForwardThenHold(Duration),
    /// From this request on, every request's connection is closed unanswered
    /// for this long, as while a server restarts.
    Outage(Duration),
}

impl Fault {
    /// An EC2 error answer, as EC2 shapes it (`Response/Errors/Error`).
    pub fn ec2_error(status: u16, code: &str, message: &str) -> Self {
        Self::Respond {
            status,
            content_type: "text/xml;charset=UTF-8",
            body: format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code>\
                 <Message>{message}</Message></Error></Errors><RequestID>fault-proxy</RequestID></Response>"
            ),
        }
    }
    /// EC2's throttling answer.
    pub fn ec2_throttled() -> Self {
        Self::ec2_error(503, "RequestLimitExceeded", "Request limit exceeded.")
    }
    /// A Compute Engine error answer in Google's JSON error shape (as the
    /// fake's `ApiError` writes it), without the optional `status` field:
    /// the client has only the HTTP status to go by.
    pub fn gce_error(status: u16, reason: &str, message: &str) -> Self {
        Self::Respond {
            status,
            content_type: "application/json; charset=UTF-8",
            body: serde_json::json!({"error": {
                "code": status, "message": message,
                "errors": [{"message": message, "domain": "global", "reason": reason}]
            }})
            .to_string(),
        }
    }
    /// Compute Engine's answer when a backend is unavailable.
    pub fn gce_unavailable() -> Self {
        Self::gce_error(503, "backendError", "Backend Error")
    }
    /// Compute Engine's answer when a rate limit is hit.
    pub fn gce_rate_limited() -> Self {
        Self::gce_error(
            429,
            "rateLimitExceeded",
            "Rate Limit Exceeded: Queries per minute of service 'compute.googleapis.com'.",
        )
    }
    /// A Kubernetes `Status` error answer.
    pub fn kube_status(code: u16, reason: &str) -> Self {
        Self::Respond {
            status: code,
            content_type: "application/json",
            body: serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": format!("injected: {reason}"),
                "reason": reason, "code": code
            })
            .to_string(),
        }
    }
}

/// One request the proxy saw.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Method.
    pub method: Method,
    /// Path with query.
    pub path: String,
    /// The EC2 action, when the body names one.
    pub action: Option<String>,
    /// The fault it got, if any.
    pub fault: Option<String>,
    /// When it arrived.
    pub at: Instant,
    /// The size of the answer's body passed back from upstream (0 until it
    /// is, and for a fault).
    pub bytes: usize,
}

struct Rule {
    when: Match,
    fault: Fault,
    left: usize,
}

#[derive(Default)]
struct State {
    rules: Vec<Rule>,
    seen: Vec<Seen>,
    down_until: Option<Instant>,
}

impl State {
    /// True during an outage.
    fn down(&self) -> bool {
        self.down_until.is_some_and(|t| Instant::now() < t)
    }
}

/// What the connections of one proxy share.
struct Shared {
    state: Mutex<State>,
    upstream: kube::Client,
}

/// A running proxy; it stops when dropped.
pub struct FaultProxy {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// A proxy to an HTTP server such as moto.
    pub async fn to_http(upstream: &str) -> anyhow::Result<Self> {
        let config = kube::Config::new(upstream.parse().context("upstream url")?);
        Self::start(config).await
    }

    /// A proxy to the apiserver of this kubeconfig (its server and CA; the
    /// credentials stay with the client).
    pub async fn to_apiserver(kubeconfig: &str) -> anyhow::Result<Self> {
        let kc = Kubeconfig::read_from(kubeconfig)?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        config.auth_info = AuthInfo::default();
        Self::start(config).await
    }

    async fn start(mut config: kube::Config) -> anyhow::Result<Self> {
        config.default_retry = false;
        let upstream = kube::Client::try_from(config)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            upstream,
        });
        // During an outage a new connection is closed unanswered, unread.
        let task = serve(listener, shared.clone(), |s| !lock(&s.state).down(), handle);
        Ok(Self { url, shared, task })
    }

    /// Gives the next `times` requests that match `when` this fault.
    pub fn inject(&self, when: Match, fault: Fault, times: usize) {
        lock(&self.shared.state).rules.push(Rule {
            when,
            fault,
            left: times,
        });
    }

    /// Denies the EC2 `action` to the role from now on, as EC2 answers its
    /// dry run when the permission is missing (`UnauthorizedOperation`,
    /// 403): what the witness's probes and preflight see.
    pub fn deny_ec2_dry_run(&self, action: &str) {
        self.inject(
            Match::ec2(action).body("DryRun=true"),
            Fault::ec2_error(
                403,
                "UnauthorizedOperation",
                "You are not authorized to perform this operation.",
            ),
            usize::MAX,
        );
    }

    /// Removes every rule that is left.
    pub fn heal(&self) {
        let mut state = lock(&self.shared.state);
        state.rules.clear();
        state.down_until = None;
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.shared.state).seen.clone()
    }

    /// How many requests for this EC2 action reached the proxy (faulted ones included).
    pub fn ec2_calls(&self, action: &str) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.action.as_deref() == Some(action))
            .count()
    }

    /// How many requests that `when` picks (by method and path: bodies are
    /// not kept) reached the proxy, faulted ones included.
    pub fn calls(&self, when: &Match) -> usize {
        self.seen()
            .iter()
            .filter(|s| when.body.is_empty() && when.hits(&s.method, &s.path, ""))
            .count()
    }

    /// How many requests got a fault.
    pub fn faults_served(&self) -> usize {
        self.seen().iter().filter(|s| s.fault.is_some()).count()
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// The action a request is for, as a fault name says it.
fn ec2_action(body: &str) -> Option<String> {
    body.split('&')
        .find_map(|kv| kv.strip_prefix("Action="))
        .map(str::to_owned)
}

async fn handle(req: Request<Incoming>, shared: Arc<Shared>) -> Result<Reply, std::io::Error> {
    let (parts, body) = req.into_parts();
    let body = read_body(body).await?;
    let text = String::from_utf8_lossy(&body);
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let fault = {
        let mut state = lock(&shared.state);
        let picked = if state.down() {
            Some(Fault::Drop)
        } else {
            state
                .rules
                .iter_mut()
                .find(|r| r.left > 0 && r.when.hits(&parts.method, &path, &text))
                .map(|r| {
                    r.left -= 1;
                    r.fault.clone()
                })
        };
        if let Some(Fault::Outage(d)) = &picked {
            state.down_until = Some(Instant::now() + *d);
        }
        state.seen.push(Seen {
            method: parts.method.clone(),
            path: path.clone(),
            action: ec2_action(&text),
            fault: picked.as_ref().map(|f| format!("{f:?}")),
            at: Instant::now(),
            bytes: 0,
        });
        (picked, state.seen.len() - 1)
    };
    let (fault, index) = fault;
    let counted = |reply: Result<Reply, std::io::Error>| {
        if let Ok(r) = &reply {
            let size = hyper::body::Body::size_hint(r.body()).exact().unwrap_or(0);
            if let Some(seen) = lock(&shared.state).seen.get_mut(index) {
                seen.bytes = usize::try_from(size).unwrap_or(usize::MAX);
            }
        }
        reply
    };
    let dropped = || std::io::Error::other("connection dropped by the fault proxy");
    match fault {
        Some(Fault::Respond {
            status,
            content_type,
            body,
        }) => Ok(Response::builder()
            .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body)))
            .unwrap_or_default()),
        Some(Fault::Drop | Fault::Outage(_)) => Err(dropped()),
        Some(Fault::ForwardThenDrop) => {
            let _ = forward(&shared.upstream, parts, path, body).await;
            Err(dropped())
        }
        Some(Fault::Delay(d)) => {
            tokio::time::sleep(d).await;
            counted(forward(&shared.upstream, parts, path, body).await)
        }
        Some(Fault::ForwardThenHold(d)) => {
            let answer = forward(&shared.upstream, parts, path, body).await;
            tokio::time::sleep(d).await;
            counted(answer)
        }
        None => counted(forward(&shared.upstream, parts, path, body).await),
    }
}

async fn forward(
    upstream: &kube::Client,
    parts: http::request::Parts,
    path: String,
    body: Bytes,
) -> Result<Reply, std::io::Error> {
    let mut req = Request::builder().method(parts.method).uri(path);
    for (name, value) in &parts.headers {
        // Hop-by-hop and length headers belong to each leg.
        if !matches!(
            name.as_str(),
            "host" | "connection" | "content-length" | "transfer-encoding" | "keep-alive"
        ) {
            req = req.header(name, value);
        }
    }
    let req = req
        .body(kube::client::Body::from(body.to_vec()))
        .map_err(std::io::Error::other)?;
    let res = upstream.send(req).await.map_err(std::io::Error::other)?;
    let (parts, body) = res.into_parts();
    let body = read_body(body).await?;
    let mut out = Response::builder().status(parts.status);
    for (name, value) in &parts.headers {
        if !matches!(
            name.as_str(),
            "connection" | "content-length" | "transfer-encoding" | "keep-alive"
        ) {
            out = out.header(name, value);
        }
    }
    out.body(Full::new(body)).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching_and_actions() {
        let m = Match::ec2("DetachVolume");
        assert!(m.hits(&Method::POST, "/", "Action=DetachVolume&Version=2016-11-15"));
        assert!(!m.hits(
            &Method::POST,
            "/",
            "Action=DescribeVolumes&Version=2016-11-15"
        ));
        let one = Match::ec2("DetachVolume").body("VolumeId=vol-1");
        assert!(one.hits(&Method::POST, "/", "Action=DetachVolume&VolumeId=vol-1"));
        assert!(!one.hits(&Method::POST, "/", "Action=DescribeVolumes&VolumeId=vol-1"));
        let k = Match::any().method(Method::PATCH).path("/api/v1/nodes/");
        assert!(k.hits(&Method::PATCH, "/api/v1/nodes/worker-1?", ""));
        assert!(!k.hits(&Method::GET, "/api/v1/nodes/worker-1", ""));
        assert_eq!(
            ec2_action("Action=DetachVolume&Force=true").as_deref(),
            Some("DetachVolume")
        );
        assert_eq!(ec2_action("Force=true"), None);
        let vm = "projects/p/zones/z/instances/vm-1";
        let get = Match::compute(Method::GET, vm);
        assert!(get.hits(&Method::GET, &format!("/compute/v1/{vm}?$alt=json"), ""));
        assert!(get.hits(&Method::GET, &format!("/compute/v1/{vm}"), ""));
        assert!(!get.hits(&Method::GET, &format!("/compute/v1/{vm}0?$alt=json"), ""));
        assert!(!get.hits(&Method::POST, &format!("/compute/v1/{vm}"), ""));
        let detach = format!("/compute/v1/{vm}/detachDisk?deviceName=d");
        assert!(!get.hits(&Method::GET, &detach, ""));
        let verb = Match::compute(Method::POST, &format!("{vm}/detachDisk"));
        assert!(verb.hits(&Method::POST, &detach, ""));
    }

    #[test]
    fn a_compute_engine_error_is_googles_json_error() {
        let Fault::Respond { status, body, .. } = Fault::gce_unavailable() else {
            panic!("an answer");
        };
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(status, 503);
        assert_eq!(v["error"]["code"], 503);
        assert_eq!(v["error"]["errors"][0]["reason"], "backendError");
        assert!(v["error"].get("status").is_none());
    }
}

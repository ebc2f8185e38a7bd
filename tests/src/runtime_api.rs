//! A minimal stand-in for the Lambda Runtime API (the four routes a function
//! uses), for measuring the real binary without the emulator in the way:
//! when it first polls for an event, and what each invocation answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc, oneshot};

use crate::http_stub::{Reply, read_body, serve};

const PREFIX: &str = "/2018-06-01/runtime";

/// What the function answered to one invocation.
#[derive(Debug)]
pub struct Answer {
    /// True when it posted to `/error`.
    pub error: bool,
    /// The body it posted.
    pub body: Value,
}

struct Shared {
    events: tokio::sync::Mutex<mpsc::Receiver<(String, Value)>>,
    waiting: Mutex<HashMap<String, oneshot::Sender<Answer>>>,
    first_poll: Mutex<Option<Instant>>,
    polled: Notify,
    init_error: Mutex<Option<String>>,
}

/// A running stand-in; it stops when dropped.
pub struct RuntimeApi {
    /// `127.0.0.1:PORT`, the value of `AWS_LAMBDA_RUNTIME_API`.
    pub address: String,
    shared: Arc<Shared>,
    queue: mpsc::Sender<(String, Value)>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RuntimeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RuntimeApi {
    /// Listens on a free local port.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?.to_string();
        let (queue, events) = mpsc::channel(1024);
        let shared = Arc::new(Shared {
            events: tokio::sync::Mutex::new(events),
            waiting: Mutex::new(HashMap::new()),
            first_poll: Mutex::new(None),
            polled: Notify::new(),
            init_error: Mutex::new(None),
        });
        let task = serve(listener, shared.clone(), |_| true, route);
        Ok(Self {
            address,
            shared,
            queue,
            task,
        })
    }

    /// When the function first asked for an event, waiting up to `timeout`.
    pub async fn first_poll(&self, timeout: Duration) -> anyhow::Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.shared.polled.notified();
            if let Some(at) = *lock(&self.shared.first_poll) {
                return Ok(at);
            }
            if let Some(e) = lock(&self.shared.init_error).clone() {
                bail!("the function reported an init error: {e}");
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("the function did not poll for an event within {timeout:?}");
            }
            let _ = tokio::time::timeout(left, notified).await;
        }
    }

    /// Hands the function one event and waits for its answer.
    pub async fn invoke(&self, event: Value, timeout: Duration) -> anyhow::Result<Answer> {
        let id = uuid_like();
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.waiting).insert(id.clone(), tx);
        self.queue
            .send((id, event))
            .await
            .context("the stand-in stopped")?;
        tokio::time::timeout(timeout, rx)
            .await
            .context("no answer from the function in time")?
            .context("the stand-in stopped")
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn uuid_like() -> String {
    format!("{:032x}", fastrand::u128(..))
}

fn reply(status: StatusCode, body: Bytes) -> Reply {
    let mut res = Response::new(Full::new(body));
    *res.status_mut() = status;
    res
}

async fn route(req: Request<Incoming>, shared: Arc<Shared>) -> Result<Reply, std::io::Error> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let body = read_body(req.into_body()).await?;
    let Some(rest) = path.strip_prefix(PREFIX) else {
        return Ok(reply(StatusCode::NOT_FOUND, Bytes::new()));
    };
    if method == Method::GET && rest == "/invocation/next" {
        lock(&shared.first_poll).get_or_insert_with(Instant::now);
        shared.polled.notify_waiters();
        let next = shared.events.lock().await.recv().await;
        let Some((id, event)) = next else {
            return Err(std::io::Error::other("no more events"));
        };
        let deadline = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            + Duration::from_secs(300);
        let res = Response::builder()
            .header("lambda-runtime-aws-request-id", &id)
            .header(
                "lambda-runtime-deadline-ms",
                deadline.as_millis().to_string(),
            )
            .header(
                "lambda-runtime-invoked-function-arn",
                "arn:aws:lambda:us-east-1:123456789012:function:node-fencer",
            )
            .header("lambda-runtime-trace-id", format!("Root=1-{id}"))
            .body(Full::new(Bytes::from(event.to_string())))
            .map_err(std::io::Error::other)?;
        return Ok(res);
    }
    if method == Method::POST && rest == "/init/error" {
        *lock(&shared.init_error) = Some(String::from_utf8_lossy(&body).into_owned());
        shared.polled.notify_waiters();
        return Ok(reply(StatusCode::ACCEPTED, Bytes::new()));
    }
    if method == Method::POST
        && let Some(tail) = rest.strip_prefix("/invocation/")
        && let Some((id, kind)) = tail.split_once('/')
        && (kind == "response" || kind == "error")
    {
        let answer = Answer {
            error: kind == "error",
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        };
        if let Some(tx) = lock(&shared.waiting).remove(id) {
            let _ = tx.send(answer);
        }
        return Ok(reply(StatusCode::ACCEPTED, Bytes::new()));
    }
    Ok(reply(StatusCode::NOT_FOUND, Bytes::new()))
}

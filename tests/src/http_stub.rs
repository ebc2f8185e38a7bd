//! The HTTP/1 server plumbing the test stand-ins share (the fault proxy and
//! the Lambda Runtime API stand-in): accept on a local port, one task per
//! connection, whole bodies in and out. A handler's error closes the
//! connection without an answer, which the fault proxy uses on purpose.

use std::future::Future;
use std::sync::Arc;

use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A whole answer.
pub type Reply = Response<Full<Bytes>>;

/// Serves `listener` until the returned task is aborted: each request goes to
/// `handle` with the shared `state`; a connection is closed at once, unread,
/// while `admit(&state)` is false.
pub fn serve<S, F, Fut>(
    listener: TcpListener,
    state: Arc<S>,
    admit: fn(&S) -> bool,
    handle: F,
) -> JoinHandle<()>
where
    S: Send + Sync + 'static,
    F: Fn(Request<Incoming>, Arc<S>) -> Fut + Copy + Send + Sync + 'static,
    Fut: Future<Output = Result<Reply, std::io::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            if !admit(&state) {
                continue;
            }
            let state = state.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(req, state.clone()));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

/// The whole body of a request or response.
pub async fn read_body<B>(body: B) -> Result<Bytes, std::io::Error>
where
    B: Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    Ok(body
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes())
}

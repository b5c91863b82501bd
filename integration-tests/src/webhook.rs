//! A local webhook receiver for the notification tests (and an OTLP/HTTP receiver for
//! the trace tests: it records any POST).

use super::*;

/// One request received by a [`WebhookReceiver`].
#[derive(Debug, Clone)]
pub struct ReceivedCall {
    pub at: std::time::SystemTime,
    /// The request line's method and target, e.g. `POST /hook`.
    pub request: String,
    pub headers: std::collections::HashMap<String, String>,
    pub body: Vec<u8>,
    /// The status answered.
    pub status: u16,
}

/// A local HTTP server playing a webhook receiver: it records every request and answers
/// with the status `respond` chooses (given the request body and how many calls came
/// before). Each answer closes the connection.
pub struct WebhookReceiver {
    pub url: String,
    calls: Arc<std::sync::Mutex<Vec<ReceivedCall>>>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for WebhookReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookReceiver").field("url", &self.url).finish()
    }
}

type Responder = dyn Fn(&[u8], usize) -> u16 + Send + Sync;

impl WebhookReceiver {
    /// Starts the receiver on a free loopback port.
    ///
    /// # Panics
    /// When no port can be bound.
    pub async fn start(respond: impl Fn(&[u8], usize) -> u16 + Send + Sync + 'static) -> Self {
        Self::serve(respond, None).await
    }

    /// [`WebhookReceiver::start`] over TLS with `tls` (its URL is `https://localhost:<port>/hook`):
    /// a connection whose handshake fails is recorded nowhere.
    ///
    /// # Panics
    /// When no port can be bound.
    pub async fn start_tls(
        respond: impl Fn(&[u8], usize) -> u16 + Send + Sync + 'static,
        tls: Arc<rustls::ServerConfig>,
    ) -> Self {
        Self::serve(respond, Some(tokio_rustls::TlsAcceptor::from(tls))).await
    }

    async fn serve(
        respond: impl Fn(&[u8], usize) -> u16 + Send + Sync + 'static,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the webhook receiver");
        let port = listener.local_addr().expect("local addr").port();
        let url = match tls {
            Some(_) => format!("https://localhost:{port}/hook"),
            None => format!("http://127.0.0.1:{port}/hook"),
        };
        let calls: Arc<std::sync::Mutex<Vec<ReceivedCall>>> = Arc::default();
        let respond: Arc<Responder> = Arc::new(respond);
        let recorded = Arc::clone(&calls);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (recorded, respond, tls) = (Arc::clone(&recorded), Arc::clone(&respond), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        None => answer(stream, &recorded, respond.as_ref()).await,
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                answer(stream, &recorded, respond.as_ref()).await;
                            }
                        }
                    }
                });
            }
        });
        Self { url, calls, task }
    }

    /// Every call so far, in arrival order.
    #[must_use]
    pub fn calls(&self) -> Vec<ReceivedCall> {
        self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request from `stream`, records it and answers it, closing the connection.
async fn answer<S>(stream: S, recorded: &std::sync::Mutex<Vec<ReceivedCall>>, respond: &Responder)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
        return;
    }
    let request = line.rsplit_once(' ').map_or(line.trim_end(), |(r, _)| r).to_owned();
    let mut headers = std::collections::HashMap::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some((k, v)) = trimmed.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0; len];
    if reader.read_exact(&mut body).await.is_err() {
        return;
    }
    let status = {
        let mut calls = recorded.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let status = respond(&body, calls.len());
        calls.push(ReceivedCall { at: std::time::SystemTime::now(), request, headers, body, status });
        status
    };
    let reply = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    let mut stream = reader.into_inner();
    let _ = stream.write_all(reply.as_bytes()).await;
    let _ = stream.shutdown().await;
}

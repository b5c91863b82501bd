//! The edge of both listeners: a request's body must arrive by a deadline (else 408 and the
//! connection closes), the admin listener answers only host names it is meant to (else
//! 421: a DNS-rebinding page cannot reach a console on loopback), and the client's address
//! is read through trusted proxies. The caps on connections are in `connections.rs`, the
//! backoff of failed authentication in `auth_guard.rs`.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::middleware::Next;
use actix_web::web::Bytes;
use actix_web::{web, HttpMessage, HttpRequest};
use futures_util::Stream;

use super::error::ApiError;
use super::AppState;

/// What the edge of a listener knows: its request deadline, its trusted proxies and, for
/// the admin listener, the host names it answers.
#[derive(Debug, Clone)]
pub struct Edge {
    pub request_timeout: Duration,
    pub trusted: Vec<ipnet::IpNet>,
    /// Host names answered besides IP literals and `localhost`; `None`: any (the intake).
    pub hosts: Option<Vec<String>>,
}

/// A body that fails with `TimedOut` once its deadline passes: the JSON extractor then
/// answers 408 ([`super::error::json_error`]).
struct DeadlineBody {
    inner: Payload,
    deadline: Pin<Box<actix_web::rt::time::Sleep>>,
    limit_ms: u64,
}

impl Stream for DeadlineBody {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            let limit = self.limit_ms;
            return Poll::Ready(Some(Err(PayloadError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                TimedOut(limit),
            )))));
        }
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

/// The deadline that passed, in ms: the error inside a body's `TimedOut`.
#[derive(Debug)]
struct TimedOut(u64);

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request body did not arrive within {} ms", self.0)
    }
}

impl std::error::Error for TimedOut {}

/// The deadline of a body that timed out, from its error.
#[must_use]
pub fn timeout_ms(e: &std::io::Error) -> u64 {
    e.get_ref().and_then(|inner| inner.downcast_ref::<TimedOut>()).map_or(0, |t| t.0)
}

/// Gives the request's body a deadline of `Edge::request_timeout` from now (its headers
/// had theirs: the server's `client_request_timeout`), and refuses, on the admin listener,
/// a host name it does not answer.
///
/// # Errors
/// Those of the wrapped service.
pub async fn guard_requests(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let Some(edge) = req.app_data::<web::Data<Edge>>().cloned() else { return next.call(req).await };
    if let Some(hosts) = &edge.hosts {
        // The request's own Host (or HTTP/2 authority), never a forwarding header a page
        // may set itself.
        let host = req
            .headers()
            .get(actix_web::http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
            .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()))
            .unwrap_or_default();
        if !host_allowed(&host, hosts) {
            return Err(ApiError::MisdirectedHost(host).into());
        }
    }
    let limit_ms = u64::try_from(edge.request_timeout.as_millis()).unwrap_or(u64::MAX);
    let body = DeadlineBody {
        inner: req.take_payload(),
        deadline: Box::pin(actix_web::rt::time::sleep(edge.request_timeout)),
        limit_ms,
    };
    req.set_payload(Payload::Stream { payload: Box::pin(body) });
    next.call(req).await
}

/// Whether the admin listener answers `host` (with or without its port): an IP literal,
/// `localhost`, or a name of `allowed`. A page that rebinds its own name to loopback sends
/// that name, so it is refused.
#[must_use]
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        // [::1]:9090
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => {
            host.rsplit_once(':').map_or(host, |(name, port)| if port.parse::<u16>().is_ok() { name } else { host })
        }
    };
    let name = name.trim_end_matches('.');
    name.parse::<IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.trim_end_matches('.').eq_ignore_ascii_case(name))
}

/// The client's address: the connection's peer, or, when that peer is a trusted proxy, the
/// last address of `X-Forwarded-For` that is not one (the one the outermost trusted proxy
/// saw). An entry that is no address ends the walk at the proxy: what is left of it was
/// written by the client. Addresses are canonical (an IPv4 peer of a dual-stack listener
/// is its IPv4 address).
#[must_use]
pub fn client_addr(req: &HttpRequest) -> Option<IpAddr> {
    let peer = req.peer_addr()?.ip().to_canonical();
    let trusted = req.app_data::<web::Data<Edge>>().map(|e| e.trusted.clone()).unwrap_or_default();
    Some(through_proxies(peer, &trusted, req.headers().get_all("x-forwarded-for").filter_map(|v| v.to_str().ok())))
}

/// [`client_addr`] of a request from `peer` with these `X-Forwarded-For` values.
fn through_proxies<'a>(peer: IpAddr, trusted: &[ipnet::IpNet], forwarded: impl Iterator<Item = &'a str>) -> IpAddr {
    let is_trusted = |a: &IpAddr| trusted.iter().any(|n| n.contains(a));
    if !is_trusted(&peer) {
        return peer;
    }
    let hops: Vec<&str> = forwarded.flat_map(|v| v.split(',')).map(str::trim).collect();
    let mut client = peer;
    for hop in hops.iter().rev() {
        let Ok(addr) = hop.parse::<IpAddr>().map(|a| a.to_canonical()) else { break };
        client = addr;
        if !is_trusted(&addr) {
            break;
        }
    }
    client
}

/// The key an address is counted under (caps, backoff): itself for IPv4, its /64 for
/// IPv6, which one holder gets whole.
#[must_use]
pub fn address_key(addr: IpAddr) -> IpAddr {
    match addr.to_canonical() {
        IpAddr::V6(v6) => {
            let mut octets = v6.octets();
            octets[8..].fill(0);
            IpAddr::V6(octets.into())
        }
        v4 => v4,
    }
}

/// The client's address for log lines and the audit: the address, or `unknown`.
#[must_use]
pub fn client_label(req: &HttpRequest) -> String {
    client_addr(req).map_or_else(|| "unknown".to_owned(), |a| a.to_string())
}

/// The daemon's state, from a request.
///
/// # Errors
/// `Internal` when the listener was built without it (a wiring defect).
pub fn state(req: &HttpRequest) -> Result<&web::Data<AppState>, ApiError> {
    req.app_data::<web::Data<AppState>>().ok_or_else(|| ApiError::Internal("listener state missing".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_is_the_last_hop_before_the_trusted_proxies() {
        let trusted: Vec<ipnet::IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let proxy: IpAddr = "10.1.1.1".parse().unwrap();
        let client = |xff: &[&str]| through_proxies(proxy, &trusted, xff.iter().copied()).to_string();
        assert_eq!(client(&["198.51.100.7"]), "198.51.100.7");
        assert_eq!(
            client(&["203.0.113.9, 198.51.100.7, 10.2.2.2"]),
            "198.51.100.7",
            "the client's own entries count not"
        );
        assert_eq!(client(&["203.0.113.9", "198.51.100.7:4711"]), "10.1.1.1", "a malformed hop ends at the proxy");
        assert_eq!(client(&[]), "10.1.1.1");
        let outsider: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(
            through_proxies(outsider, &trusted, ["198.51.100.7"].into_iter()),
            outsider,
            "only proxies are believed"
        );
        let mapped: IpAddr = "::ffff:10.1.1.1".parse().unwrap();
        assert_eq!(mapped.to_canonical(), proxy, "a dual-stack listener's IPv4 peer");
        let v6: IpAddr = "2001:db8:1:2:3:4:5:6".parse().unwrap();
        assert_eq!(address_key(v6).to_string(), "2001:db8:1:2::", "an IPv6 address counts as its /64");
    }

    #[test]
    fn the_admin_listener_answers_addresses_localhost_and_its_names_only() {
        let allowed = vec!["tally.internal".to_owned()];
        for host in [
            "127.0.0.1:9090",
            "127.0.0.1",
            "[::1]:9090",
            "10.1.2.3:8079",
            "localhost:9090",
            "LOCALHOST",
            "tally.internal:8079",
            "tally.internal.",
        ] {
            assert!(host_allowed(host, &allowed), "{host}");
        }
        for host in
            ["attacker.example:9090", "attacker.example", "localhost.attacker.example", "", "tally.internal.evil"]
        {
            assert!(!host_allowed(host, &allowed), "{host}");
        }
    }
}

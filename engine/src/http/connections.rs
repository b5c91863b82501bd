//! Caps on open connections: overall per listener (the server's `max_connections`, past
//! which new connections wait in the kernel's backlog) and per client address here: a
//! connection past `http.max_connections_per_address` is closed as soon as it is accepted
//! (`tally_http_connections_refused_total`), so one address holding many slow or idle
//! connections cannot take the listener's slots. Connections from a trusted proxy carry
//! many clients and are not capped per address.

use std::any::Any;
use std::collections::HashMap;
use std::net::{IpAddr, Shutdown};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use actix_tls::accept::rustls_0_23::TlsStream;
use actix_web::dev::Extensions;
use actix_web::rt::net::TcpStream;
use tally_actors::Metrics;
use tracing::warn;

/// The open connections of one listener, by client address.
#[derive(Debug)]
pub struct Connections {
    listener: &'static str,
    per_address: usize,
    trusted: Vec<ipnet::IpNet>,
    open: Mutex<HashMap<IpAddr, usize>>,
    metrics: Metrics,
    /// When a refusal was last logged (seconds since the epoch): a flood logs once a second.
    logged_at: AtomicU64,
}

/// Held in a connection's data while it is open; counts it off when dropped.
struct Held {
    connections: Arc<Connections>,
    addr: IpAddr,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.connections.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.addr) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.addr);
            }
        }
    }
}

impl Connections {
    #[must_use]
    pub fn new(listener: &'static str, per_address: usize, trusted: Vec<ipnet::IpNet>, metrics: &Metrics) -> Arc<Self> {
        metrics.http_connections_refused_total.with_label_values(&[listener]);
        let open = Mutex::new(HashMap::new());
        Arc::new(Self { listener, per_address, trusted, open, metrics: metrics.clone(), logged_at: AtomicU64::new(0) })
    }

    /// The server's `on_connect` hook: counts the connection against its address, or
    /// closes it at once when the address holds its cap already.
    pub fn admit(self: &Arc<Self>, connection: &dyn Any, data: &mut Extensions) {
        let Some(tcp) = tcp_of(connection) else { return };
        let Ok(peer) = tcp.peer_addr() else { return };
        let ip = peer.ip().to_canonical();
        if self.trusted.iter().any(|n| n.contains(&ip)) {
            return;
        }
        let addr = super::edge::address_key(ip);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(addr).or_default();
        if *n >= self.per_address {
            drop(open);
            self.metrics.http_connections_refused_total.with_label_values(&[self.listener]).inc();
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            if self.logged_at.swap(now, Ordering::Relaxed) != now {
                warn!(listener = self.listener, from = %addr, cap = self.per_address, "Closed a connection over the address's cap.");
            }
            // Read and write end: the server sees the connection end before any request.
            let _ = socket2::SockRef::from(tcp).shutdown(Shutdown::Both);
            return;
        }
        *n += 1;
        data.insert(Held { connections: Arc::clone(self), addr });
    }

    /// Open connections of `addr` now.
    #[must_use]
    pub fn open_of(&self, addr: IpAddr) -> usize {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).get(&addr).copied().unwrap_or(0)
    }
}

/// The TCP socket under a plain or TLS connection.
fn tcp_of(connection: &dyn Any) -> Option<&TcpStream> {
    connection
        .downcast_ref::<TcpStream>()
        .or_else(|| connection.downcast_ref::<TlsStream<TcpStream>>().map(|tls| tls.get_ref().0))
}

/// Raises the process's open-files limit to its hard limit, and warns when even that is
/// below what the listeners' connection caps need (plus a reserve for the database pools,
/// Kafka's sockets and files): a flood would then run the daemon out of descriptors
/// before the caps hold.
pub fn raise_open_files(config: &crate::config::HttpConfig) {
    const RESERVE: u64 = 1_024;
    let needed = (config.max_connections + config.admin_max_connections) as u64 + RESERVE;
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) if limit < needed => warn!(
            limit,
            needed,
            "The open-files limit is below the connection caps (http.max_connections, http.admin_max_connections) \
             plus a reserve: raise it (LimitNOFILE=) or lower the caps."
        ),
        Ok(_) => {}
        Err(e) => warn!(error = %e, "Cannot raise the open-files limit."),
    }
}

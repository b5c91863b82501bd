//! The service manager's readiness protocol (`sd_notify`, for systemd's `Type=notify`):
//! newline-separated `KEY=VALUE` assignments in one datagram to the unix socket named by
//! `NOTIFY_SOCKET` (a path, or an abstract name starting with `@`). Without the variable
//! (not started by a service manager) every call does nothing.
//!
//! The daemon sends `READY=1` once its `/readyz` answers 200, and `STOPPING=1` when it
//! begins to drain.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// The variable naming the service manager's socket.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Sends `state` (e.g. `"READY=1"`) to the service manager. `Ok(false)` when none listens
/// (`NOTIFY_SOCKET` unset or empty).
///
/// # Errors
/// When the socket cannot be created or the datagram cannot be sent.
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(target) = std::env::var_os(NOTIFY_SOCKET).filter(|t| !t.is_empty()) else {
        return Ok(false);
    };
    let socket = UnixDatagram::unbound()?;
    let bytes = target.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(state.as_bytes(), &addr)?;
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = name;
            return Err(io::Error::new(io::ErrorKind::Unsupported, "abstract NOTIFY_SOCKET outside Linux"));
        }
    } else {
        socket.send_to(state.as_bytes(), std::path::Path::new(&target))?;
    }
    Ok(true)
}

/// Sends `state`, logging a failure (the daemon runs on regardless).
pub fn notify_or_warn(state: &str) {
    match notify(state) {
        Ok(true) => tracing::debug!(state, "Told the service manager."),
        Ok(false) => {}
        Err(e) => tracing::warn!(state, error = %e, "Cannot notify the service manager."),
    }
}

/// Waits until `GET /readyz` of the admin listener at `admin` answers 200, then sends
/// `READY=1`. Does nothing without a service manager. The status line says what the
/// daemon waits for meanwhile (`STATUS=`, shown by `systemctl status`). `https`: the admin
/// listener serves HTTPS (`http.admin_tls`); its certificate is not checked, as this asks
/// the daemon's own socket over loopback, which its certificate does not name.
pub async fn ready_when_ready(admin: SocketAddr, https: bool) {
    if std::env::var_os(NOTIFY_SOCKET).is_none_or(|t| t.is_empty()) {
        return;
    }
    let host = if admin.ip().is_unspecified() { IpAddr::V4(Ipv4Addr::LOCALHOST) } else { admin.ip() };
    let scheme = if https { "https" } else { "http" };
    let url = format!("{scheme}://{}/readyz", SocketAddr::new(host, admin.port()));
    let client =
        match reqwest::Client::builder().timeout(Duration::from_secs(5)).danger_accept_invalid_certs(https).build() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "Cannot build the readiness client; telling the service manager now.");
                notify_or_warn("READY=1");
                return;
            }
        };
    let mut last = String::new();
    loop {
        let seen = match client.get(&url).send().await {
            Ok(r) if r.status().is_success() => break,
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => e.to_string(),
        };
        if seen != last {
            notify_or_warn(&format!("STATUS=Not ready: {}", seen.replace('\n', " ")));
            last = seen;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    notify_or_warn("READY=1\nSTATUS=Ready.");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_service_manager_nothing_is_sent() {
        // The test process has no NOTIFY_SOCKET (cargo does not set it).
        if std::env::var_os(NOTIFY_SOCKET).is_none() {
            assert!(!notify("READY=1").unwrap());
        }
    }
}
